//! The continuous-batching scheduler: the same answers alone and among concurrent requests, with the
//! prefix cache cold and hot; cancellation frees the sequence; limits are refused up front;
//! constrained requests decoded side by side produce valid JSON or end with `length`.

use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use hearth_constrain::{Constrainer, Spec};
use hearth_engine::{
    Backend, Event, FinishReason, ModelInfo, Request, SamplerConfig, Scheduler, SchedulerConfig,
    SubmitError, TokenLogprob, Usage,
};
use hearth_model::{KvType, Model, KV_BLOCK};
use hearth_tokenizer::Tokenizer;

fn start(parallel: usize, queue: usize) -> Arc<Scheduler> {
    start_with(SchedulerConfig {
        parallel,
        n_ctx: 256,
        queue,
        kv_type: KvType::F16,
        threads: 2,
        n_batch: 64,
        ..SchedulerConfig::default()
    })
}

fn start_with(cfg: SchedulerConfig) -> Arc<Scheduler> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/tiny-qwen3moe.q4_k_m.gguf");
    let model = Model::open(&path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf().metadata()).unwrap());
    let info = ModelInfo {
        alias: "tiny".into(),
        arch: "qwen3moe".into(),
        n_ctx: cfg.n_ctx,
        n_ctx_train: model.config.n_ctx_train,
        parallel: cfg.parallel,
        n_vocab: model.config.n_vocab,
        n_params: 0,
        file_size: 0,
        chat_template: None,
        quantization: None,
    };
    Scheduler::start(Arc::new(model), tok, info, cfg)
}

fn request(prompt: &str, tok: &Tokenizer, max: usize, temperature: f32, seed: u64) -> Request {
    Request {
        prompt: tok.encode(prompt, false),
        max_tokens: Some(max),
        n_ctx: None,
        sampler: SamplerConfig {
            temperature,
            seed,
            ..SamplerConfig::default()
        },
        stop: vec![],
        logprobs: None,
        constraint: None,
    }
}

/// Submits and returns a receiver of the request's events.
fn submit(s: &Scheduler, r: Request) -> mpsc::Receiver<Event> {
    let (tx, rx) = mpsc::channel();
    s.submit(r, Box::new(move |e| tx.send(e).is_ok())).unwrap();
    rx
}

fn collect(rx: mpsc::Receiver<Event>) -> (Vec<u32>, String, Event) {
    let (mut ids, mut text) = (vec![], String::new());
    loop {
        match rx
            .recv_timeout(Duration::from_secs(60))
            .expect("events keep coming")
        {
            Event::Token { id, text: t, .. } => {
                ids.push(id);
                text.push_str(&t);
            }
            done @ Event::Done { .. } => {
                if let Event::Done { text: t, .. } = &done {
                    text.push_str(t);
                }
                return (ids, text, done);
            }
            Event::Error(e) => panic!("error: {e}"),
        }
    }
}

const PROMPTS: [&str; 6] = [
    "Beautiful is better than ugly.",
    "Explicit is better than implicit. Simple is better than complex.",
    "Flat is better than nested.",
    "Sparse is better than dense. Readability counts.",
    "Special cases aren't special enough to break the rules.",
    "Errors should never pass silently.",
];

#[test]
fn concurrent_requests_answer_as_alone() {
    let s = start(4, 64);
    let tok = s.tokenizer().clone();
    let alone: Vec<_> = PROMPTS
        .iter()
        .map(|p| collect(submit(&s, request(p, &tok, 24, 0.0, 1))).0)
        .collect();
    // Sampled requests too: the same seed gives the same tokens alone and under load.
    let sampled_alone = collect(submit(&s, request(PROMPTS[0], &tok, 24, 0.9, 42))).0;
    let rxs: Vec<_> = PROMPTS
        .iter()
        .map(|p| submit(&s, request(p, &tok, 24, 0.0, 1)))
        .collect();
    let sampled = submit(&s, request(PROMPTS[0], &tok, 24, 0.9, 42));
    for (rx, want) in rxs.into_iter().zip(&alone) {
        let (ids, _, done) = collect(rx);
        assert_eq!(&ids, want);
        assert!(
            matches!(
                done,
                Event::Done {
                    finish: FinishReason::Length,
                    usage: Usage { n_gen: 24, .. },
                    ..
                }
            ),
            "{done:?}"
        );
    }
    assert_eq!(collect(sampled).0, sampled_alone);
    assert_eq!(s.in_flight(), 0);
    let st = s.stats();
    assert_eq!(st.active, 0);
    assert!(st.generated_tokens >= 24 * 14);
    assert!(st.expert_load.iter().sum::<u64>() > 0);
}

