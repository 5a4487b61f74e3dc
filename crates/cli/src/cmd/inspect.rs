//! `hearth inspect FILE [--json]`: describe a GGUF file without reading its tensor data.
//!
//! Opening maps the file and parses only the header (metadata and tensor index), which
//! [`hearth_gguf::Gguf`] validates in full, so this is instant on an 18 GB model and an invalid file is
//! reported as one error line. The JSON form (`--json`) is what the acceptance tests compare against the
//! `gguf` Python package: tensor `type` as gguf spells it, `shape` in ggml order (ne0 first) and `offset`
//! as an absolute file offset.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Context as _;
use hearth_gguf::{Array, GgmlType, Gguf, GgufError, Metadata, Value};
use serde_json::{json, Map, Value as Json};

/// Arrays longer than this are summarised (type, length and the first elements).
const ARRAY_HEAD: usize = 16;

/// Hyperparameters shown in the report, as suffixes of `{arch}.`.
const ARCH_KEYS: &[&str] = &[
    "vocab_size",
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.layer_norm_epsilon",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_feed_forward_length",
    "expert_weights_norm",
];

/// Arguments of `hearth inspect`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to describe.
    pub file: std::path::PathBuf,
    /// Print one JSON object instead of the human-readable report.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hearth inspect`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let g = Gguf::open(&args.file).map_err(|e| match e {
        // The open error already names the file.
        GgufError::Open { .. } => anyhow::Error::new(e),
        e => anyhow::Error::new(e).context(format!("invalid GGUF file {}", args.file.display())),
    })?;
    let out = if args.json {
        serde_json::to_string_pretty(&to_json(&g)).context("serialising the report")? + "\n"
    } else {
        report(&g, &args.file.display().to_string())
    };
    // A closed pipe (`hearth inspect x | head`) is not an error worth a panic.
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

/// Per-type tensor counts and bytes, in type-id order.
fn totals(g: &Gguf) -> BTreeMap<GgmlType, (usize, u64)> {
    let mut m = BTreeMap::new();
    for t in g.tensors() {
        let e = m.entry(t.ty).or_insert((0usize, 0u64));
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    m
}

fn unsupported(g: &Gguf) -> Vec<GgmlType> {
    totals(g)
        .into_keys()
        .filter(|t| !t.is_supported())
        .collect()
}

// ---------------------------------------------------------------------------------------------------
// JSON

/// The whole report as one JSON object.
pub fn to_json(g: &Gguf) -> Json {
    let metadata: Map<String, Json> = g
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_owned(), value_json(v)))
        .collect();
    let tensors: Vec<Json> = g
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "shape": t.dims,
                "offset": t.abs_offset(g.data_offset()),
                "bytes": t.n_bytes,
            })
        })
        .collect();
    let totals: Map<String, Json> = totals(g)
        .into_iter()
        .map(|(ty, (n, bytes))| (ty.name().to_owned(), json!({"count": n, "bytes": bytes})))
        .collect();
    let unsupported: Vec<&str> = unsupported(g).iter().map(|t| t.name()).collect();
    json!({
        "version": g.version(),
        "alignment": g.alignment(),
        "data_offset": g.data_offset(),
        "file_size": g.bytes().len(),
        "valid": true,
        "supported_for_compute": unsupported.is_empty(),
        "unsupported_types": unsupported,
        "architecture": g.metadata().get_str("general.architecture"),
        "metadata": metadata,
        "tensors": tensors,
        "totals": totals,
    })
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        // Widened exactly; NaN and infinities have no JSON form and become null.
        Value::F32(x) => json!(f64::from(*x)),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => array_json(a),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x),
    }
}

/// A short array in full; a long one as `{"type", "len", "head"}` with the first [`ARRAY_HEAD`] elements.
fn array_json(a: &Array) -> Json {
    let n = a.len().min(ARRAY_HEAD);
    let head: Vec<Json> = (0..n)
        .filter_map(|i| a.get(i))
        .map(|v| value_json(&v))
        .collect();
    if a.len() <= ARRAY_HEAD {
        Json::Array(head)
    } else {
        json!({"type": a.type_name(), "len": a.len(), "head": head})
    }
}

// ---------------------------------------------------------------------------------------------------
// Human-readable report

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{x:.2} {}", UNITS[u])
    }
}

/// A scalar for the report; strings quoted and escaped, long ones cut.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => {
            const MAX: usize = 72;
            if s.chars().count() > MAX {
                let cut: String = s.chars().take(MAX).collect();
                format!("{cut:?}… ({} bytes)", s.len())
            } else {
                format!("{s:?}")
            }
        }
        Value::Array(a) => array_summary(a),
        Value::F32(x) => format!("{x}"),
        Value::F64(x) => format!("{x}"),
        other => json_scalar(other),
    }
}

fn json_scalar(v: &Value) -> String {
    value_json(v).to_string()
}

fn array_summary(a: &Array) -> String {
    let n = a
        .len()
        .min(if a.len() > ARRAY_HEAD { 8 } else { ARRAY_HEAD });
    let items: Vec<String> = (0..n)
        .filter_map(|i| a.get(i))
        .map(|v| scalar(&v))
        .collect();
    let more = if a.len() > n { ", …" } else { "" };
    format!(
        "[{}; {}] [{}{more}]",
        a.type_name(),
        a.len(),
        items.join(", ")
    )
}

