//! Faults inside the engine, injected with failpoints (the `fail` crate): a panicking thread-pool
//! task, a panicking engine step, a KV allocation that fails or panics during admission. Each
//! fails the requests it hits with an error event, the next request is served, nothing stays
//! counted in flight, no KV block is lost, and the engine stays healthy. An engine thread that
//! dies is reported by `health`, and requests racing its death are refused or failed, never left
//! waiting.
//!
//! The failpoint registry is global, so every scenario runs inside one `FailScenario` (which also
//! serialises them).

use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use hearth_engine::{
    Backend, Event, FinishReason, ModelInfo, Request, SamplerConfig, Scheduler, SchedulerConfig,
    SubmitError,
};
use hearth_model::{KvType, Model};
use hearth_tokenizer::Tokenizer;

fn start() -> Arc<Scheduler> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/tiny-qwen3moe.q4_k_m.gguf");
    let model = Model::open(&path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf().metadata()).unwrap());
    let info = ModelInfo {
        alias: "tiny".into(),
        arch: "qwen3moe".into(),
        n_ctx: 256,
        n_ctx_train: model.config.n_ctx_train,
        parallel: 2,
        n_vocab: model.config.n_vocab,
        n_params: 0,
        file_size: 0,
        chat_template: None,
        quantization: None,
    };
    let cfg = SchedulerConfig {
        parallel: 2,
        n_ctx: 256,
        queue: 8,
        kv_type: KvType::F16,
        threads: 2,
        n_batch: 64,
        ..SchedulerConfig::default()
    };
    Scheduler::start(Arc::new(model), tok, info, cfg)
}

fn request(tok: &Tokenizer, text: &str) -> Request {
    Request {
        prompt: tok.encode(text, false),
        max_tokens: Some(8),
        n_ctx: None,
        sampler: SamplerConfig::greedy(),
        stop: vec![],
        logprobs: None,
        constraint: None,
    }
}

/// The request's last event (`Done` or `Error`), and the tokens before it.
fn run(s: &Scheduler, r: Request) -> (Vec<u32>, Event) {
    let (tx, rx) = mpsc::channel();
    s.submit(r, Box::new(move |e| tx.send(e).is_ok())).unwrap();
    let mut ids = Vec::new();
    loop {
        match rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the request ends, it does not hang")
        {
            Event::Token { id, .. } => ids.push(id),
            end => return (ids, end),
        }
    }
}

fn assert_clean(s: &Scheduler) {
    // The in-flight count drops before the last event is sent.
    assert_eq!(s.in_flight(), 0, "no sequence is left counted");
    // The stats are published when the engine has finished the step (after a fault, after its
    // recount), which may be just after the request's last event reached us.
    let t0 = std::time::Instant::now();
    let mut st = s.stats();
    while (st.active != 0 || st.kv_held_blocks != 0) && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
        st = s.stats();
    }
    assert_eq!(st.active, 0);
    assert_eq!(st.kv_held_blocks, 0, "no KV block is left held");
    assert!(s.health().is_ok(), "the engine stays healthy");
}

#[test]
fn injected_faults_fail_one_request_and_the_next_is_served() {
    let scenario = fail::FailScenario::setup();
    let s = start();
    let tok = s.tokenizer().clone();
    let (want, done) = run(&s, request(&tok, "Beautiful is better than ugly."));
    assert!(matches!(done, Event::Done { .. }), "{done:?}");
    for (point, action) in [
        ("pool::task", "1*panic(injected task panic)"),
        ("engine::step", "1*panic(injected step panic)"),
        ("kv::alloc", "1*return"),
        // A panic while the request is being admitted (its blocks half taken).
        ("kv::alloc", "1*panic(injected admission panic)"),
    ] {
        fail::cfg(point, action).unwrap();
        let (_, end) = run(&s, request(&tok, "Beautiful is better than ugly."));
        let Event::Error(msg) = &end else {
            panic!("{point}: the request should fail, got {end:?}");
        };
        assert!(!msg.is_empty(), "{point}");
        fail::remove(point);
        assert_clean(&s);
        // The same request again: served, with the same tokens as before the fault (the failed
        // step's cache was discarded, not reused).
        let (ids, done) = run(&s, request(&tok, "Beautiful is better than ugly."));
        assert!(
            matches!(
                done,
                Event::Done {
                    finish: FinishReason::Length,
                    ..
                }
            ),
            "{point}: {done:?}"
        );
        assert_eq!(ids, want, "{point}");
        assert_clean(&s);
    }
    // Two requests sharing the step that panics both fail; the engine goes on.
    fail::cfg("engine::step", "1*panic(shared step)").unwrap();
    let (tx, rx) = mpsc::channel();
    for text in [
        "Flat is better than nested.",
        "Sparse is better than dense.",
    ] {
        let tx = tx.clone();
        s.submit(request(&tok, text), Box::new(move |e| tx.send(e).is_ok()))
            .unwrap();
    }
    drop(tx);
    let ends: Vec<Event> = rx
        .iter()
        .filter(|e| !matches!(e, Event::Token { .. }))
        .collect();
    assert_eq!(ends.len(), 2, "each request ends exactly once: {ends:?}");
    assert!(
        ends.iter().any(|e| matches!(e, Event::Error(_))),
        "{ends:?}"
    );
    fail::remove("engine::step");
    assert_clean(&s);
    let (_, done) = run(&s, request(&tok, "Readability counts."));
    assert!(matches!(done, Event::Done { .. }), "{done:?}");
    scenario.teardown();
}

#[test]
fn a_dead_engine_is_unhealthy_and_requests_racing_its_death_do_not_hang() {
    let scenario = fail::FailScenario::setup();
    let s = start();
    let tok = s.tokenizer().clone();
    let (_, done) = run(&s, request(&tok, "Errors should never pass silently."));
    assert!(matches!(done, Event::Done { .. }), "{done:?}");
    // Clients keep submitting while the engine thread dies: each request is refused, or accepted
    // and then ended (served, or failed by the death); none is left waiting.
    let submitters: Vec<_> = (0..4)
        .map(|k| {
            let s = s.clone();
            let tok = tok.clone();
            std::thread::spawn(move || {
                let mut ended = 0;
                loop {
                    let (tx, rx) = mpsc::channel();
                    let r = request(&tok, &format!("Now is better than never. {k}"));
                    match s.submit(r, Box::new(move |e| tx.send(e).is_ok())) {
                        Err(SubmitError::Unavailable(why)) => return (ended, why),
                        Err(e) => panic!("refused for another reason: {e}"),
                        Ok(()) => loop {
                            match rx.recv_timeout(Duration::from_secs(30)) {
                                Ok(Event::Token { .. }) => {}
                                Ok(_) => break,
                                Err(_) => panic!("an accepted request hangs"),
                            }
                        },
                    }
                    ended += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    fail::cfg("engine::loop", "panic(injected engine death)").unwrap();
    for t in submitters {
        let (_, why) = t.join().expect("a submitter panicked");
        assert!(why.contains("injected engine death"), "{why}");
    }
    let err = s.health().expect_err("a dead engine is unhealthy");
    assert!(err.contains("injected engine death"), "{err}");
    assert_eq!(s.in_flight(), 0, "nothing is left counted");
    let (tx, _rx) = mpsc::channel();
    let r = s.submit(
        request(&tok, "Special cases aren't special enough."),
        Box::new(move |e| tx.send(e).is_ok()),
    );
    assert!(matches!(r, Err(SubmitError::Unavailable(_))), "{r:?}");
    fail::remove("engine::loop");
    scenario.teardown();
}
