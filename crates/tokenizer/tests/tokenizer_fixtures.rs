//! The `prompt` field of every parity golden in ../shared/fixtures is llama.cpp's tokenization of a
//! prompt line (`\n` unescaped, specials parsed, BOS per `add_bos_token`): we must reproduce it
//! exactly, since the decoder's parity tests start from these ids.

use hearth_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/fixtures"
    ))
}

fn smollm2_path() -> PathBuf {
    match std::env::var("HEARTH_SMOLLM2") {
        Ok(p) => PathBuf::from(p),
        Err(_) => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
        )),
    }
}

fn load(path: &Path) -> Tokenizer {
    let g = hearth_gguf::Gguf::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(g.metadata()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn prompt_lines(file: &str) -> Vec<String> {
    let text = std::fs::read_to_string(fixtures().join(file)).unwrap();
    text.split('\n')
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn golden_prompts(path: &Path) -> Vec<Vec<u32>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["prompt"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

fn check(golden: &Path, model: &Path, prompts: &str) -> usize {
    let tok = load(model);
    let lines = prompt_lines(prompts);
    let want = golden_prompts(golden);
    assert_eq!(lines.len(), want.len(), "{}", golden.display());
    for (line, want) in lines.iter().zip(&want) {
        let got = tok.encode_prompt_line(line);
        assert_eq!(&got, want, "{}: prompt {line:?}", golden.display());
        // The prompt is recoverable by detokenizing it, as the fixtures README promises.
        let text = tok.decode(&got, true);
        let unescaped = line.replace("\\n", "\n");
        assert_eq!(text, unescaped, "{}: decode", golden.display());
    }
    want.len()
}

#[test]
fn every_tiny_fixture_prompt() {
    let mut n = 0;
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.starts_with("tiny-") || !name.ends_with(".golden.jsonl") {
            continue;
        }
        let (stem, prompts) = match name.strip_suffix(".long.golden.jsonl") {
            Some(stem) => (stem.to_string(), "prompts-long.txt"),
            None => (
                name.trim_end_matches(".golden.jsonl").to_string(),
                "prompts-synthetic.txt",
            ),
        };
        n += check(&path, &fixtures().join(format!("{stem}.gguf")), prompts);
    }
    assert!(n >= 40, "only {n} fixture prompts found");
}

#[test]
fn smollm2_fixture_prompts() {
    let model = smollm2_path();
    assert!(
        model.exists(),
        "SmolLM2 model missing at {} (set HEARTH_SMOLLM2 or run scripts/test, which fetches it)",
        model.display()
    );
    let golden = fixtures().join("smollm2-135m-instruct.q4_1.golden.jsonl");
    assert_eq!(check(&golden, &model, "prompts-smollm2.txt"), 5);
}
