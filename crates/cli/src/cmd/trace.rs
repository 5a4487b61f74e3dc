//! `hearth trace MODEL -p TEXT [--json] [--compare DIR]`: one prefill of the prompt with per-layer
//! statistics of the residual stream, the attention output and the FFN output; for MoE layers the
//! experts each token chose, the router probability mass they carry and the expert load. Anomalies
//! (NaN / Inf anywhere, the residual stream's std growing more than 10× from one layer to the next)
//! are flagged.
//!
//! `--compare DIR` reads a llama.cpp trace (`trace.jsonl` + `trace.bin`, see
//! `../shared/fixtures/README.md`) of the same prompt and compares, in llama.cpp's graph order, every
//! named tensor Hearth also produces (see [`compare`]); the command fails when Hearth parts ways.

mod compare;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hearth_model::{Batch, KvCache, Scratch, Tap};
use serde::Serialize;

use super::common::ModelArgs;

/// Arguments of `hearth trace`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt, as a prompt-file line: the two characters `\n` become a newline, special tokens are
    /// parsed, BOS is added where the model asks for it.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// A llama.cpp trace directory (`trace.jsonl`, `trace.bin`) of the same prompt to compare with.
    #[arg(long, value_name = "DIR")]
    pub compare: Option<PathBuf>,
}

/// Summary statistics of one tensor (all its rows together).
#[derive(Serialize, Clone, Debug, Default)]
pub struct Stats {
    pub mean: f64,
    pub std: f64,
    pub min: f32,
    pub max: f32,
    pub l2: f64,
    pub nan: usize,
    pub inf: usize,
}

impl Stats {
    /// Statistics over the finite values; NaN and Inf are only counted.
    pub fn of(data: &[f32]) -> Stats {
        let (mut sum, mut sq, mut n) = (0f64, 0f64, 0usize);
        let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
        let (mut nan, mut inf) = (0, 0);
        for &x in data {
            if x.is_nan() {
                nan += 1;
            } else if x.is_infinite() {
                inf += 1;
            } else {
                sum += x as f64;
                sq += (x as f64) * (x as f64);
                min = min.min(x);
                max = max.max(x);
                n += 1;
            }
        }
        let mean = if n > 0 { sum / n as f64 } else { 0.0 };
        let var = if n > 0 {
            (sq / n as f64 - mean * mean).max(0.0)
        } else {
            0.0
        };
        if n == 0 {
            (min, max) = (0.0, 0.0);
        }
        Stats {
            mean,
            std: var.sqrt(),
            min,
            max,
            l2: sq.sqrt(),
            nan,
            inf,
        }
    }
}

/// The routed experts of one MoE layer.
#[derive(Serialize, Clone, Debug)]
pub struct MoeReport {
    /// Per token: the chosen experts by descending probability.
    pub experts: Vec<Vec<u32>>,
    /// Per token: their (renormalised) weights.
    pub weights: Vec<Vec<f32>>,
    /// Per token: the router probability mass the chosen experts carry before renormalisation.
    pub mass: Vec<f32>,
    /// Tokens routed to each expert `[n_expert]`.
    pub load: Vec<usize>,
    /// Most loaded expert's load over the mean load (1 is perfectly balanced).
    pub max_over_mean: f64,
    /// Entropy of the load distribution over ln(n_expert) (1 is perfectly balanced).
    pub entropy: f64,
    /// Experts no token chose.
    pub unused: usize,
}

/// One layer's statistics.
#[derive(Serialize, Clone, Debug)]
pub struct LayerReport {
    pub layer: usize,
    /// The residual stream after the layer (`l_out`).
    pub l_out: Option<Stats>,
    /// The attention block's output projection (`attn_out`).
    pub attn_out: Option<Stats>,
    /// The FFN's output (`ffn_out`).
    pub ffn_out: Option<Stats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeReport>,
}

