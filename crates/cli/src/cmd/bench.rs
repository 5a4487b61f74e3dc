//! `hearth bench MODEL [-p 512] [-n 128] [-d 0,...] [-t T] [-r R] [--json]`: llama-bench's two
//! tests.
//!
//! `pp`: one prefill of p random tokens, logits for the last one only (as llama-bench's
//! `common_batch_get_one`); `tg`: n decode steps of one random token each. Each test runs once to
//! warm up, then r times; the table gives mean ± sd tokens per second in llama-bench's columns, and
//! `--json` llama-bench's keys plus Hearth's own (roofline, bandwidth, peak RSS).
//!
//! `--parallel S` decodes S sequences together in the `tg` test, as `hearth serve` steps S
//! concurrent requests: every step is one batch of S tokens, one per sequence, each with its own
//! context (`-d N` tokens of it each) and its own logits. The test is named `tg128 x8` and its t/s
//! counts the tokens of all sequences (`n_parallel` in `--json`): the server's decode throughput
//! without HTTP, scheduling or sampling.
//!
//! `-d N` (llama-bench's `--n-depth`) runs the tests after N tokens of context: N random tokens are
//! prefilled once, untimed, and every repetition then starts at position N. A repetition only
//! writes positions from N on and attention only reads positions up to the current one, so the
//! context stays the same for every repetition without being refilled. The test is named
//! `pp512 @ d4096` as llama-bench names it, and the memory line gives the KV cache at that depth.
//!
//! For `tg` it also prints the bandwidth roofline: weight bytes read per token ÷ the machine's measured
//! read bandwidth ([`bandwidth`]). The probe runs before the model is loaded, its buffer is unmapped
//! before a byte of the model is touched, and the kernel's peak-RSS mark is reset afterwards, so the
//! peak RSS reported (`VmHWM`) is the benchmark's own: mapped weights, KV cache, scratch.

mod bandwidth;

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use hearth_engine::sampler::Rng;
use hearth_model::{Batch, Ffn, KvCache, Model, Scratch, ThreadPool};
use serde_json::json;

use super::common::ModelArgs;
use bandwidth::Bandwidth;

/// What the peak RSS may use beyond file size + KV cache (scratch, tokenizer, stacks, allocator).
const RSS_SLACK_BYTES: u64 = 300 * 1000 * 1000;

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
    /// Sequences decoded together in the generation test, one token each per step (as `hearth
    /// serve` with that many concurrent requests).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: u16,
    /// Tokens of context before each test (comma-separated for several depths).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub depth: Vec<usize>,
    /// Print a JSON array (llama-bench's keys) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hearth bench`.
