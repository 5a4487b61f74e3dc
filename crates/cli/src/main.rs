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
    /// Describe a GGUF file: architecture, tokenizer, metadata, tensors and a validation verdict.
    Inspect(cmd::inspect::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => cmd::inspect::run(args),
    };
    if let Err(err) = result {
        // One line on stderr, the whole cause chain joined, and a non-zero exit.
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