/// The whole report (`--json` prints it).
#[derive(Serialize, Debug)]
pub struct Report {
    pub model: String,
    pub tokens: Vec<u32>,
    pub layers: Vec<LayerReport>,
    pub anomalies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compare: Option<compare::Comparison>,
}

/// One tensor the forward pass emitted, kept whole for `--compare`.
pub struct Emitted {
    /// llama.cpp's name with the layer suffix (`Qcur-0`, `result_norm`).
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

#[derive(Default)]
struct Recorder {
    keep: bool,
    emitted: Vec<Emitted>,
    /// (layer, stream) -> stats, for the three per-layer streams.
    streams: BTreeMap<(usize, &'static str), Stats>,
    /// Non-finite values seen, per tensor name.
    non_finite: Vec<String>,
    /// layer -> router probabilities `[T, n_expert]`.
    probs: BTreeMap<usize, (Vec<f32>, usize)>,
    /// layer -> (selected `[T, k]`, weights `[T, k]`, k).
    experts: BTreeMap<usize, (Vec<u32>, Vec<f32>, usize)>,
}

impl Tap for Recorder {
    fn tensor(&mut self, name: &str, layer: Option<usize>, data: &[f32], rows: usize, cols: usize) {
        let full = match layer {
            Some(l) => format!("{name}-{l}"),
            None => name.to_string(),
        };
        let bad = data.iter().filter(|x| !x.is_finite()).count();
        if bad > 0 {
            self.non_finite
                .push(format!("{full}: {bad} NaN/Inf values"));
        }
        if let Some(l) = layer {
            let stream = match name {
                "l_out" => Some("l_out"),
                "attn_out" => Some("attn_out"),
                "ffn_out" => Some("ffn_out"),
                _ => None,
            };
            if let Some(s) = stream {
                self.streams.insert((l, s), Stats::of(data));
            }
            if name == "ffn_moe_probs" {
                self.probs.insert(l, (data.to_vec(), cols));
            }
        }
        if self.keep {
            self.emitted.push(Emitted {
                name: full,
                rows,
                cols,
                data: data.to_vec(),
            });
        }
    }

    fn experts(&mut self, layer: usize, selected: &[u32], weights: &[f32], k: usize) {
        self.experts
            .insert(layer, (selected.to_vec(), weights.to_vec(), k));
    }
}

fn moe_report(
    n_expert: usize,
    sel: &[u32],
    w: &[f32],
    k: usize,
    probs: Option<&(Vec<f32>, usize)>,
) -> MoeReport {
    let n_tok = sel.len().checked_div(k).unwrap_or(0);
    let mut load = vec![0usize; n_expert];
    let (mut experts, mut weights, mut mass) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..n_tok {
        let s = &sel[t * k..(t + 1) * k];
        for &e in s {
            if let Some(c) = load.get_mut(e as usize) {
                *c += 1;
            }
        }
        experts.push(s.to_vec());
        weights.push(w[t * k..(t + 1) * k].to_vec());
        let m = match probs {
            Some((p, ne)) => s
                .iter()
                .map(|&e| p.get(t * ne + e as usize).copied().unwrap_or(0.0))
                .sum(),
            None => f32::NAN,
        };
        mass.push(m);
    }
    let total: usize = load.iter().sum();
    let mean = total as f64 / n_expert.max(1) as f64;
    let max = load.iter().copied().max().unwrap_or(0) as f64;
    let entropy = if total > 0 && n_expert > 1 {
        let h: f64 = load
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / total as f64;
                -p * p.ln()
            })
            .sum();
        h / (n_expert as f64).ln()
    } else {
        1.0
    };
    MoeReport {
        experts,
        weights,
        mass,
        unused: load.iter().filter(|&&c| c == 0).count(),
        max_over_mean: if mean > 0.0 { max / mean } else { 0.0 },
        entropy,
        load,
    }
}

