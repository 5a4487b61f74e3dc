//! The real Qwen3 `tokenizer.json`, converted by `hearth_tokenizer::hf` as llama.cpp's converter
//! would, must give the Hugging Face `tokenizers` ids on every string of
//! testdata/tokenizer/qwen3_hf.jsonl (made by tools/gen_tokenizer_vectors.py), and decode back.
//!
//! Hugging Face always matches added tokens in the text, special ones included, so the comparison
//! is with `parse_special = true`.

use hearth_tokenizer::hf::{self, HfOptions};
use hearth_tokenizer::vocab::keys;
use hearth_tokenizer::{MetaValue, Tokenizer};
use std::path::PathBuf;

fn qwen3_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/tokenizers/qwen3"
    ))
}

fn qwen3_pairs() -> Vec<(String, MetaValue)> {
    let opts = HfOptions {
        pre: "qwen2".into(),
        // Qwen3's config.json pads the embedding to 151936 rows.
        vocab_size: Some(151_936),
    };
    hf::convert_dir(&qwen3_dir(), &opts).unwrap()
}

fn vectors() -> Vec<(String, Vec<u32>)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/tokenizer/qwen3_hf.jsonl"
    );
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .skip(1) // the {"meta": ..} header
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let s = v["s"].as_str().unwrap().to_string();
            let ids = v["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            (s, ids)
        })
        .collect()
}

#[test]
fn qwen3_matches_hugging_face() {
    let pairs = qwen3_pairs();
    let tok = Tokenizer::from_pairs(&pairs).unwrap();
    assert_eq!(tok.vocab_size(), 151_936);
    let cases = vectors();
    assert!(cases.len() >= 2000, "only {} vectors", cases.len());
    let mut failures = Vec::new();
    for (s, want) in &cases {
        let got = tok.encode(s, true);
        if &got != want {
            failures.push(format!("{s:?}\n   want {want:?}\n    got {got:?}"));
            continue;
        }
        let back = tok.decode(&got, true);
        if &back != s {
            failures.push(format!("{s:?}: decodes to {back:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} strings differ:\n{}",
        failures.len(),
        cases.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

#[test]
fn qwen3_conversion_metadata() {
    let pairs = qwen3_pairs();
    let tok = Tokenizer::from_pairs(&pairs).unwrap();
    // tokenizer_config.json: eos "<|im_end|>", pad "<|endoftext|>", no BOS, add_bos_token false.
    assert_eq!(tok.eos_id(), tok.token_id("<|im_end|>"));
    assert_eq!(tok.pad_id(), tok.token_id("<|endoftext|>"));
    assert!(!tok.add_bos());
    assert_eq!(tok.token_text(151_935), "[PAD151935]");
    assert!(tok.is_eog(151_645) && tok.is_eog(151_643));
    assert!(!tok.is_eog(151_644));
    // <think> is an added non-special token: user-defined, rendered as text even without specials.
    let think = tok.token_id("<think>").unwrap();
    assert_eq!(tok.token_to_piece(think, false), b"<think>");
    assert!(tok.token_to_piece(151_645, false).is_empty());
    let template = pairs.iter().find(|(k, _)| k == keys::CHAT_TEMPLATE);
    assert!(matches!(template, Some((_, MetaValue::Str(t))) if t.contains("<|im_start|>")));
    // The same pairs as GGUF metadata give the same tokenizer.
    let meta = hf::to_metadata(&pairs);
    let tok2 = Tokenizer::from_gguf(&meta).unwrap();
    assert_eq!(
        tok2.encode("Hello <|im_end|> world", true),
        tok.encode("Hello <|im_end|> world", true)
    );
}
