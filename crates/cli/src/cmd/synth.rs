//! `hearth synth PRESET -o FILE [--layers N] [--quant Q] [--tokenizer DIR] [--seed S]`: writes a
//! random-weight GGUF of a named shape ([`preset`]) with llama-quantize's tensor types ([`layout`]),
//! loadable by Hearth and by llama.cpp.
//!
//! Weights are seeded normals with std 1/sqrt(fan_in) (untied token embeddings: 1; attn_output and
//! ffn_down a further 1/sqrt(2 n_layer), GPT-2's scaling, see [`layout`]), norm weights
//! 1 + 0.02·N(0, 1), so activations stay in range through any depth and the router spreads tokens
//! evenly over the experts. The file streams to disk ([`write`](mod@write)) with a progress bar in bytes.

mod layout;
mod preset;
mod rng;
mod vocab;
mod write;

use std::io::BufWriter;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use hearth_gguf::{GgufWriter, Value};

pub use layout::Quant;

/// Arguments of `hearth synth`.
#[derive(clap::Args)]
pub struct Args {
    /// The shape: qwen3-moe-30b-a3b, qwen3-moe-tiny, qwen3-dense-0.6b, gemma3-tiny or gemma2-tiny.
    pub preset: String,
    /// The GGUF file to write.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// Keep only the first N layers (the quant layout is chosen for N layers, as llama-quantize would).
    #[arg(long)]
    pub layers: Option<usize>,
    /// llama.cpp file type.
    #[arg(long, value_enum, default_value = "q4_k_m")]
    pub quant: Quant,
    /// A directory with a Hugging Face tokenizer.json and tokenizer_config.json (e.g.
    /// ../shared/tokenizers/qwen3); default: a small built-in byte-level BPE with ChatML specials.
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<PathBuf>,
    /// Seed of the weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Threads (default: all available cores); the file does not depend on it.
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

/// Runs `hearth synth`.
pub fn run(args: Args) -> Result<()> {
    let Some(p) = preset::preset(&args.preset) else {
        let names: Vec<_> = preset::presets().iter().map(|p| p.name).collect();
        bail!(
            "unknown preset {:?} (known: {})",
            args.preset,
            names.join(", ")
        );
    };
    let n_layer = match args.layers {
        Some(0) => bail!("--layers must be at least 1"),
        Some(n) if n > p.n_layer => bail!("--layers {n} is more than the preset's {}", p.n_layer),
        Some(n) => n,
        None => p.n_layer,
    };
    let n_threads = match args.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(t) => t,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let (tok_meta, n_vocab) = vocab::tokenizer_metadata(args.tokenizer.as_deref(), p.n_vocab)?;
    let specs = layout::plan(&p, n_layer, n_vocab, args.quant);

    let file = std::fs::File::create(&args.output)
        .with_context(|| format!("cannot create {}", args.output.display()))?;
    let mut w = GgufWriter::new(BufWriter::with_capacity(8 << 20, file));
    let a = p.arch;
    let name = match args.layers {
        Some(n) => format!("synthetic-{}-{n}l-seed{}", p.name, args.seed),
        None => format!("synthetic-{}-seed{}", p.name, args.seed),
    };
    let u = |v: usize| Value::U32(v as u32);
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.name".into(), Value::String(name)),
        (format!("{a}.block_count"), u(n_layer)),
        (format!("{a}.context_length"), u(p.n_ctx)),
        (format!("{a}.embedding_length"), u(p.n_embd)),
        (format!("{a}.feed_forward_length"), u(p.n_ff)),
        (format!("{a}.attention.head_count"), u(p.n_head)),
        (format!("{a}.attention.head_count_kv"), u(p.n_head_kv)),
        (format!("{a}.rope.freq_base"), Value::F32(p.rope_base)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(p.rms_eps),
        ),
        (format!("{a}.attention.key_length"), u(p.head_dim)),
        (format!("{a}.attention.value_length"), u(p.head_dim)),
    ];
    if let Some(w) = p.sliding_window {
        kv.push((format!("{a}.attention.sliding_window"), u(w)));
    }
    if let Some((attn, last)) = p.softcaps {
        kv.push((format!("{a}.attn_logit_softcapping"), Value::F32(attn)));
        kv.push((format!("{a}.final_logit_softcapping"), Value::F32(last)));
    }
    if let Some(e) = p.experts {
        kv.push((format!("{a}.expert_count"), u(e.count)));
        kv.push((format!("{a}.expert_used_count"), u(e.used)));
        kv.push((format!("{a}.expert_feed_forward_length"), u(e.ff)));
    }
    kv.push((
        "general.file_type".into(),
        Value::U32(args.quant.file_type()),
    ));
    kv.push(("general.quantization_version".into(), Value::U32(2)));
    for (k, v) in kv {
        w.add_kv(k, v)?;
    }
    for (k, v) in &tok_meta {
        w.add_kv(k.clone(), v.to_gguf())?;
    }
    for t in &specs {
        w.add_tensor(t.name.clone(), t.ty, &t.dims)?;
    }
    let total: u64 = w.tensors().iter().map(|t| t.n_bytes).sum();
    w.write_header()?;

    let start = Instant::now();
    let pb = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(format!("writing {}", args.output.display()));
    write::write_tensors(&mut w, &specs, args.seed, n_threads, |n| pb.inc(n))?;
    pb.finish_and_clear();
    w.finish()
        .with_context(|| format!("finishing {}", args.output.display()))?;
    let size = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .unwrap_or(0);
    eprintln!(
        "wrote {} ({} layers, {} tensors, {:.2} GB) in {:.1} s",
        args.output.display(),
        n_layer,
        specs.len(),
        size as f64 / 1e9,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
