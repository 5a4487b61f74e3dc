//! `hearth perplexity` on the fixtures' text with `-c 256` lands within 1.5% of llama.cpp's PPL on the
//! real models: SmolLM2 (11.6075) and Gemma3-270M (8.6666). llama.cpp itself moves by 0.5% (SmolLM2)
//! and 0.7% (Gemma3) between its attention and KV-cache settings.

use std::path::PathBuf;
use std::process::Command;

fn perplexity(var: &str, file: &str, reference: f64) {
    let model: PathBuf = std::env::var(var)
        .unwrap_or_else(|_| format!("{}/../../.cache/models/{file}", env!("CARGO_MANIFEST_DIR")))
        .into();
    assert!(
        model.exists(),
        "{} is missing: run scripts/test, which fetches it",
        model.display()
    );
    let text = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/fixtures/ppl-text.txt"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["perplexity", "-c", "256", "-t", "2", "-f", text])
        .arg(&model)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ppl: f64 = stdout
        .trim()
        .strip_prefix("PPL = ")
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output: {stdout}"));
    println!("{file}: PPL = {ppl} (llama.cpp {reference})");
    assert!(
        (ppl / reference - 1.0).abs() < 0.015,
        "PPL {ppl} is more than 1.5% from llama.cpp's {reference}"
    );
}

#[test]
fn smollm2_perplexity_matches_llama_cpp() {
    perplexity("HEARTH_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf", 11.6075);
}

#[test]
fn gemma3_perplexity_matches_llama_cpp() {
    perplexity("HEARTH_GEMMA3", "gemma-3-270m-q4_k_m.gguf", 8.6666);
}
