//! `hearth run MODEL -p TEXT`: stream a completion of a raw prompt.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use hearth_constrain::{Constrainer, Grammar, Spec};
use hearth_engine::{generate, FinishReason, GenParams, Session};
use hearth_tokenizer::Tokenizer;

use super::common::ModelArgs;
use super::sampling::SamplingArgs;

/// Arguments of `hearth run`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (raw text; special tokens such as `<|im_start|>` are parsed).
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Most tokens to generate (default: until end of generation or the context is full).
    #[arg(short = 'n', long = "n-predict")]
    pub n_predict: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Constrain the output to one JSON value valid under the JSON Schema in FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to the GBNF grammar (llama.cpp's format, from `root`) in FILE.
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    /// Print timing figures on stderr at the end.
    #[arg(long)]
    pub verbose: bool,
}

/// Runs `hearth run`.
pub fn run(args: Args) -> Result<()> {
    let m = args.model.load()?;
    let prompt = m
        .tokenizer
        .encode_with_specials(&args.prompt, m.tokenizer.add_bos(), true);
    anyhow::ensure!(!prompt.is_empty(), "the prompt is empty");
    anyhow::ensure!(
        prompt.len() < m.n_ctx,
        "the prompt has {} tokens but the context is {} (raise --ctx)",
        prompt.len(),
        m.n_ctx
    );
    let spec = match (&args.json_schema, &args.grammar) {
        (Some(f), _) => {
            let text = read(f)?;
            let schema = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", f.display()))?;
            Some(Spec::JsonSchema(schema))
        }
        (None, Some(f)) => Some(Spec::Gbnf(read(f)?)),
        (None, None) => None,
    };
    let constraint = spec
        .map(|s| compile(&m.model, &s))
        .transpose()
        .context("the constraint cannot be used")?;
    let mut session = Session::new(&m.model, &m.pool, m.n_ctx, 512, m.kv_type);
    let params = GenParams {
        max_tokens: args.n_predict,
        sampler: args.sampling.config()?,
        stop: args.sampling.stop.clone(),
        constraint,
    };
    let stdout = std::io::stdout();
    let t0 = std::time::Instant::now();
    let g = generate(&mut session, &m.tokenizer, &prompt, &params, |text| {
        let mut out = stdout.lock();
        out.write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .is_ok()
    })
    .context("generation failed")?;
    println!();
    if args.verbose {
        let dt = t0.elapsed().as_secs_f64();
        let finish = match g.finish {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        };
        eprintln!(
            "{} prompt tokens ({} computed), {} generated in {dt:.2}s ({:.1} t/s), finish: {finish}",
            prompt.len(),
            g.n_prefilled,
            g.tokens.len(),
            g.tokens.len() as f64 / dt
        );
    }
    Ok(())
}

fn read(f: &Path) -> Result<String> {
    std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))
}

/// Compiles `spec` against the model's vocabulary.
fn compile(model: &hearth_model::Model, spec: &Spec) -> Result<Grammar> {
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf().metadata())?);
    let c = Constrainer::new(tok, model.config.n_vocab)?;
    Ok(c.compile(spec)?)
}
