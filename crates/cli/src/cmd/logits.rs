//! `hearth logits MODEL [--all] [--gen N]`: the parity report, one JSON line per prompt line on stdin.
//!
//! Prompt lines follow the fixtures' convention: the two characters `\n` become a newline, special
//! tokens are parsed, BOS is added where the model asks for it.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use hearth_engine::logits_report;
use hearth_model::Scratch;

use super::common::ModelArgs;

/// Arguments of `hearth logits`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Also print the top-5 logits after every prompt position (`top_per_pos`).
    #[arg(long)]
    pub all: bool,
    /// Greedy tokens to generate after each prompt (end-of-generation tokens do not stop it).
    #[arg(long, default_value_t = 16)]
    pub gen: usize,
    /// Tokens per prefill batch.
    #[arg(short = 'b', long, default_value_t = 512)]
    pub batch: usize,
}

/// Runs `hearth logits`.
pub fn run(args: Args) -> Result<()> {
    let m = args.model.load()?;
    let mut scratch = Scratch::new(&m.model, args.batch.max(1));
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.context("reading prompts from stdin")?;
        if line.is_empty() {
            continue;
        }
        let prompt = m.tokenizer.encode_prompt_line(&line);
        let r = logits_report(
            &m.model,
            &m.pool,
            &mut scratch,
            m.kv_type,
            &prompt,
            args.all,
            args.gen,
        )
        .with_context(|| format!("prompt {}", i + 1))?;
        writeln!(out, "{}", serde_json::to_string(&r)?)?;
        out.flush()?;
    }
    Ok(())
}
