//! llama.cpp's own tokenizer vectors (`tests/test-tokenizer-0.cpp`): every `.inp` string must
//! tokenize to the ids of the `.out` line, with `add_special = false`, `parse_special = false`.

use hearth_tokenizer::Tokenizer;
use std::path::PathBuf;

fn vocab_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/tokenizers/llama.cpp-vocab"
    ))
}

fn load(name: &str) -> Tokenizer {
    let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    let g = hearth_gguf::Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(g.metadata()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The cases as test-tokenizer-0.cpp reads them: inputs split on "\n__ggml_vocab_test__\n".
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let base = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut sinp = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            None => {
                sinp.push(inp[pos..].to_string());
                break;
            }
            Some(rel) => {
                sinp.push(inp[pos..pos + rel].to_string());
                pos += rel + sep.len();
            }
        }
    }
    let sout: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        sinp.len(),
        sout.len(),
        "{name}: .inp and .out disagree in length"
    );
    sinp.into_iter().zip(sout).collect()
}

fn check(name: &str) {
    let tok = load(name);
    let mut failures = Vec::new();
    let cases = cases(name);
    for (text, want) in &cases {
        let got = tok.encode(text, false);
        if &got != want {
            failures.push(format!("{text:?}\n   want {want:?}\n    got {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn qwen2() {
    check("qwen2");
}

#[test]
fn llama_bpe() {
    check("llama-bpe");
}

#[test]
fn gpt_2() {
    check("gpt-2");
}

#[test]
fn deepseek_coder() {
    check("deepseek-coder");
}

#[test]
fn llama_spm() {
    check("llama-spm");
}

#[test]
fn phi_3() {
    check("phi-3");
}
