//! `hearth bench MODEL [-p 512] [-n 128] [-t T] [-r R] [--json]`: llama-bench's two tests.
//!
//! `pp`: one prefill of p random tokens; `tg`: n decode steps of one random token each. Each test runs
//! once to warm up, then r times from an empty cache; the table gives mean ± sd tokens per second in
//! llama-bench's columns, and `--json` llama-bench's keys. For `tg` it also prints the bandwidth
//! roofline: weight bytes read per token ÷ the machine's measured read bandwidth.

use std::time::Instant;

use anyhow::Result;
use hearth_engine::sampler::Rng;
use hearth_model::{Batch, Ffn, KvCache, Model, Scratch, ThreadPool};
use serde_json::json;

use super::common::ModelArgs;

/// Arguments of `hearth bench`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens of the prefill test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Decode steps of the generation test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions of each test (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Tokens per prefill batch.
    #[arg(short = 'b', long, default_value_t = 512)]
    pub batch: usize,
    /// Print a JSON array (llama-bench's keys) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hearth bench`.
pub fn run(args: Args) -> Result<()> {
    anyhow::ensure!(args.reps > 0, "--repetitions must be at least 1");
    // Measured before the model is loaded, so its buffer does not add to the peak RSS reported below.
    let bw = if args.n_gen > 0 {
        measure_bandwidth(&ThreadPool::new(args.model.n_threads()?))
    } else {
        0.0
    };
    let m = args.model.load()?;
    let model = &m.model;
    let c = &model.config;
    let n_threads = m.pool.n_threads();
    let n_ctx = (args.n_prompt.max(args.n_gen) + 1).max(16);
    let mut kv = KvCache::new(1, c.n_layer, n_ctx, c.k_dim(), c.v_dim(), m.kv_type);
    let mut scratch = Scratch::new(model, args.batch.clamp(1, args.n_prompt.max(1)));
    let mut rng = Rng::new(1234);
    let mut random_tokens = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| (rng.next_u64() % c.n_vocab as u64) as u32)
            .collect()
    };

    let name = model
        .gguf()
        .metadata()
        .get_str("general.name")
        .unwrap_or("model")
        .to_string();
    let file_size = model.gguf().bytes().len() as u64;
    let n_params: u64 = model.gguf().tensors().iter().map(|t| t.n_elements).sum();
    let mut results = Vec::new();

    if args.n_prompt > 0 {
        let samples = measure(args.reps, || {
            let toks = random_tokens(args.n_prompt);
            let t0 = Instant::now();
            prefill(model, &m.pool, &mut kv, &mut scratch, &toks)?;
            Ok(t0.elapsed().as_secs_f64())
        })?;
        results.push(Test {
            name: format!("pp{}", args.n_prompt),
            n_prompt: args.n_prompt,
            n_gen: 0,
            samples,
        });
    }
    if args.n_gen > 0 {
        let samples = measure(args.reps, || {
            let toks = random_tokens(args.n_gen);
            let t0 = Instant::now();
            for (i, t) in toks.iter().enumerate() {
                let batch = Batch {
                    tokens: std::slice::from_ref(t),
                    pos: &[i],
                    seq: &[0],
                    logits: &[true],
                };
                model.forward(&m.pool, &mut kv, &mut scratch, &batch, None)?;
            }
            Ok(t0.elapsed().as_secs_f64())
        })?;
        results.push(Test {
            name: format!("tg{}", args.n_gen),
            n_prompt: 0,
            n_gen: args.n_gen,
            samples,
        });
    }

    let per_token = weight_bytes_per_token(model);
    let rss = peak_rss_bytes();
    if args.json {
        let arr: Vec<_> = results
            .iter()
            .map(|t| {
                let ts: Vec<f64> = t.samples.iter().map(|s| t.tokens() as f64 / s).collect();
                let ns: Vec<u64> = t.samples.iter().map(|s| (s * 1e9) as u64).collect();
                let (avg_ts, sd_ts) = mean_sd(&ts);
                let (avg_ns, sd_ns) = mean_sd(&ns.iter().map(|&n| n as f64).collect::<Vec<_>>());
                json!({
                    "build_commit": env!("CARGO_PKG_VERSION"),
                    "model_filename": args.model.model.display().to_string(),
                    "model_type": name,
                    "model_size": file_size,
                    "model_n_params": n_params,
                    "n_threads": n_threads,
                    "type_k": format!("{:?}", m.kv_type).to_lowercase(),
                    "n_prompt": t.n_prompt,
                    "n_gen": t.n_gen,
                    "avg_ns": avg_ns as u64,
                    "stddev_ns": sd_ns as u64,
                    "avg_ts": avg_ts,
                    "stddev_ts": sd_ts,
                    "samples_ns": ns,
                    "samples_ts": ts,
                    "weight_bytes_per_token": per_token,
                    "read_bandwidth_gbs": bw / 1e9,
                    "roofline_ts": if bw > 0.0 { bw / per_token as f64 } else { 0.0 },
                    "peak_rss_bytes": rss,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&arr)?);
    } else {
        println!("| model                          |       size |     params | backend    | threads |            test |                  t/s |");
        println!("| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |");
        for t in &results {
            let ts: Vec<f64> = t.samples.iter().map(|s| t.tokens() as f64 / s).collect();
            let (avg, sd) = mean_sd(&ts);
            println!(
                "| {:<30} | {:>7.2} GiB | {:>8.2} B | {:<10} | {:>7} | {:>15} | {:>20} |",
                truncate(&name, 30),
                file_size as f64 / (1u64 << 30) as f64,
                n_params as f64 / 1e9,
                format!("CPU {}", hearth_quant::kernel_level().name()),
                n_threads,
                t.name,
                format!("{avg:.2} ± {sd:.2}")
            );
        }
        if bw > 0.0 {
            println!(
                "\ntg roofline: {:.1} MB of weights per token / {:.1} GB/s measured read bandwidth = {:.1} t/s",
                per_token as f64 / 1e6,
                bw / 1e9,
                bw / per_token as f64
            );
        }
        println!("peak RSS: {:.1} MB", rss as f64 / 1e6);
    }
    Ok(())
}

struct Test {
    name: String,
    n_prompt: usize,
    n_gen: usize,
    samples: Vec<f64>, // seconds per repetition
}

impl Test {
    fn tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }
}