#[test]
fn prefix_cache_hot_and_cold_agree() {
    let s = start(2, 8);
    let tok = s.tokenizer().clone();
    let long = PROMPTS.join(" ");
    let (cold, _, d1) = collect(submit(&s, request(&long, &tok, 16, 0.0, 1)));
    let (hot, _, d2) = collect(submit(&s, request(&long, &tok, 16, 0.0, 1)));
    assert_eq!(cold, hot);
    let (
        Event::Done {
            usage: Usage { n_cached: c1, .. },
            ..
        },
        Event::Done {
            usage:
                Usage {
                    n_cached: c2,
                    n_prompt,
                    ..
                },
            ..
        },
    ) = (d1, d2)
    else {
        unreachable!()
    };
    assert_eq!(c1, 0);
    assert_eq!(
        c2,
        n_prompt - 1,
        "all but the last prompt token come from the cache"
    );
    // A continuation of the same conversation reuses the shared prefix.
    let longer = format!("{long} And more.");
    let (_, _, d3) = collect(submit(&s, request(&longer, &tok, 4, 0.0, 1)));
    let Event::Done {
        usage: Usage { n_cached, .. },
        ..
    } = d3
    else {
        unreachable!()
    };
    assert!(n_cached >= c2 - 1, "{n_cached}");
    // The prefix-cache counters of /metrics: three lookups; the hits are the cached tokens.
    let st = s.stats();
    assert_eq!(st.prefix_queries, 3);
    assert_eq!(st.cached_tokens as usize, c2 + n_cached);
    assert!(st.prefix_query_tokens as usize >= 2 * (n_prompt - 1) + n_cached);
}

#[test]
fn a_gone_client_frees_its_sequence() {
    let s = start(1, 8);
    let tok = s.tokenizer().clone();
    let (tx, rx) = mpsc::channel::<Event>();
    let mut left = 3;
    s.submit(
        request(PROMPTS[0], &tok, 200, 0.0, 1),
        Box::new(move |e| {
            left -= 1;
            tx.send(e).is_ok() && left > 0
        }),
    )
    .unwrap();
    drop(rx);
    for _ in 0..100 {
        if s.in_flight() == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.in_flight(), 0);
    // The slot serves the next request.
    let (ids, _, _) = collect(submit(&s, request(PROMPTS[1], &tok, 4, 0.0, 1)));
    assert_eq!(ids.len(), 4);
}

#[test]
fn limits_are_refused_up_front() {
    let s = start(1, 1);
    let tok = s.tokenizer().clone();
    let huge = Request {
        prompt: vec![1; 300],
        ..request("x", &tok, 1, 0.0, 1)
    };
    assert_eq!(
        s.submit(huge, Box::new(|_| true)).unwrap_err(),
        SubmitError::PromptTooLong {
            prompt: 300,
            n_ctx: 256
        }
    );
    let bad = Request {
        prompt: vec![1, 99_999],
        ..request("x", &tok, 1, 0.0, 1)
    };
    assert!(matches!(
        s.submit(bad, Box::new(|_| true)),
        Err(SubmitError::Invalid(_))
    ));
    let empty = Request {
        prompt: vec![],
        ..request("x", &tok, 1, 0.0, 1)
    };
    assert!(matches!(
        s.submit(empty, Box::new(|_| true)),
        Err(SubmitError::Invalid(_))
    ));
    // Generation that reaches the context end stops with `length`.
    let near = Request {
        prompt: vec![65; 250],
        max_tokens: None,
        ..request("x", &tok, 1, 0.0, 1)
    };
    let (ids, _, done) = collect(submit(&s, near));
    assert!(
        matches!(
            done,
            Event::Done {
                finish: FinishReason::Length,
                ..
            }
        ),
        "{done:?}"
    );
    assert!(ids.len() <= 6);
    s.shutdown();
    assert_eq!(
        s.submit(request("x", &tok, 1, 0.0, 1), Box::new(|_| true))
            .unwrap_err(),
        SubmitError::ShuttingDown
    );
    s.join();
}

