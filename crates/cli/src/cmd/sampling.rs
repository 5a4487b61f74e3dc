//! Sampling flags shared by `run` and `chat`.

use anyhow::Result;
use hearth_engine::SamplerConfig;

/// Sampling flags (llama.cpp's defaults).
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature (0 = greedy).
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty over the last 64 tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Random seed (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// A string that ends generation (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    /// The sampler configuration, validated.
    pub fn config(&self) -> Result<SamplerConfig> {
        anyhow::ensure!(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "--temp must be a number >= 0"
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.top_p),
            "--top-p must be between 0 and 1"
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.min_p),
            "--min-p must be between 0 and 1"
        );
        anyhow::ensure!(
            self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0,
            "--repeat-penalty must be > 0"
        );
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Ok(SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            seed,
            ..SamplerConfig::default()
        })
    }
}