pub fn run(args: Args) -> Result<()> {
    anyhow::ensure!(args.reps > 0, "--repetitions must be at least 1");
    if fail::has_failpoints() {
        // `cargo test` builds the binary with the tests' features and leaves it at the release
        // path: every task of the thread pool then evaluates a failpoint (~1.5% of a server step).
        eprintln!(
            "warning: this hearth was built with failpoints (as `cargo test` builds it): they cost \
             time in every parallel task; `cargo build --release` before measuring"
        );
    }
    let n_threads = args.model.n_threads()?;
    let bw = (args.n_gen > 0).then(|| bandwidth::measure(n_threads));
    // The probe's buffer is unmapped by now; forget the peak it left so VmHWM measures the benchmark.
    let rss_reset = reset_peak_rss();
    if let (false, Some(bw)) = (rss_reset, &bw) {
        eprintln!(
            "warning: cannot reset the peak RSS mark (/proc/self/clear_refs): the peak RSS below \
             includes the {} MiB bandwidth probe",
            bw.buffer_bytes >> 20
        );
    }

    let m = args.model.load_unsized()?;
    let model = &m.model;
    let c = &model.config;
    let batch = prefill_batch(args.batch, args.n_prompt, &args.depth);
    let mut scratch = Scratch::new(model, batch);
    let mut rng = Rng::new(1234);
    let mut random_tokens = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| (rng.next_u64() % c.n_vocab as u64) as u32)
            .collect()
    };

    let mut results = Vec::new();
    let mut kv_bytes = 0;
    let mut kv_depth = 0;
    for &depth in &args.depth {
        let n_ctx = depth
            .saturating_add(args.n_prompt.max(args.n_gen))
            .saturating_add(1)
            .max(16);
        let n_seq = args.parallel as usize;
        let kv_need = (n_ctx as u64 * n_seq as u64)
            .saturating_mul(super::common::kv_bytes_per_token(model, m.kv_type));
        if let Some(avail) = super::common::mem_available_bytes() {
            anyhow::ensure!(
                kv_need < avail,
                "-d {depth} needs a {:.1} GB KV cache, more than the {:.1} GB of memory available",
                kv_need as f64 / 1e9,
                avail as f64 / 1e9
            );
        }
        let mut kv = KvCache::new(n_seq, c.n_layer, n_ctx, c.kv_dims(), m.kv_type);
        if depth > 0 {
            let t0 = Instant::now();
            for seq in 0..n_seq {
                let toks = random_tokens(depth);
                prefill(model, &m.pool, &mut kv, &mut scratch, &toks, seq, 0)?;
            }
            let secs = t0.elapsed().as_secs_f64();
            eprintln!(
                "depth {depth}: context prefilled in {secs:.1} s ({:.1} t/s, batches of {batch})",
                (depth * n_seq) as f64 / secs
            );
        }
        let at = |name: String| {
            if depth > 0 {
                format!("{name} @ d{depth}")
            } else {
                name
            }
        };
        if args.n_prompt > 0 {
            let samples = measure(args.reps, || {
                let toks = random_tokens(args.n_prompt);
                let t0 = Instant::now();
                prefill(model, &m.pool, &mut kv, &mut scratch, &toks, 0, depth)?;
                Ok(t0.elapsed().as_secs_f64())
            })?;
            let name = at(format!("pp{}", args.n_prompt));
            results.push(Test::new(name, args.n_prompt, 0, depth, 1, samples));
        }
        if args.n_gen > 0 {
            let seq: Vec<usize> = (0..n_seq).collect();
            let want = vec![true; n_seq];
            let mut pos = vec![0; n_seq];
            let mut dec_scratch =
                (n_seq > scratch.max_tokens()).then(|| Scratch::new(model, n_seq));
            let samples = measure(args.reps, || {
                let toks = random_tokens(args.n_gen * n_seq);
                let t0 = Instant::now();
                for (i, step) in toks.chunks_exact(n_seq).enumerate() {
                    pos.fill(depth + i);
                    let batch = Batch {
                        tokens: step,
                        pos: &pos,
                        seq: &seq,
                        logits: &want,
                    };
                    let s = dec_scratch.as_mut().unwrap_or(&mut scratch);
                    model.forward(&m.pool, &mut kv, s, &batch, None)?;
                }
                Ok(t0.elapsed().as_secs_f64())
            })?;
            let name = if n_seq > 1 {
                at(format!("tg{} x{n_seq}", args.n_gen))
            } else {
                at(format!("tg{}", args.n_gen))
            };
            results.push(Test::new(name, 0, args.n_gen, depth, n_seq, samples));
        }
        if kv.bytes() as u64 >= kv_bytes {
            kv_bytes = kv.bytes() as u64;
            kv_depth = depth;
        }
    }

    let report = Report {
        model_filename: args.model.model.display().to_string(),
        model_type: model
            .gguf()
            .metadata()
            .get_str("general.name")
            .unwrap_or("model")
            .to_string(),
        file_size: model.gguf().bytes().len() as u64,
        tensor_bytes: model.gguf().tensors().iter().map(|t| t.n_bytes).sum(),
        n_params: model.gguf().tensors().iter().map(|t| t.n_elements).sum(),
        n_threads: m.pool.n_threads(),
        n_batch: args.batch,
        kv_type: m.kv_type.name().to_string(),
        kv_bytes,
        kv_depth,
        weight_bytes_per_token: weight_bytes_per_token(model),
        bandwidth: bw,
        peak_rss: peak_rss_bytes(),
        peak_rss_includes_probe: !rss_reset && args.n_gen > 0,
        weights: m.weights.clone(),
        weights_resident: model.gguf().is_resident(),
        weights_huge_page_bytes: huge_page_bytes(model.gguf().bytes()),
        weights_interleaved: model.gguf().n_rewritten(),
        results,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.json())?);
    } else {
        report.print_table();
    }
    Ok(())
}