/// One warm-up, then `reps` timed runs.
fn measure(reps: usize, mut f: impl FnMut() -> Result<f64>) -> Result<Vec<f64>> {
    f()?;
    (0..reps).map(|_| f()).collect()
}

fn prefill(
    model: &Model,
    pool: &ThreadPool,
    kv: &mut KvCache,
    scratch: &mut Scratch,
    toks: &[u32],
) -> Result<()> {
    let chunk = scratch.max_tokens();
    for (ci, part) in toks.chunks(chunk).enumerate() {
        let pos: Vec<usize> = (ci * chunk..ci * chunk + part.len()).collect();
        let seq = vec![0; part.len()];
        let mut want = vec![false; part.len()];
        *want.last_mut().expect("non-empty chunk") = true;
        model.forward(
            pool,
            kv,
            scratch,
            &Batch {
                tokens: part,
                pos: &pos,
                seq: &seq,
                logits: &want,
            },
            None,
        )?;
    }
    Ok(())
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Bytes of weights one decode step reads: every matrix once, except the token embeddings (one row)
/// and, in MoE layers, only the chosen experts' share of the stacked expert tensors.
fn weight_bytes_per_token(model: &Model) -> u64 {
    let c = &model.config;
    let mut total = model.lm_head().bytes().len() as u64 + model.tok_embd.row_bytes as u64;
    for l in &model.layers {
        total += [&l.wq, &l.wk, &l.wv, &l.wo]
            .iter()
            .map(|w| w.bytes().len() as u64)
            .sum::<u64>();
        total += match &l.ffn {
            Ffn::Dense { gate, up, down } => [gate, up, down]
                .iter()
                .map(|w| w.bytes().len() as u64)
                .sum::<u64>(),
            Ffn::Moe {
                gate_inp,
                gate_exps,
                up_exps,
                down_exps,
            } => {
                let m = c.moe.as_ref().expect("MoE config");
                let experts: u64 = [gate_exps, up_exps, down_exps]
                    .iter()
                    .map(|w| w.bytes().len() as u64)
                    .sum();
                gate_inp.bytes().len() as u64 + experts * m.n_expert_used as u64 / m.n_expert as u64
            }
        };
    }
    total
}

/// Read bandwidth of this machine with the pool's threads: a streaming sum over a buffer much larger
/// than the caches, best of a few passes.
fn measure_bandwidth(pool: &ThreadPool) -> f64 {
    const BYTES: usize = 1 << 28;
    let buf: Vec<u64> = (0..BYTES / 8).map(|i| i as u64).collect();
    let parts = pool.n_threads() * 4;
    let chunk = buf.len().div_ceil(parts);
    let sink = std::sync::atomic::AtomicU64::new(0);
    let mut best = 0f64;
    for _ in 0..4 {
        let t0 = Instant::now();
        pool.run(parts, &|i| {
            let s = &buf[(i * chunk).min(buf.len())..((i + 1) * chunk).min(buf.len())];
            let mut acc = [0u64; 8];
            for c in s.chunks_exact(8) {
                for k in 0..8 {
                    acc[k] = acc[k].wrapping_add(c[k]);
                }
            }
            sink.fetch_add(
                acc.iter().fold(0u64, |a, b| a.wrapping_add(*b)),
                std::sync::atomic::Ordering::Relaxed,
            );
        });
        best = best.max(BYTES as f64 / t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink.into_inner());
    best
}

/// Peak resident memory of this process (`VmHWM`), in bytes; 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
