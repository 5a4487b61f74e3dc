//! `hearth perplexity` on SmolLM2 and the fixtures' text lands within 1.5% of llama.cpp's 11.6075
//! (llama.cpp itself moves by 0.5% between its attention and KV-cache settings).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn smollm2_perplexity_matches_llama_cpp() {
    let model: PathBuf = std::env::var("HEARTH_SMOLLM2")
        .unwrap_or_else(|_| {
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
            )
            .into()
        })
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
    let reference = 11.6075;
    println!("PPL = {ppl} (llama.cpp {reference})");
    assert!(
        (ppl / reference - 1.0).abs() < 0.015,
        "PPL {ppl} is more than 1.5% from llama.cpp's {reference}"
    );
}
