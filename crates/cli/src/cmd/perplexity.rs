//! `hearth perplexity MODEL -f FILE -c N`: llama-perplexity's method.
//!
//! The text is tokenized whole (BOS added where the model asks for it) and cut into non-overlapping
//! chunks of N tokens; when the model adds BOS, each chunk's first token is replaced by BOS; each chunk
//! is evaluated alone and only its second half is scored (every position there has at least N/2
//! tokens of context). `PPL = exp(mean NLL)`, with llama.cpp's error estimate.

use std::path::PathBuf;

use anyhow::{Context, Result};
use hearth_engine::sampler::logprob;
use hearth_model::{Batch, KvCache, Scratch};

use super::common::{progress_bar, ModelArgs};

/// Arguments of `hearth perplexity`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score.
    #[arg(short = 'f', long)]
    pub file: PathBuf,
    /// Tokens per prefill batch.
    #[arg(short = 'b', long, default_value_t = 512)]
    pub batch: usize,
}

/// Runs `hearth perplexity`.
pub fn run(args: Args) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let n_ctx = args.model.ctx.unwrap_or(512);
    anyhow::ensure!(n_ctx >= 4, "--ctx must be at least 4 for perplexity");
    let m = args.model.load()?;
    let c = &m.model.config;
    let add_bos = m.tokenizer.add_bos();
    let tokens = m.tokenizer.encode_with_specials(&text, add_bos, false);
    let n_chunk = tokens.len() / n_ctx;
    anyhow::ensure!(
        n_chunk > 0,
        "{} tokens are fewer than one chunk of {n_ctx} (lower --ctx)",
        tokens.len()
    );
    eprintln!("{} tokens, {n_chunk} chunks of {n_ctx}", tokens.len());

    let n_batch = args.batch.clamp(1, n_ctx);
    let mut scratch = Scratch::new(&m.model, n_batch);
    let mut kv = KvCache::new(1, c.n_layer, n_ctx, c.kv_dims(), m.kv_type);
    let first = n_ctx / 2;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let pb = progress_bar(n_chunk as u64, "perplexity");
    for chunk in 0..n_chunk {
        let mut toks = tokens[chunk * n_ctx..(chunk + 1) * n_ctx].to_vec();
        if add_bos {
            toks[0] = m
                .tokenizer
                .bos_id()
                .context("the model adds BOS but has no BOS id")?;
        }
        for start in (0..n_ctx).step_by(n_batch) {
            let end = (start + n_batch).min(n_ctx);
            let pos: Vec<usize> = (start..end).collect();
            let seq = vec![0; end - start];
            // Only the scored positions' logits: the LM head is most of the work on a large
            // vocabulary, and a row's logits are the same whichever rows are asked for.
            let want: Vec<bool> = pos.iter().map(|&p| p >= first && p + 1 < n_ctx).collect();
            let batch = Batch {
                tokens: &toks[start..end],
                pos: &pos,
                seq: &seq,
                logits: &want,
            };
            let out = m
                .model
                .forward(&m.pool, &mut kv, &mut scratch, &batch, None)?;
            // Scored as they come, in position order: no [n_ctx, n_vocab] buffer (268 MB for
            // Gemma3's vocabulary at -c 256).
            let scored = pos.iter().zip(&want).filter(|(_, &w)| w);
            for ((&p, _), row) in scored.zip(out.chunks_exact(c.n_vocab)) {
                let lp = -(logprob(row, toks[p + 1]) as f64);
                nll += lp;
                nll2 += lp * lp;
                count += 1;
            }
        }
        pb.inc(1);
        pb.set_message(format!("perplexity ~{:.4}", (nll / count as f64).exp()));
    }
    pb.finish_and_clear();
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let err = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    println!("PPL = {ppl:.4} +/- {err:.5}");
    Ok(())
}
