//! `hearth chat MODEL`: an interactive conversation through the model's chat template, with history.
//! `/clear` starts over and `/exit` (or end of input) quits; every other line, `/no_think` included,
//! is sent to the model as text.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use hearth_engine::{generate, ChatEncoder, GenParams, Session};
use hearth_tokenizer::template::ChatInput;
use serde_json::json;

use super::common::{chat_template, ModelArgs};
use super::sampling::SamplingArgs;

/// Arguments of `hearth chat`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message that opens the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Ask the model to think before answering (templates with `enable_thinking`, e.g. Qwen3).
    #[arg(long, conflicts_with = "no_think")]
    pub think: bool,
    /// Ask the model to answer without thinking.
    #[arg(long)]
    pub no_think: bool,
    /// Use this Jinja chat template instead of the model's.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Most tokens per reply (default: until end of generation or the context is full).
    #[arg(short = 'n', long = "n-predict")]
    pub n_predict: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Runs `hearth chat`.
pub fn run(args: Args) -> Result<()> {
    let m = args.model.load()?;
    let template = chat_template(&m, args.chat_template.as_ref())?;
    let tok = &m.tokenizer;
    let encoder = ChatEncoder::new(tok);
    let mut session = Session::new(&m.model, &m.pool, m.n_ctx, 512, m.kv_type);
    let params = GenParams {
        max_tokens: args.n_predict,
        sampler: args.sampling.config()?,
        stop: args.sampling.stop.clone(),
        constraint: None,
    };
    let mut kwargs = serde_json::Map::new();
    if args.think || args.no_think {
        kwargs.insert("enable_thinking".into(), json!(args.think));
    }
    let start: Vec<serde_json::Value> = args
        .system
        .iter()
        .map(|s| json!({"role": "system", "content": s}))
        .collect();
    let mut messages = start.clone();
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
    if interactive {
        eprintln!(
            "Chatting with {}. Type /clear to start over, /exit to quit.",
            args.model.model.display()
        );
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush().ok();
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("reading from stdin")?;
        match line.trim() {
            "/exit" => break,
            "/clear" => {
                messages = start.clone();
                session.clear();
                eprintln!("(conversation cleared)");
                continue;
            }
            "" => continue,
            _ => {}
        }
        messages.push(json!({"role": "user", "content": line}));
        let input = ChatInput {
            messages: messages.clone(),
            tools: None,
            add_generation_prompt: true,
            kwargs: kwargs.clone(),
            bos_token: tok
                .bos_id()
                .map(|id| tok.token_text(id).to_string())
                .unwrap_or_default(),
            eos_token: tok
                .eos_id()
                .map(|id| tok.token_text(id).to_string())
                .unwrap_or_default(),
        };
        let rendered = encoder
            .render(&template, &input)
            .context("rendering the chat template")?;
        let prompt = encoder.encode(tok, &rendered);
        if prompt.len() >= session.n_ctx() {
            eprintln!("error: the conversation ({} tokens) no longer fits the context of {}; /clear to start over", prompt.len(), session.n_ctx());
            messages.pop();
            continue;
        }
        let stdout = std::io::stdout();
        let g = generate(&mut session, tok, &prompt, &params, |text| {
            let mut out = stdout.lock();
            out.write_all(text.as_bytes())
                .and_then(|_| out.flush())
                .is_ok()
        })?;
        println!();
        messages.push(json!({"role": "assistant", "content": g.text}));
    }
    Ok(())
}
