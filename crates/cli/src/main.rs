//! The `hearth` command-line tool: a thin layer of argument parsing over the library crates.
//! `anyhow` lives here and only here; the libraries return typed errors.

use clap::{Parser, Subcommand};

mod cmd;

/// Run GGUF language models on CPUs.
#[derive(Parser)]
#[command(name = "hearth", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Complete a prompt, streaming the text.
    Run(cmd::run::Args),
    /// Chat interactively through the model's chat template.
    Chat(cmd::chat::Args),
    /// Serve the model over OpenAI, Anthropic and Ollama HTTP APIs.
    Serve(cmd::serve::Args),
    /// Measure prefill and decode speed as llama-bench does.
    Bench(cmd::bench::Args),
    /// Print the parity report (top logits, greedy continuation) for prompt lines read on stdin.
    Logits(cmd::logits::Args),
    /// Measure perplexity on a text file, as llama-perplexity does.
    Perplexity(cmd::perplexity::Args),
    /// One forward pass with per-layer statistics; compare with a llama.cpp trace.
    Trace(cmd::trace::Args),
    /// Write a random-weight GGUF of a named shape.
    Synth(cmd::synth::Args),
    /// Describe a GGUF file: architecture, tokenizer, metadata, tensors and a validation verdict.
    Inspect(cmd::inspect::Args),
    /// Internal: a chat-template render worker (see `hearth_tokenizer::template::isolated`).
    #[command(name = "render-worker", hide = true)]
    RenderWorker,
}

fn main() {
    // Failpoints from FAILPOINTS (a no-op unless built with them, see the `failpoints` feature).
    let _failpoints = std::env::var_os("FAILPOINTS").map(|_| fail::FailScenario::setup());
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => cmd::run::run(args),
        Command::Chat(args) => cmd::chat::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Logits(args) => cmd::logits::run(args),
        Command::Perplexity(args) => cmd::perplexity::run(args),
        Command::Trace(args) => cmd::trace::run(args),
        Command::Synth(args) => cmd::synth::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::RenderWorker => {
            std::process::exit(hearth_tokenizer::template::isolated::worker_main())
        }
    };
    if let Err(err) = result {
        // One line on stderr, the whole cause chain joined, and a non-zero exit.
        eprintln!("error: {}", format!("{err:#}").replace('\n', " "));
        std::process::exit(1);
    }
}