/// One test's timings.
struct Test {
    name: String,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    /// Sequences of the test (each of `n_gen` tokens).
    n_seq: usize,
    samples: Vec<f64>, // [reps] seconds per repetition
    test_time: String,
}

impl Test {
    fn new(
        name: String,
        n_prompt: usize,
        n_gen: usize,
        n_depth: usize,
        n_seq: usize,
        samples: Vec<f64>,
    ) -> Test {
        Test {
            name,
            n_prompt,
            n_gen,
            n_depth,
            n_seq,
            samples,
            test_time: utc_timestamp(SystemTime::now()),
        }
    }

    /// Tokens per second of each repetition.
    fn samples_ts(&self) -> Vec<f64> {
        let tokens = (self.n_prompt + self.n_gen * self.n_seq) as f64;
        self.samples.iter().map(|s| tokens / s).collect()
    }
}

/// Everything `hearth bench` prints.
struct Report {
    model_filename: String,
    model_type: String,
    file_size: u64,
    tensor_bytes: u64, // what llama-bench calls the model size (and prints in its size column)
    n_params: u64,
    n_threads: usize,
    n_batch: usize,
    kv_type: String,
    kv_bytes: u64, // the largest cache of the run: at the deepest depth
    kv_depth: usize,
    weight_bytes_per_token: u64,
    bandwidth: Option<Bandwidth>,
    peak_rss: u64,
    peak_rss_includes_probe: bool,
    /// How the weights are held (`--load`), and why.
    weights: String,
    weights_resident: bool,
    /// Of the weights' mapping, the bytes on transparent huge pages (`None`: unknown here).
    weights_huge_page_bytes: Option<u64>,
    /// Matrices laid out in groups of 4 or 8 rows at load (`hearth_quant::interleave`).
    weights_interleaved: usize,
    results: Vec<Test>,
}

impl Report {
    /// Decode roofline in tokens per second (0 without a bandwidth probe).
    fn roofline_ts(&self) -> f64 {
        match &self.bandwidth {
            Some(bw) if self.weight_bytes_per_token > 0 => {
                bw.best() / self.weight_bytes_per_token as f64
            }
            _ => 0.0,
        }
    }

    /// The memory bound: file size + KV cache + 300 MB.
    fn rss_bound(&self) -> u64 {
        self.file_size + self.kv_bytes + RSS_SLACK_BYTES
    }

    /// One object per test: llama-bench's keys (`-o json`) first, then Hearth's.
    fn json(&self) -> serde_json::Value {
        let bw = self.bandwidth.as_ref();
        let gbs = |x: f64| (x / 1e7).round() / 100.0;
        let tests = self.results.iter().map(|t| {
            let ts = t.samples_ts();
            let ns: Vec<f64> = t.samples.iter().map(|s| (s * 1e9).round()).collect();
            let (avg_ts, stddev_ts) = mean_sd(&ts);
            let (avg_ns, stddev_ns) = mean_sd(&ns);
            json!({
                "build_commit": env!("CARGO_PKG_VERSION"),
                "cpu_info": cpu_info(),
                "backends": "CPU",
                "model_filename": self.model_filename,
                "model_type": self.model_type,
                "model_size": self.tensor_bytes,
                "model_n_params": self.n_params,
                "n_batch": self.n_batch,
                "n_ubatch": self.n_batch,
                "n_threads": self.n_threads,
                "type_k": self.kv_type,
                "type_v": self.kv_type,
                "n_prompt": t.n_prompt,
                "n_gen": t.n_gen,
                "n_depth": t.n_depth,
                "n_parallel": t.n_seq,
                "test_time": t.test_time,
                "avg_ns": avg_ns as u64,
                "stddev_ns": stddev_ns as u64,
                "avg_ts": avg_ts,
                "stddev_ts": stddev_ts,
                "samples_ns": ns.iter().map(|&n| n as u64).collect::<Vec<_>>(),
                "samples_ts": ts,
                "file_size": self.file_size,
                "kernels": hearth_quant::kernel_level().name(),
                "weight_bytes_per_token": self.weight_bytes_per_token,
                "read_bandwidth_gbs": bw.map_or(0.0, |b| gbs(b.best())),
                "read_bandwidth_median_gbs": bw.map_or(0.0, |b| gbs(b.median())),
                "read_bandwidth_samples_gbs": bw.map_or(vec![], |b| b.passes.iter().map(|&x| gbs(x)).collect()),
                "read_bandwidth_threads": bw.map_or(0, |b| b.n_threads),
                "read_bandwidth_buffer_bytes": bw.map_or(0, |b| b.buffer_bytes),
                "roofline_ts": self.roofline_ts(),
                "kv_cache_bytes": self.kv_bytes,
                "peak_rss_bytes": self.peak_rss,
                "peak_rss_bound_bytes": self.rss_bound(),
                "peak_rss_includes_probe": self.peak_rss_includes_probe,
                "weights_resident": self.weights_resident,
                "weights_huge_page_bytes": self.weights_huge_page_bytes,
                "weights_interleaved": self.weights_interleaved,
            })
        });
        serde_json::Value::Array(tests.collect())
    }