#[test]
fn constrained_requests_decode_valid_json_side_by_side() {
    let s = start(4, 64);
    let tok = s.tokenizer().clone();
    let constrainer = Constrainer::new(tok.clone(), s.info().n_vocab).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "word": {"type": "string", "maxLength": 6},
            "n": {"type": "integer", "minimum": -5, "maximum": 500},
            "ok": {"type": "boolean"},
            "list": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
        },
        "required": ["word", "n", "list"]
    });
    let grammar = constrainer.compile(&Spec::JsonSchema(schema)).unwrap();
    let constrained = |seed: u64, max: usize| Request {
        constraint: Some(grammar.clone()),
        ..request(PROMPTS[(seed % 6) as usize], &tok, max, 0.8, seed)
    };
    // Eight sampled requests through four slots, beside an unconstrained one.
    let rxs: Vec<_> = (0..8)
        .map(|seed| submit(&s, constrained(seed, 120)))
        .collect();
    let free = submit(&s, request(PROMPTS[0], &tok, 24, 0.0, 1));
    let mut n_stop = 0;
    for rx in rxs {
        let (ids, text, done) = collect(rx);
        let Event::Done { finish, .. } = done else {
            unreachable!()
        };
        assert!(
            ids.iter().all(|&t| !tok.is_eog(t)),
            "no end token is emitted as text"
        );
        if finish == FinishReason::Stop {
            n_stop += 1;
            let v: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(
                v["word"].as_str().is_some_and(|w| w.chars().count() <= 6),
                "{text}"
            );
            assert!(
                v["n"].as_i64().is_some_and(|n| (-5..=500).contains(&n)),
                "{text}"
            );
            let list = v["list"].as_array().unwrap();
            assert!(
                list.len() <= 3 && list.iter().all(|x| x == "a" || x == "b"),
                "{text}"
            );
            assert!(v
                .as_object()
                .unwrap()
                .keys()
                .all(|k| ["word", "n", "ok", "list"].contains(&k.as_str())));
        } else {
            assert_eq!(finish, FinishReason::Length, "{text}");
        }
    }
    assert!(
        n_stop >= 6,
        "bounded schemas finish well within 120 tokens: {n_stop}/8 did"
    );
    assert!(
        matches!(
            collect(free).2,
            Event::Done {
                usage: Usage { n_gen: 24, .. },
                ..
            }
        ),
        "the free request is unaffected"
    );
    // Cut short by the budget: `length`, and the text is not passed off as complete JSON.
    let (_, text, done) = collect(submit(&s, constrained(3, 4)));
    assert!(
        matches!(
            done,
            Event::Done {
                finish: FinishReason::Length,
                usage: Usage { n_gen: 4, .. },
                ..
            }
        ),
        "{text}"
    );
    assert!(
        serde_json::from_str::<serde_json::Value>(&text).is_err(),
        "{text}"
    );
}

/// Greedy tokens with their log-probabilities (a function of the logits), and the usage.
fn traced(s: &Scheduler, prompt: &[u32], max: usize) -> (Vec<(u32, TokenLogprob)>, Usage) {
    let r = Request {
        prompt: prompt.to_vec(),
        max_tokens: Some(max),
        n_ctx: None,
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        stop: vec![],
        logprobs: Some(5),
        constraint: None,
    };
    let rx = submit(s, r);
    let mut out = vec![];
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("events") {
            Event::Token { id, logprob, .. } => out.push((id, logprob.expect("asked for"))),
            Event::Done { usage, .. } => return (out, usage),
            Event::Error(e) => panic!("error: {e}"),
        }
    }
}

