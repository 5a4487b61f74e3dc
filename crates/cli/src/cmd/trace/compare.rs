//! Tensor-by-tensor comparison with a llama.cpp trace.
//!
//! llama.cpp names one tensor several times as it goes (`Qcur-0` after the projection, after the bias,
//! after the reshape and after RoPE), while Hearth emits a name once per value it computes (`Qcur`
//! after the projection and bias, again after RoPE). Occurrences are aligned from the last: Hearth's
//! last `Qcur-0` is llama.cpp's last (the RoPE output), the one before it llama.cpp's one before (the
//! reshape, which holds the projection's values). Earlier llama.cpp occurrences, unnamed `node_N`
//! entries and names Hearth does not emit are skipped. llama.cpp's `ffn_moe_out-L` is Hearth's
//! `ffn_out-L` in MoE layers (llama.cpp has no `ffn_out` there).
//!
//! Element order needs no care: ggml's `ne0` is the fastest dimension, so `[head_dim, n_head, T]` and
//! `[cols, T]` are both Hearth's row-major `[T, cols]`.
//!
//! The verdict per tensor is its normalised mean squared error, NMSE = Σ(h - r)² / Σr², against
//! [`NMSE_THRESHOLD`]. Correct engines differ from llama.cpp by 8-bit activation quantization, the f16
//! KV cache, flash attention's summation order and, in MoE models, an expert flipped where two router
//! probabilities nearly tie (reported per layer from `ffn_moe_argsort`). Measured on the fixture
//! traces: at most 7e-4 on the tiny models and 2.9e-3 through SmolLM2's 30 layers. The same weights in
//! a coarser quant type (Q4_0 against the Q4_K_M trace) land at 1.3e-2 from the first tensor on;
//! another model or a wrong prompt at order 1, or a different token count.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::Emitted;

/// Above this NMSE a tensor counts as diverged.
pub const NMSE_THRESHOLD: f64 = 1e-2;

/// One line of `trace.jsonl`.
#[derive(Deserialize, Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub op: String,
    pub dtype: String,
    pub ne: Vec<u64>,
    pub offset: u64,
    pub count: u64,
}

/// A llama.cpp trace directory, read whole.
pub struct LlamaTrace {
    pub entries: Vec<Entry>,
    bin: Vec<u8>,
}

impl LlamaTrace {
    /// Reads `dir/trace.jsonl` and `dir/trace.bin`, checking every entry lies inside the binary.
    pub fn read(dir: &Path) -> Result<LlamaTrace> {
        let jsonl = dir.join("trace.jsonl");
        let text = std::fs::read_to_string(&jsonl)
            .with_context(|| format!("cannot read {}", jsonl.display()))?;
        let bin_path = dir.join("trace.bin");
        let bin = std::fs::read(&bin_path)
            .with_context(|| format!("cannot read {}", bin_path.display()))?;
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let e: Entry = serde_json::from_str(line)
                .with_context(|| format!("{} line {}", jsonl.display(), i + 1))?;
            let end = e.offset.checked_add(e.count).and_then(|x| x.checked_mul(4));
            match end {
                Some(end) if end <= bin.len() as u64 => {}
                _ => bail!(
                    "{} line {}: {} values at {} run past trace.bin ({} bytes)",
                    jsonl.display(),
                    i + 1,
                    e.count,
                    e.offset,
                    bin.len()
                ),
            }
            if e.dtype != "f32" && e.dtype != "i32" {
                bail!(
                    "{} line {}: unknown dtype {:?}",
                    jsonl.display(),
                    i + 1,
                    e.dtype
                );
            }
            entries.push(e);
        }
        Ok(LlamaTrace { entries, bin })
    }

    /// An entry's values as f32 (i32 entries converted).
    pub fn values(&self, e: &Entry) -> Vec<f32> {
        let start = (e.offset * 4) as usize;
        let bytes = &self.bin[start..start + (e.count * 4) as usize];
        bytes
            .chunks_exact(4)
            .map(|b| {
                let b = [b[0], b[1], b[2], b[3]];
                if e.dtype == "i32" {
                    i32::from_le_bytes(b) as f32
                } else {
                    f32::from_le_bytes(b)
                }
            })
            .collect()
    }
}

