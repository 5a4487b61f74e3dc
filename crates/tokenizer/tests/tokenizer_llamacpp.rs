//! llama.cpp's own `llama_tokenize` on varied strings (code, CJK, emoji, whitespace runs, digits,
//! contractions, special-token look-alikes...) for every GGUF vocabulary we have, with
//! `add_special` and `parse_special` varied per string. Vectors from tools/gen_tokenizer_vectors.py
//! `--llama-cpp` (strings by index into qwen3_hf.jsonl). Each file also carries llama.cpp's
//! `llama_detokenize` of the ids, and its view of the vocabulary: special ids, flags, the
//! end-of-generation set and hashes of every token's attributes and pieces.

use hearth_tokenizer::{Tokenizer, VocabSpec};
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

/// FNV-1a 64, as the oracle computes it.
fn fnv(h: u64, data: &[u8]) -> u64 {
    data.iter().fold(h, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(1_099_511_628_211)
    })
}
const FNV_INIT: u64 = 14_695_981_039_346_656_037;

fn id_or_none(v: &serde_json::Value) -> Option<u32> {
    v.as_i64().filter(|&x| x >= 0).map(|x| x as u32)
}

fn check_info(name: &str, tok: &Tokenizer, info: &serde_json::Value) {
    assert_eq!(
        tok.vocab_size() as u64,
        info["n_tokens"].as_u64().unwrap(),
        "{name}"
    );
    assert_eq!(tok.bos_id(), id_or_none(&info["bos"]), "{name}: bos");
    assert_eq!(tok.eos_id(), id_or_none(&info["eos"]), "{name}: eos");
    assert_eq!(tok.pad_id(), id_or_none(&info["pad"]), "{name}: pad");
    assert_eq!(
        tok.add_bos(),
        info["add_bos"].as_bool().unwrap(),
        "{name}: add_bos"
    );
    assert_eq!(
        tok.add_eos(),
        info["add_eos"].as_bool().unwrap(),
        "{name}: add_eos"
    );
    // llama.cpp picks the EOT token by walking a hash map; where several tokens qualify
    // ("<|endoftext|>" and "<|im_end|>"), any of them is its answer.
    let eot_texts = [
        "<|endoftext|>",
        "<|im_end|>",
        "<|eot_id|>",
        "<|end|>",
        "<|end_of_text|>",
    ];
    match (tok.eot_id(), id_or_none(&info["eot"])) {
        (a, b) if a == b => {}
        (Some(a), Some(b)) => assert!(
            eot_texts.contains(&tok.token_text(a)) && eot_texts.contains(&tok.token_text(b)),
            "{name}: eot {a} vs llama.cpp {b}"
        ),
        (a, b) => panic!("{name}: eot {a:?} vs llama.cpp {b:?}"),
    }
    let eog: Vec<u32> = info["eog"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(
        tok.eog_ids().collect::<Vec<_>>(),
        eog,
        "{name}: end-of-generation ids"
    );
    let n = tok.vocab_size() as u32;
    let attrs = (0..n).fold(FNV_INIT, |h, id| fnv(h, &tok.token_attr(id).to_le_bytes()));
    assert_eq!(
        format!("{attrs:016x}"),
        info["attr_fnv"].as_str().unwrap(),
        "{name}: attributes"
    );
    for (special, key) in [(true, "piece_special_fnv"), (false, "piece_plain_fnv")] {
        let h = (0..n).fold(FNV_INIT, |h, id| {
            let p = tok.token_to_piece(id, special);
            fnv(fnv(h, &(p.len() as u32).to_le_bytes()), p)
        });
        assert_eq!(
            format!("{h:016x}"),
            info[key].as_str().unwrap(),
            "{name}: {key}"
        );
    }
}

fn check(name: &str, model: PathBuf) {
    assert!(
        model.exists(),
        "{} missing (SmolLM2: set HEARTH_SMOLLM2 or run scripts/test, which fetches it)",
        model.display()
    );
    let tok = Tokenizer::open(&model).unwrap_or_else(|e| panic!("{name}: {e}"));
    check_tokenizer(name, &tok, 400);
}

fn check_tokenizer(name: &str, tok: &Tokenizer, min_cases: usize) {
    let strings = strings();
    let text = std::fs::read_to_string(testdata(&format!("llamacpp_{name}.jsonl"))).unwrap();
    let header: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    check_info(name, tok, &header["meta"]["info"]);
    let mut failures = Vec::new();
    let mut n = 0;
    for line in text.lines().skip(1) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        // By index into the shared strings, or written out (the Gemma-specific ones).
        let s = match v.get("s") {
            Some(s) => s.as_str().unwrap(),
            None => strings[v["i"].as_u64().unwrap() as usize].as_str(),
        };
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
        // llama_detokenize(ids, remove_special = false, unparse_special = parse_special).
        let want_text: Vec<u8> = match (v.get("detok"), v.get("detok_hex")) {
            (Some(d), _) => d.as_str().unwrap().as_bytes().to_vec(),
            (None, Some(h)) => {
                let h = h.as_str().unwrap();
                (0..h.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
                    .collect()
            }
            (None, None) => s.as_bytes().to_vec(),
        };
        let got_text = tok.decode_bytes(&want, parse);
        if got_text != want_text {
            failures.push(format!(
                "decode of {s:?}\n   want {:?}\n    got {:?}",
                String::from_utf8_lossy(&want_text),
                String::from_utf8_lossy(&got_text)
            ));
        }
        n += 1;
    }
    assert!(n >= min_cases, "{name}: only {n} vectors");
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

/// Gemma3-270M's SentencePiece vocabulary of 262,144 tokens (user-defined runs of newlines, tabs and
/// spaces; thousands of control tokens), with Gemma's own strings after the shared ones.
#[test]
fn gemma3() {
    let path = match std::env::var("HEARTH_GEMMA3") {
        Ok(p) => PathBuf::from(p),
        Err(_) => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../.cache/models/gemma-3-270m-q4_k_m.gguf"
        )),
    };
    assert!(
        path.exists(),
        "{} missing (set HEARTH_GEMMA3 or run scripts/test, which fetches it)",
        path.display()
    );
    let tok = Tokenizer::open(&path).unwrap();
    check_tokenizer("gemma3", &tok, 500);
}

/// Pre-tokenizers without a vocabulary of their own: the qwen2 vocabulary with another
/// `tokenizer.ggml.pre`, as the generator made them with gguf-new-metadata.
#[test]
fn other_pre_tokenizers_on_the_qwen2_vocabulary() {
    let g = hearth_gguf::Gguf::open(vocab("qwen2")).unwrap();
    let base = VocabSpec::from_gguf(g.metadata()).unwrap();
    let mut n = 0;
    let mut failed = Vec::new();
    for entry in std::fs::read_dir(testdata("")).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().to_string();
        let Some(pre) = file
            .strip_prefix("llamacpp_pre-")
            .and_then(|f| f.strip_suffix(".jsonl"))
        else {
            continue;
        };
        let spec = VocabSpec {
            pre: Some(pre.to_string()),
            ..base.clone()
        };
        let tok = Tokenizer::from_spec(spec).unwrap_or_else(|e| panic!("{pre}: {e}"));
        let name = format!("pre-{pre}");
        if std::panic::catch_unwind(|| check_tokenizer(&name, &tok, 100)).is_err() {
            failed.push(name);
        }
        n += 1;
    }
    assert!(n >= 20, "only {n} pre-tokenizer files");
    assert!(failed.is_empty(), "pre-tokenizers that differ: {failed:?}");
}