/// Runs `hearth trace`.
pub fn run(args: Args) -> Result<()> {
    let m = args.model.load()?;
    let tokens = m.tokenizer.encode_prompt_line(&args.prompt);
    anyhow::ensure!(!tokens.is_empty(), "the prompt has no tokens");
    let reference = match &args.compare {
        Some(dir) => Some(
            compare::LlamaTrace::read(dir)
                .with_context(|| format!("reading the trace in {}", dir.display()))?,
        ),
        None => None,
    };

    let c = &m.model.config;
    let n = tokens.len();
    let mut kv = KvCache::new(1, c.n_layer, n, c.kv_dims(), m.kv_type);
    let mut scratch = Scratch::new(&m.model, n);
    let pos: Vec<usize> = (0..n).collect();
    let seq = vec![0usize; n];
    let want = vec![true; n];
    let batch = Batch {
        tokens: &tokens,
        pos: &pos,
        seq: &seq,
        logits: &want,
    };
    let mut rec = Recorder {
        keep: reference.is_some(),
        ..Default::default()
    };
    m.model
        .forward(&m.pool, &mut kv, &mut scratch, &batch, Some(&mut rec))
        .context("forward pass")?;

    let n_expert = c.moe.as_ref().map_or(0, |m| m.n_expert);
    let mut layers = Vec::with_capacity(c.n_layer);
    let mut anomalies = rec.non_finite.clone();
    let mut prev_std: Option<f64> = None;
    for l in 0..c.n_layer {
        let get = |s: &'static str| rec.streams.get(&(l, s)).cloned();
        let l_out = get("l_out");
        if let (Some(prev), Some(cur)) = (prev_std, l_out.as_ref()) {
            if prev > 0.0 && cur.std > 10.0 * prev {
                anomalies.push(format!(
                    "l_out-{l}: std grew {:.1}x over the previous layer ({prev:.4} -> {:.4})",
                    cur.std / prev,
                    cur.std
                ));
            }
        }
        prev_std = l_out.as_ref().map(|s| s.std);
        let moe = rec
            .experts
            .get(&l)
            .map(|(sel, w, k)| moe_report(n_expert, sel, w, *k, rec.probs.get(&l)));
        layers.push(LayerReport {
            layer: l,
            l_out,
            attn_out: get("attn_out"),
            ffn_out: get("ffn_out"),
            moe,
        });
    }
    let comparison = reference.as_ref().map(|r| {
        let sel: compare::Selections = rec
            .experts
            .iter()
            .map(|(&l, (s, _, k))| (l, (s.clone(), *k)))
            .collect();
        compare::compare(r, &rec.emitted, &sel)
    });

    let report = Report {
        model: args.model.model.display().to_string(),
        tokens,
        layers,
        anomalies,
        compare: comparison,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let mut o = String::new();
        print_human(&mut o, &report);
        // A closed pipe (`| head`) is not an error worth a message.
        match std::io::stdout().lock().write_all(o.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
            _ => {}
        }
    }
    if let Some(cmp) = &report.compare {
        if let Some(first) = &cmp.first_divergence {
            anyhow::bail!("Hearth parts ways with llama.cpp at {first}");
        }
    }
    Ok(())
}

fn fmt_stats(name: &str, s: &Stats) -> String {
    format!(
        "{name:<9} {:>10.4} {:>10.4} {:>10.4} {:>10.4} {:>11.3} {:>4} {:>4}",
        s.mean, s.std, s.min, s.max, s.l2, s.nan, s.inf
    )
}