/// One compared tensor.
#[derive(Serialize, Debug, Clone)]
pub struct Row {
    /// llama.cpp's name (`Qcur-0`).
    pub name: String,
    /// llama.cpp's op for this occurrence (`ROPE`).
    pub op: String,
    pub ne: Vec<u64>,
    /// The Hearth tensor it was compared with, when the name differs (`ffn_out-0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hearth: Option<String>,
    pub max_abs_diff: f64,
    pub max_abs_ref: f64,
    /// max|h - r| / max|r|.
    pub rel: f64,
    /// Σ(h - r)² / Σr².
    pub nmse: f64,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The comparison (part of the `--json` report).
#[derive(Serialize, Debug)]
pub struct Comparison {
    pub threshold_nmse: f64,
    pub compared: usize,
    pub rows: Vec<Row>,
    /// Largest NMSE over all compared tensors and where.
    pub worst: Option<(String, f64)>,
    /// The first tensor in graph order over the threshold (or of another shape).
    pub first_divergence: Option<String>,
    /// Per MoE layer, the tokens whose chosen experts differ from llama.cpp's (`ffn_moe_argsort`).
    pub routing: Vec<Routing>,
}

/// Expert choices compared with llama.cpp's, in one MoE layer.
#[derive(Serialize, Debug, Clone)]
pub struct Routing {
    pub layer: usize,
    pub tokens: usize,
    /// Tokens whose set of chosen experts differs.
    pub flipped: Vec<usize>,
}

/// Hearth's chosen experts: layer -> (selected `[T, k]`, k).
pub type Selections = std::collections::BTreeMap<usize, (Vec<u32>, usize)>;

/// Compares the first k of llama.cpp's `ffn_moe_argsort-L` (`[n_expert, T]` i32, descending
/// probability) with Hearth's choice, as sets: where two probabilities nearly tie, activation rounding
/// can flip an expert in a correct engine, and the note then explains a later divergence.
fn routing(trace: &LlamaTrace, sel: &Selections) -> Vec<Routing> {
    let mut out = Vec::new();
    for e in &trace.entries {
        let Some(layer) = e
            .name
            .strip_prefix("ffn_moe_argsort-")
            .and_then(|l| l.parse::<usize>().ok())
        else {
            continue;
        };
        let Some((ours, k)) = sel.get(&layer) else {
            continue;
        };
        let (ne, k) = (e.ne[0] as usize, *k);
        if ne == 0 || k == 0 || k > ne {
            continue;
        }
        let ids = trace.values(e);
        let n_tok = (ids.len() / ne).min(ours.len() / k);
        let mut flipped = Vec::new();
        for t in 0..n_tok {
            let mut a: Vec<u32> = ids[t * ne..t * ne + k].iter().map(|&x| x as u32).collect();
            let mut b = ours[t * k..(t + 1) * k].to_vec();
            a.sort_unstable();
            b.sort_unstable();
            if a != b {
                flipped.push(t);
            }
        }
        out.push(Routing {
            layer,
            tokens: n_tok,
            flipped,
        });
    }
    out
}

/// Compares Hearth's tensors with the trace, in the trace's order.
pub fn compare(trace: &LlamaTrace, ours: &[Emitted], sel: &Selections) -> Comparison {
    let mut by_name: HashMap<&str, Vec<&Emitted>> = HashMap::new();
    for e in ours {
        by_name.entry(e.name.as_str()).or_default().push(e);
    }
    let mut llama_count: HashMap<&str, usize> = HashMap::new();
    for e in &trace.entries {
        *llama_count.entry(e.name.as_str()).or_default() += 1;
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut rows = Vec::new();
    for e in &trace.entries {
        let occ = seen.entry(e.name.as_str()).or_default();
        let i = *occ;
        *occ += 1;
        if e.name.starts_with("node_") || e.dtype != "f32" {
            continue;
        }
        let (hearth_name, renamed) = match by_name.get(e.name.as_str()) {
            Some(_) => (e.name.clone(), false),
            None => match e.name.strip_prefix("ffn_moe_out-") {
                Some(l) if !llama_count.contains_key(format!("ffn_out-{l}").as_str()) => {
                    (format!("ffn_out-{l}"), true)
                }
                _ => continue,
            },
        };
        let Some(list) = by_name.get(hearth_name.as_str()) else {
            continue;
        };
        // Align occurrences from the last one.
        let n_llama = llama_count[e.name.as_str()];
        let Some(j) = (i + list.len()).checked_sub(n_llama) else {
            continue;
        };
        let h = list[j];
        let r = trace.values(e);
        let mut row = Row {
            name: e.name.clone(),
            op: e.op.clone(),
            ne: e.ne.clone(),
            hearth: renamed.then(|| hearth_name.clone()),
            max_abs_diff: f64::NAN,
            max_abs_ref: f64::NAN,
            rel: f64::NAN,
            nmse: f64::NAN,
            ok: false,
            note: None,
        };
        if r.len() != h.data.len() {
            row.note = Some(format!(
                "llama.cpp has {} values, Hearth {} ({} rows of {})",
                r.len(),
                h.data.len(),
                h.rows,
                h.cols
            ));
            rows.push(row);
            continue;
        }
        let (mut md, mut mr, mut sd, mut sr) = (0f64, 0f64, 0f64, 0f64);
        let mut non_finite = false;
        for (&a, &b) in h.data.iter().zip(&r) {
            let (a, b) = (a as f64, b as f64);
            if !a.is_finite() || !b.is_finite() {
                // Both -inf (masked logits) agree; anything else does not.
                if a != b {
                    non_finite = true;
                }
                continue;
            }
            let d = (a - b).abs();
            md = md.max(d);
            mr = mr.max(b.abs());
            sd += d * d;
            sr += b * b;
        }
        row.max_abs_diff = md;
        row.max_abs_ref = mr;
        row.rel = if mr > 0.0 {
            md / mr
        } else if md > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        row.nmse = if sr > 0.0 {
            sd / sr
        } else if sd > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        row.ok = !non_finite && row.nmse <= NMSE_THRESHOLD;
        if non_finite {
            row.note = Some("non-finite values differ".into());
        }
        rows.push(row);
    }
    let worst = rows
        .iter()
        .filter(|r| !r.nmse.is_nan())
        .max_by(|a, b| a.nmse.total_cmp(&b.nmse))
        .map(|r| (format!("{} ({})", r.name, r.op), r.nmse));
    let routing = routing(trace, sel);
    let flips: Vec<String> = routing
        .iter()
        .filter(|r| !r.flipped.is_empty())
        .map(|r| format!("layer {} tokens {:?}", r.layer, r.flipped))
        .collect();
    let after_flips = if flips.is_empty() {
        String::new()
    } else {
        format!(
            " (experts chosen differently from llama.cpp: {})",
            flips.join("; ")
        )
    };
    let first_divergence = rows.iter().find(|r| !r.ok).map(|r| match &r.note {
        Some(n) => format!("{} ({}): {n}{after_flips}", r.name, r.op),
        None => format!(
            "{} ({}): NMSE {:.3e} > {:.0e}, max |diff| {:.4e}{after_flips}",
            r.name, r.op, r.nmse, NMSE_THRESHOLD, r.max_abs_diff
        ),
    });
    Comparison {
        threshold_nmse: NMSE_THRESHOLD,
        compared: rows.len(),
        rows,
        worst,
        first_divergence,
        routing,
    }
}

/// The comparison as a table.
pub fn print_human(o: &mut String, c: &Comparison) {
    let _ = writeln!(
        o,
        "comparison with llama.cpp (NMSE threshold {:.0e})",
        c.threshold_nmse
    );
    let _ = writeln!(
        o,
        "{:<28} {:<9} {:>12} {:>12} {:>10} {:>10}",
        "tensor", "op", "max|diff|", "max|ref|", "rel", "NMSE"
    );
    for r in &c.rows {
        let name = match &r.hearth {
            Some(h) => format!("{} ={}", r.name, h),
            None => r.name.clone(),
        };
        let _ = writeln!(
            o,
            "{:<28} {:<9} {:>12.4e} {:>12.4e} {:>10.2e} {:>10.2e}{}{}",
            name,
            r.op,
            r.max_abs_diff,
            r.max_abs_ref,
            r.rel,
            r.nmse,
            if r.ok { "" } else { "  <-- DIVERGES" },
            r.note
                .as_ref()
                .map(|n| format!("  ({n})"))
                .unwrap_or_default()
        );
    }
    for r in &c.routing {
        let _ = writeln!(
            o,
            "routing layer {}: {} of {} tokens chose other experts than llama.cpp{}",
            r.layer,
            r.flipped.len(),
            r.tokens,
            if r.flipped.is_empty() {
                String::new()
            } else {
                format!(" {:?}", r.flipped)
            }
        );
    }
    if let Some((name, nmse)) = &c.worst {
        let _ = writeln!(o, "worst: {name} NMSE {nmse:.3e}");
    }
    match &c.first_divergence {
        Some(f) => {
            let _ = writeln!(o, "first divergence: {f}");
        }
        None => {
            let _ = writeln!(o, "no divergence over {} tensors", c.compared);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(entries: &[(&str, &str, &[f32])]) -> LlamaTrace {
        let mut bin = Vec::new();
        let mut out = Vec::new();
        for (name, op, vals) in entries {
            out.push(Entry {
                name: name.to_string(),
                op: op.to_string(),
                dtype: "f32".into(),
                ne: vec![vals.len() as u64, 1, 1, 1],
                offset: (bin.len() / 4) as u64,
                count: vals.len() as u64,
            });
            vals.iter()
                .for_each(|v| bin.extend_from_slice(&v.to_le_bytes()));
        }
        LlamaTrace { entries: out, bin }
    }

    fn ours(name: &str, data: &[f32]) -> Emitted {
        Emitted {
            name: name.into(),
            rows: 1,
            cols: data.len(),
            data: data.to_vec(),
        }
    }

    #[test]
    fn occurrences_align_from_the_last() {
        let t = trace(&[
            ("node_1", "GET_ROWS", &[9.0, 9.0]),
            ("Qcur-0", "MUL_MAT", &[1.0, 2.0]),
            ("Qcur-0", "ADD", &[1.5, 2.5]),
            ("Qcur-0", "RESHAPE", &[1.5, 2.5]),
            ("Qcur-0", "ROPE", &[-2.5, 1.5]),
            ("ffn_moe_out-0", "ADD", &[3.0, 4.0]),
        ]);
        let h = [
            ours("Qcur-0", &[1.5, 2.5]),
            ours("Qcur-0", &[-2.5, 1.5]),
            ours("ffn_out-0", &[3.0, 4.0]),
        ];
        let c = compare(&t, &h, &Selections::new());
        let got: Vec<_> = c
            .rows
            .iter()
            .map(|r| (r.name.as_str(), r.op.as_str(), r.ok))
            .collect();
        assert_eq!(
            got,
            [
                ("Qcur-0", "RESHAPE", true),
                ("Qcur-0", "ROPE", true),
                ("ffn_moe_out-0", "ADD", true)
            ]
        );
        assert_eq!(c.rows[2].hearth.as_deref(), Some("ffn_out-0"));
        assert!(c.first_divergence.is_none());
    }

    #[test]
    fn the_first_wrong_tensor_is_named() {
        let t = trace(&[
            ("attn_norm-0", "MUL", &[1.0, 1.0]),
            ("Kcur-0", "ROPE", &[1.0, 2.0]),
            ("l_out-0", "ADD", &[1.0]),
        ]);
        // Kcur 0.2 off in both values: NMSE 0.08 / 5 = 1.6e-2, past the threshold; l_out of another shape.
        let h = [
            ours("attn_norm-0", &[1.0, 1.0]),
            ours("Kcur-0", &[1.2, 2.2]),
            ours("l_out-0", &[1.0, 1.0]),
        ];
        let c = compare(&t, &h, &Selections::new());
        assert!(
            c.first_divergence
                .as_deref()
                .unwrap()
                .starts_with("Kcur-0 (ROPE): NMSE"),
            "{:?}",
            c.first_divergence
        );
        assert!(c.rows[2]
            .note
            .as_deref()
            .unwrap()
            .contains("llama.cpp has 1 values"));
        assert!(!c.rows[2].ok);
    }
}
