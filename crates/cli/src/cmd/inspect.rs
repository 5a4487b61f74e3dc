//! `hearth inspect FILE [--json]`.

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
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