fn report(g: &Gguf, path: &str) -> String {
    let md = g.metadata();
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "{path}: GGUF v{}, {}",
        g.version(),
        human_bytes(g.bytes().len() as u64)
    );
    let _ = writeln!(
        w,
        "  {} metadata entries, {} tensors, alignment {}, data at offset {}",
        md.len(),
        g.tensors().len(),
        g.alignment(),
        g.data_offset()
    );

    let arch = md.get_str("general.architecture");
    let _ = writeln!(w, "\nModel");
    let _ = writeln!(
        w,
        "  {:<40} {}",
        "architecture",
        arch.unwrap_or("(missing general.architecture)")
    );
    for key in [
        "general.name",
        "general.file_type",
        "general.quantization_version",
    ] {
        if let Some(v) = md.get(key) {
            let _ = writeln!(
                w,
                "  {:<40} {}",
                key.trim_start_matches("general."),
                scalar(v)
            );
        }
    }
    if let Some(arch) = arch {
        for k in ARCH_KEYS {
            if let Some(v) = md.get(&format!("{arch}.{k}")) {
                let _ = writeln!(w, "  {k:<40} {}", scalar(v));
            }
        }
    }

    tokenizer_section(w, md);

    let _ = writeln!(w, "\nMetadata ({} entries)", md.len());
    for (k, v) in md.iter() {
        let _ = writeln!(w, "  {k:<48} {:<7} {}", v.type_name(), scalar(v));
    }

    let _ = writeln!(w, "\nTensors ({})", g.tensors().len());
    let name_w = g
        .tensors()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        w,
        "  {:<name_w$}  {:<7}  {:<24}  {:>12}  {:>12}",
        "name", "type", "shape (ne0 first)", "offset", "bytes"
    );
    for t in g.tensors() {
        let shape = format!("{:?}", t.dims);
        let _ = writeln!(
            w,
            "  {:<name_w$}  {:<7}  {shape:<24}  {:>12}  {:>12}",
            t.name,
            t.ty.name(),
            t.abs_offset(g.data_offset()),
            t.n_bytes
        );
    }

    let _ = writeln!(w, "\nTotals by type");
    let mut all = (0usize, 0u64);
    for (ty, (n, bytes)) in totals(g) {
        let mark = if ty.is_supported() {
            ""
        } else {
            "  (not supported for compute)"
        };
        let _ = writeln!(
            w,
            "  {:<7} {n:>6} tensors  {:>12}{mark}",
            ty.name(),
            human_bytes(bytes)
        );
        all = (all.0 + n, all.1 + bytes);
    }
    let _ = writeln!(
        w,
        "  {:<7} {:>6} tensors  {:>12}",
        "total",
        all.0,
        human_bytes(all.1)
    );

    let unsupported = unsupported(g);
    let verdict = if g.tensors().is_empty() {
        "no tensors (a vocabulary-only file)".to_owned()
    } else if unsupported.is_empty() {
        "every tensor type is supported for compute".to_owned()
    } else {
        let names: Vec<&str> = unsupported.iter().map(|t| t.name()).collect();
        format!(
            "tensor types not supported for compute: {}",
            names.join(", ")
        )
    };
    let _ = writeln!(w, "\nValidation: structure OK; {verdict}");
    s
}

fn tokenizer_section(w: &mut String, md: &Metadata) {
    let _ = writeln!(w, "\nTokenizer");
    let model = md.get_str("tokenizer.ggml.model");
    let _ = writeln!(w, "  {:<40} {}", "model", model.unwrap_or("(none)"));
    if let Some(pre) = md.get_str("tokenizer.ggml.pre") {
        let _ = writeln!(w, "  {:<40} {pre}", "pre");
    }
    if let Some(tokens) = md.get_array("tokenizer.ggml.tokens") {
        let _ = writeln!(w, "  {:<40} {}", "vocab size", tokens.len());
    }
    if let Some(merges) = md.get_array("tokenizer.ggml.merges") {
        let _ = writeln!(w, "  {:<40} {}", "merges", merges.len());
    }
    for (label, key) in [
        ("bos id", "tokenizer.ggml.bos_token_id"),
        ("eos id", "tokenizer.ggml.eos_token_id"),
        ("eot id", "tokenizer.ggml.eot_token_id"),
        ("pad id", "tokenizer.ggml.padding_token_id"),
        ("unk id", "tokenizer.ggml.unknown_token_id"),
        ("add bos", "tokenizer.ggml.add_bos_token"),
        ("add eos", "tokenizer.ggml.add_eos_token"),
    ] {
        if let Some(v) = md.get(key) {
            let token = v
                .as_u64()
                .and_then(|id| {
                    md.get_array("tokenizer.ggml.tokens")?
                        .as_strings()?
                        .get(id as usize)
                        .map(|t| format!(" {t:?}"))
                })
                .unwrap_or_default();
            let _ = writeln!(w, "  {label:<40} {}{token}", json_scalar(v));
        }
    }
    let template = match md.get_str("tokenizer.chat_template") {
        Some(t) => format!("yes ({} bytes)", t.len()),
        None => "no".to_owned(),
    };
    let _ = writeln!(w, "  {:<40} {template}", "chat template");
}