    /// llama-bench's markdown table, then the roofline and the memory figures.
    fn print_table(&self) {
        println!("| model                          |       size |     params | backend    | threads |            test |                  t/s |");
        println!("| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |");
        for t in &self.results {
            let (avg, sd) = mean_sd(&t.samples_ts());
            println!(
                "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} |",
                truncate(&self.model_type, 30),
                size_label(self.tensor_bytes),
                params_label(self.n_params),
                format!("CPU {}", hearth_quant::kernel_level().name()),
                self.n_threads,
                t.name,
                format!("{avg:.2} ± {sd:.2}")
            );
        }
        println!();
        if let Some(bw) = &self.bandwidth {
            println!(
                "read bandwidth: {:.1} GB/s with {} threads (best of {} passes over {} MiB; median {:.1} GB/s)",
                bw.best() / 1e9,
                bw.n_threads,
                bw.passes.len(),
                bw.buffer_bytes >> 20,
                bw.median() / 1e9,
            );
            println!(
                "tg roofline: {:.1} MB of weights per token / {:.1} GB/s = {:.1} t/s",
                self.weight_bytes_per_token as f64 / 1e6,
                bw.best() / 1e9,
                self.roofline_ts()
            );
        }
        println!(
            "peak RSS: {:.1} MB{} (bound: file {:.1} MB + KV cache {:.1} MB at depth {} + 300 MB = {:.1} MB)",
            self.peak_rss as f64 / 1e6,
            if self.peak_rss_includes_probe {
                ", bandwidth probe included"
            } else {
                ""
            },
            self.file_size as f64 / 1e6,
            self.kv_bytes as f64 / 1e6,
            self.kv_depth,
            self.rss_bound() as f64 / 1e6,
        );
        let huge = self.weights_huge_page_bytes.map_or(String::new(), |b| {
            format!(
                "; {:.1} of {:.1} MB on 2 MiB pages",
                b as f64 / 1e6,
                self.file_size as f64 / 1e6
            )
        });
        let interleaved = match self.weights_interleaved {
            0 => String::new(),
            n => format!("; {n} matrices laid out in groups of rows"),
        };
        println!("weights: {}{huge}{interleaved}", self.weights);
    }
}

/// One warm-up, then `reps` timed runs.
fn measure(reps: usize, mut f: impl FnMut() -> Result<f64>) -> Result<Vec<f64>> {
    f()?;
    (0..reps).map(|_| f()).collect()
}