/// A prompt of `n` tokens: the Zen of Python, over and over.
fn long_prompt(tok: &Tokenizer, n: usize, salt: &str) -> Vec<u32> {
    let mut text = String::from(salt);
    let mut ids = vec![];
    while ids.len() < n {
        text.push_str(&PROMPTS.join(" "));
        ids = tok.encode(&text, false);
    }
    ids.truncate(n);
    ids
}

fn pool_config(parallel: usize, pool_tokens: usize) -> SchedulerConfig {
    SchedulerConfig {
        parallel,
        n_ctx: 1024,
        queue: 64,
        kv_type: KvType::F16,
        threads: 2,
        n_batch: 128,
        pool_tokens,
        ..SchedulerConfig::default()
    }
}

#[test]
fn a_prefix_gives_the_same_logits_from_compute_from_shared_blocks_and_from_the_cache() {
    prefix_from_anywhere(KvType::F16);
}

/// The same with a q8_0 cache: quantized blocks are shared, copied and reused as they are.
#[test]
fn a_quantized_prefix_gives_the_same_logits_from_compute_from_shared_blocks_and_from_the_cache() {
    prefix_from_anywhere(KvType::Q8_0);
}

fn prefix_from_anywhere(kv_type: KvType) {
    let cfg = || SchedulerConfig {
        kv_type,
        ..pool_config(2, 0)
    };
    let s = start_with(cfg());
    let tok = s.tokenizer().clone();
    let p = long_prompt(&tok, 5 * KV_BLOCK + 20, "");
    // Computed from nothing.
    let (cold, u) = traced(&s, &p, 12);
    assert_eq!(u.n_cached, 0);
    // From the RAM prefix cache: all but the last token, through the copied partial block.
    let (hot, u) = traced(&s, &p, 12);
    assert_eq!(u.n_cached, p.len() - 1);
    assert_eq!(hot, cold);
    // From another running sequence's blocks: a fresh scheduler runs a request with the same first
    // four blocks and another ending; once it is decoding, the prompt comes in and shares them.
    let s = start_with(cfg());
    let mut other = p[..4 * KV_BLOCK].to_vec();
    other.extend(long_prompt(&tok, 40, "Zebra. "));
    let r = Request {
        prompt: other,
        max_tokens: Some(200),
        n_ctx: None,
        sampler: SamplerConfig::default(),
        stop: vec![],
        logprobs: None,
        constraint: None,
    };
    let rx = submit(&s, r);
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(60)),
        Ok(Event::Token { .. })
    ));
    let (shared, u) = traced(&s, &p, 12);
    assert_eq!(
        u.n_cached,
        4 * KV_BLOCK,
        "the running sequence's full blocks"
    );
    assert_eq!(shared, cold);
    drop(rx);
}

#[test]
fn a_small_pool_under_pressure_evicts_waits_and_answers_as_alone() {
    // Sequences of up to 5 blocks (3 to 4 of prompt, 40 generated) in a pool of 8: the second of
    // two waits for blocks, the prefix cache is evicted to make room, and every answer is the one
    // given alone.
    let s = start_with(SchedulerConfig {
        n_ctx: 6 * KV_BLOCK,
        ..pool_config(2, 8 * KV_BLOCK)
    });
    let tok = s.tokenizer().clone();
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| long_prompt(&tok, 3 * KV_BLOCK + 10 * i, &format!("{i}. ")))
        .collect();
    let alone: Vec<_> = prompts.iter().map(|p| traced(&s, p, 40).0).collect();
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let r = Request {
                prompt: p.clone(),
                max_tokens: Some(40),
                n_ctx: None,
                sampler: SamplerConfig {
                    temperature: 0.0,
                    ..SamplerConfig::default()
                },
                stop: vec![],
                logprobs: Some(5),
                constraint: None,
            };
            submit(&s, r)
        })
        .collect();
    for (rx, want) in rxs.into_iter().zip(&alone) {
        let mut got = vec![];
        loop {
            match rx.recv_timeout(Duration::from_secs(120)).expect("events") {
                Event::Token { id, logprob, .. } => got.push((id, logprob.unwrap())),
                Event::Done { .. } => break,
                Event::Error(e) => panic!("error: {e}"),
            }
        }
        assert_eq!(&got, want);
    }
    // Every block is back: none held, some kept as cache.
    let st = s.stats();
    assert_eq!((st.active, st.kv_held_blocks), (0, 0));
    assert!(st.kv_cached_blocks > 0 && st.kv_cached_blocks <= 8);
    // The pool always holds one whole context: a pool asked smaller still serves a long prompt.
    let small = start_with(pool_config(1, 4 * KV_BLOCK));
    let p = long_prompt(&tok, 900, "");
    let (ids, _, done) = collect(submit(&small, request_ids(p, 4)));
    assert_eq!(ids.len(), 4, "{done:?}");
}