fn print_human(o: &mut String, r: &Report) {
    let _ = writeln!(o, "model   {}", r.model);
    let _ = writeln!(o, "tokens  {} {:?}", r.tokens.len(), r.tokens);
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:>5} {:<9} {:>10} {:>10} {:>10} {:>10} {:>11} {:>4} {:>4}",
        "layer", "tensor", "mean", "std", "min", "max", "L2", "NaN", "Inf"
    );
    for l in &r.layers {
        for (name, s) in [
            ("attn_out", &l.attn_out),
            ("ffn_out", &l.ffn_out),
            ("l_out", &l.l_out),
        ] {
            if let Some(s) = s {
                let _ = writeln!(o, "{:>5} {}", l.layer, fmt_stats(name, s));
            }
        }
    }
    let moe: Vec<_> = r
        .layers
        .iter()
        .filter_map(|l| l.moe.as_ref().map(|m| (l.layer, m)))
        .collect();
    if !moe.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(
 o, "experts (per layer: load balance, then each token's experts with their weights and router mass)");
        for (l, m) in moe {
            let _ = writeln!(
                o,
                "layer {l}: max/mean load {:.2}, load entropy {:.3}, {} of {} experts unused",
                m.max_over_mean,
                m.entropy,
                m.unused,
                m.load.len()
            );
            let hist: Vec<String> = m
                .load
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(e, c)| format!("{e}:{c}"))
                .collect();
            let _ = writeln!(o, "  load  {}", hist.join(" "));
            for (t, (e, w)) in m.experts.iter().zip(&m.weights).enumerate() {
                let pairs: Vec<String> = e
                    .iter()
                    .zip(w)
                    .map(|(e, w)| format!("{e}({w:.2})"))
                    .collect();
                let _ = writeln!(o, "  t{t:<4} {}  mass {:.3}", pairs.join(" "), m.mass[t]);
            }
        }
    }
    let _ = writeln!(o);
    if r.anomalies.is_empty() {
        let _ = writeln!(o, "anomalies: none");
    } else {
        let _ = writeln!(o, "anomalies:");
        for a in &r.anomalies {
            let _ = writeln!(o, "  {a}");
        }
    }
    if let Some(c) = &r.compare {
        let _ = writeln!(o);
        compare::print_human(o, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_non_finite_apart() {
        let s = Stats::of(&[
            1.0,
            -1.0,
            3.0,
            -3.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        assert_eq!((s.nan, s.inf), (1, 2));
        assert_eq!((s.min, s.max), (-3.0, 3.0));
        assert!(s.mean.abs() < 1e-12);
        assert!((s.std - 5f64.sqrt()).abs() < 1e-9);
        assert!((s.l2 - 20f64.sqrt()).abs() < 1e-9);
        let empty = Stats::of(&[f32::NAN]);
        assert_eq!((empty.min, empty.max, empty.nan), (0.0, 0.0, 1));
    }

    #[test]
    fn expert_load_and_balance() {
        // 4 experts, top-2, 4 tokens: loads [4, 2, 2, 0].
        let sel = [0, 1, 0, 2, 0, 1, 0, 2];
        let w = [0.6, 0.4, 0.5, 0.5, 0.7, 0.3, 0.9, 0.1];
        let probs: Vec<f32> = (0..4).flat_map(|_| [0.4f32, 0.3, 0.2, 0.1]).collect();
        let m = moe_report(4, &sel, &w, 2, Some(&(probs, 4)));
        assert_eq!(m.load, [4, 2, 2, 0]);
        assert_eq!(m.unused, 1);
        assert!((m.max_over_mean - 2.0).abs() < 1e-12);
        let h = -(0.5f64 * 0.5f64.ln() + 2.0 * 0.25 * 0.25f64.ln()) / 4f64.ln();
        assert!((m.entropy - h).abs() < 1e-12);
        assert!((m.mass[0] - 0.7).abs() < 1e-6 && (m.mass[1] - 0.6).abs() < 1e-6);
        assert_eq!(m.experts[3], [0, 2]);
        // Perfect balance.
        let m = moe_report(2, &[0, 1, 1, 0], &[0.5; 4], 2, None);
        assert_eq!((m.max_over_mean, m.entropy, m.unused), (1.0, 1.0, 0));
    }
}