/// Prefills `toks` into sequence `seq` at positions `start..`.
fn prefill(
    model: &Model,
    pool: &ThreadPool,
    kv: &mut KvCache,
    scratch: &mut Scratch,
    toks: &[u32],
    seq: usize,
    start: usize,
) -> Result<()> {
    let chunk = scratch.max_tokens();
    for (ci, part) in toks.chunks(chunk).enumerate() {
        let first = start + ci * chunk;
        let pos: Vec<usize> = (first..first + part.len()).collect();
        let seq = vec![seq; part.len()];
        // Logits for the chunk's last token only, as llama-bench: the output projection is one row.
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

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// llama-bench's size column: MiB below 1 GiB, GiB above.
fn size_label(bytes: u64) -> String {
    if bytes < 1 << 30 {
        format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

/// llama-bench's params column: M below a billion, B above.
fn params_label(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

/// The CPU's model name, as llama-bench's `cpu_info`.
fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// `2026-11-29T19:18:28Z`, as llama-bench's `test_time`.
fn utc_timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant, "chrono-Compatible Low-Level Date Algorithms").
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
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

/// Of the mapping that holds `bytes`, the bytes backed by transparent huge pages: its
/// `AnonHugePages` (a file read into memory) plus `FilePmdMapped` (a mapped file's huge folios) in
/// /proc/self/smaps. `None` where that file is missing or does not list the mapping.
fn huge_page_bytes(bytes: &[u8]) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    huge_page_bytes_in(&smaps, bytes.as_ptr() as u64)
}

/// [`huge_page_bytes`] of the mapping containing `addr`, from the text of an smaps file.
fn huge_page_bytes_in(smaps: &str, addr: u64) -> Option<u64> {
    let mut inside = false;
    let mut found = None;
    for line in smaps.lines() {
        let range = line
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'));
        let bounds = range.and_then(|(a, b)| {
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        });
        if let Some((start, end)) = bounds {
            if found.is_some() {
                break;
            }
            inside = (start..end).contains(&addr);
            if inside {
                found = Some(0);
            }
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(rest) = line
            .strip_prefix("AnonHugePages:")
            .or_else(|| line.strip_prefix("FilePmdMapped:"))
        {
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            found = found.map(|f: u64| f + kb * 1024);
        }
    }
    found
}

/// Resets this process's peak-RSS mark (`VmHWM`, and with it the `ru_maxrss` a parent sees) to the
/// current RSS, by writing 5 to /proc/self/clear_refs (Linux ≥ 4.0). False where that is refused.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak resident memory of this process (`VmHWM`), in bytes; 0 where unknown.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Tokens per forward pass of a prefill: `-b`, no more than the longest prefill of the run (the
/// prompt or the deepest context), at least one. A decode-only run at depth (`-p 0 -n 64 -d 4096`)
/// still prefills its context in batches, not a token at a time.
fn prefill_batch(batch: usize, n_prompt: usize, depths: &[usize]) -> usize {
    let longest = depths.iter().copied().fold(n_prompt, usize::max);
    batch.clamp(1, longest.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn prefill_batches_cover_the_context_too() {
        assert_eq!(prefill_batch(512, 0, &[4096]), 512);
        assert_eq!(prefill_batch(512, 0, &[0, 40]), 40);
        assert_eq!(prefill_batch(512, 128, &[0]), 128);
        assert_eq!(prefill_batch(512, 0, &[0]), 1);
        assert_eq!(prefill_batch(0, 512, &[4096]), 1);
    }

    #[test]
    fn huge_pages_of_the_mapping_holding_an_address() {
        let smaps = "\
55d0a0000000-55d0a0021000 rw-p 00000000 00:00 0      [heap]
Size:                132 kB
AnonHugePages:         0 kB
7f0000000000-7f0006000000 r--p 00000000 00:00 0
Size:              98304 kB
AnonHugePages:     94208 kB
FilePmdMapped:         0 kB
VmFlags: rd mr mw me hg
7f0006000000-7f0006200000 r--p 00000000 fd:00 12  /models/m.gguf
AnonHugePages:         0 kB
FilePmdMapped:      2048 kB
";
        assert_eq!(
            huge_page_bytes_in(smaps, 0x7f00_0000_1000),
            Some(94208 * 1024)
        );
        assert_eq!(
            huge_page_bytes_in(smaps, 0x7f00_0600_0000),
            Some(2048 * 1024)
        );
        assert_eq!(huge_page_bytes_in(smaps, 0x55d0_a000_0010), Some(0));
        assert_eq!(huge_page_bytes_in(smaps, 0x1000), None);
        // This process's own: a heap address is in some mapping.
        assert!(huge_page_bytes(&[0u8; 4]).is_some() || !cfg!(target_os = "linux"));
    }

    #[test]
    fn timestamps_are_utc_iso8601() {
        let at = |s| utc_timestamp(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_798_571_908), "2026-12-29T19:18:28Z");
    }

    #[test]
    fn labels_match_llama_bench() {
        assert_eq!(size_label(96_576_768), "92.10 MiB");
        assert_eq!(size_label(5 << 30), "5.00 GiB");
        assert_eq!(params_label(134_515_008), "134.52 M");
        assert_eq!(params_label(30_532_122_624), "30.53 B");
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
