//! llama.cpp's own `llama_tokenize` on varied strings (code, CJK, emoji, whitespace runs, digits,
//! contractions, special-token look-alikes...) for every GGUF vocabulary we have, with
//! `add_special` and `parse_special` varied per string. Vectors from tools/gen_tokenizer_vectors.py
//! `--llama-cpp` (strings by index into qwen3_hf.jsonl).

use hearth_tokenizer::Tokenizer;
use std::path::PathBuf;

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/tokenizer")).join(name)
}

fn shared(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/")).join(rel)
}

fn strings() -> Vec<String> {
    std::fs::read_to_string(testdata("qwen3_hf.jsonl"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["s"].as_str().unwrap().to_string()
        })
        .collect()
}

fn check(name: &str, model: PathBuf) {
    assert!(
        model.exists(),
        "{} missing (SmolLM2: set HEARTH_SMOLLM2 or run scripts/test, which fetches it)",
        model.display()
    );
    let tok = Tokenizer::open(&model).unwrap_or_else(|e| panic!("{name}: {e}"));
    let strings = strings();
    let text = std::fs::read_to_string(testdata(&format!("llamacpp_{name}.jsonl"))).unwrap();
    let mut failures = Vec::new();
    let mut n = 0;
    for line in text.lines().skip(1) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let s = &strings[v["i"].as_u64().unwrap() as usize];
        let add = v["add_special"].as_bool().unwrap();
        let parse = v["parse_special"].as_bool().unwrap();
        let want: Vec<u32> = v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode_with_specials(s, add, parse);
        if got != want {
            failures.push(format!(
                "{s:?} (add_special {add}, parse_special {parse})\n   want {want:?}\n    got {got:?}"
            ));
        }
        n += 1;
    }
    assert!(n >= 400, "{name}: only {n} vectors");
    assert!(
        failures.is_empty(),
        "{name}: {} of {n} differ:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

fn vocab(name: &str) -> PathBuf {
    shared(&format!(
        "tokenizers/llama.cpp-vocab/ggml-vocab-{name}.gguf"
    ))
}

#[test]
fn qwen2() {
    check("qwen2", vocab("qwen2"));
}

#[test]
fn llama_bpe() {
    check("llama-bpe", vocab("llama-bpe"));
}

#[test]
fn gpt_2() {
    check("gpt-2", vocab("gpt-2"));
}

#[test]
fn deepseek_coder() {
    check("deepseek-coder", vocab("deepseek-coder"));
}

#[test]
fn llama_spm() {
    check("llama-spm", vocab("llama-spm"));
}

#[test]
fn phi_3() {
    check("phi-3", vocab("phi-3"));
}

#[test]
fn tiny_qwen3() {
    check("tiny-qwen3", shared("fixtures/tiny-qwen3.q4_0.gguf"));
}

#[test]
fn smollm2() {
    let path = match std::env::var("HEARTH_SMOLLM2") {
        Ok(p) => PathBuf::from(p),
        Err(_) => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
        )),
    };
    check("smollm2", path);
}