fn request_ids(prompt: Vec<u32>, max: usize) -> Request {
    Request {
        prompt,
        max_tokens: Some(max),
        n_ctx: None,
        sampler: SamplerConfig::default(),
        stop: vec![],
        logprobs: None,
        constraint: None,
    }
}

fn disk_config(dir: &Path, kv_type: KvType) -> SchedulerConfig {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/tiny-qwen3moe.q4_k_m.gguf");
    SchedulerConfig {
        disk: Some(hearth_engine::disk_cache::DiskCacheConfig {
            dir: dir.to_path_buf(),
            limit: 1 << 30,
        }),
        model_identity: hearth_engine::disk_cache::model_identity(&model).unwrap(),
        kv_type,
        ..pool_config(2, 0)
    }
}

#[test]
fn the_prefix_cache_survives_a_restart_on_disk_and_a_corrupt_disk_cache_is_survived() {
    restart_from_disk(KvType::F16);
}

/// The same with a q8_0 cache, whose blocks are written and read back as their bytes.
#[test]
fn a_quantized_prefix_cache_survives_a_restart_on_disk() {
    restart_from_disk(KvType::Q8_0);
}

fn restart_from_disk(kv_type: KvType) {
    let dir = tempfile::tempdir().unwrap();
    let tok = {
        let s = start_with(pool_config(1, 0));
        s.tokenizer().clone()
    };
    let p = long_prompt(&tok, 4 * KV_BLOCK + 30, "");
    let s = start_with(disk_config(dir.path(), kv_type));
    let (cold, u) = traced(&s, &p, 12);
    assert_eq!(u.n_cached, 0);
    s.shutdown();
    s.join();
    // A new process: the full blocks come back from disk, with the same logits.
    let s = start_with(disk_config(dir.path(), kv_type));
    let (warm, u) = traced(&s, &p, 12);
    assert_eq!(u.n_cached, 4 * KV_BLOCK, "every full block of the prompt");
    assert_eq!(warm, cold);
    assert_eq!(s.stats().disk_cached_tokens, 4 * KV_BLOCK as u64);
    s.shutdown();
    s.join();
    // Every cache file damaged (cut short, or a byte flipped): skipped, recomputed, same answer.
    let mut files = vec![];
    for ns in std::fs::read_dir(dir.path()).unwrap() {
        for f in std::fs::read_dir(ns.unwrap().path()).unwrap() {
            files.push(f.unwrap().path());
        }
    }
    assert!(files.len() >= 4, "{files:?}");
    for (i, f) in files.iter().enumerate() {
        let mut bytes = std::fs::read(f).unwrap();
        if i % 2 == 0 {
            bytes.truncate(bytes.len() / 3);
        } else {
            let k = bytes.len() / 2;
            bytes[k] ^= 0x40;
        }
        std::fs::write(f, bytes).unwrap();
    }
    std::fs::write(dir.path().join("stray-file"), b"not a cache").unwrap();
    let s = start_with(disk_config(dir.path(), kv_type));
    let (again, u) = traced(&s, &p, 12);
    assert_eq!(u.n_cached, 0);
    assert_eq!(again, cold);
}
