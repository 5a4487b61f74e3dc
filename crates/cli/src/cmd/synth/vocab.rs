//! The tokenizer a synthetic file carries: a small built-in byte-level BPE by default (so every file
//! is self-contained), or a Hugging Face `tokenizer.json` + `tokenizer_config.json` from `--tokenizer`.
//! Both go through `hearth_tokenizer::hf`, the same conversion as llama.cpp's `convert_hf_to_gguf.py`,
//! which pads the vocabulary to the model's size with `[PAD{i}]` tokens of type UNUSED.

use std::path::Path;

use anyhow::{Context, Result};
use hearth_tokenizer::hf::{self, HfOptions};
use hearth_tokenizer::MetaValue;
use serde_json::json;

/// ChatML, as the tiny fixtures' template.
pub const CHATML: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// The specials, after the byte tokens and merges (Qwen's order).
pub const SPECIALS: [&str; 7] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
];

/// A handful of English merges, in rank order, spelled in GPT-2's byte-to-unicode alphabet (`Ġ` is a
/// space). Each pair's parts exist by the time it is listed.
const MERGES: [(&str, &str); 40] = [
    ("Ġ", "t"),
    ("Ġ", "a"),
    ("h", "e"),
    ("i", "n"),
    ("r", "e"),
    ("o", "n"),
    ("Ġt", "he"),
    ("e", "r"),
    ("Ġ", "s"),
    ("a", "t"),
    ("Ġ", "w"),
    ("Ġ", "o"),
    ("e", "n"),
    ("Ġ", "c"),
    ("i", "s"),
    ("o", "r"),
    ("e", "s"),
    ("Ġ", "b"),
    ("a", "n"),
    ("i", "t"),
    ("Ġ", "f"),
    ("Ġ", "m"),
    ("e", "d"),
    ("Ġ", "p"),
    ("in", "g"),
    ("Ġ", "h"),
    ("Ġ", "d"),
    ("Ġ", "i"),
    ("l", "l"),
    ("o", "u"),
    ("Ġt", "o"),
    ("Ġa", "n"),
    ("Ġan", "d"),
    ("Ġo", "f"),
    ("Ġ", "l"),
    ("a", "r"),
    ("Ġi", "s"),
    ("Ġ", "e"),
    ("Ġi", "n"),
    ("Ġb", "e"),
];

/// GPT-2's `bytes_to_unicode`, in its order: printable bytes map to themselves, the rest to 256 + k.
fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + extra);
            extra += 1;
        }
    }
    cs.into_iter()
        .map(|c| char::from_u32(c).expect("valid code point"))
        .collect()
}

/// The built-in tokenizer as `tokenizer.json` and `tokenizer_config.json` texts.
pub fn builtin_json() -> (String, String) {
    let mut vocab = serde_json::Map::new();
    for (i, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    let mut merges = Vec::new();
    for (a, b) in MERGES {
        let id = vocab.len();
        vocab.insert(format!("{a}{b}"), json!(id));
        merges.push(json!([a, b]));
    }
    let first = vocab.len();
    let added: Vec<_> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"id": first + i, "content": s, "special": s.starts_with("<|"), "normalized": false}))
        .collect();
    let tokenizer = json!({
        "added_tokens": added,
        "model": {"type": "BPE", "vocab": vocab, "merges": merges},
    });
    let config = json!({
        "add_bos_token": false,
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML,
    });
    (tokenizer.to_string(), config.to_string())
}

/// Tokenizer metadata with the vocabulary padded to `n_vocab` (or the tokenizer's own size), and the
/// resulting number of tokens.
pub fn tokenizer_metadata(
    dir: Option<&Path>,
    n_vocab: Option<usize>,
) -> Result<(Vec<(String, MetaValue)>, usize)> {
    let opts = HfOptions {
        pre: "qwen2".into(),
        vocab_size: n_vocab,
    };
    let pairs = match dir {
        Some(d) => hf::convert_dir(d, &opts)
            .with_context(|| format!("converting the tokenizer in {}", d.display()))?,
        None => {
            let (t, c) = builtin_json();
            hf::convert(&t, Some(&c), None, None, &opts).context("the built-in tokenizer")?
        }
    };
    let n = pairs
        .iter()
        .find_map(|(k, v)| match (k.as_str(), v) {
            ("tokenizer.ggml.tokens", MetaValue::Strings(t)) => Some(t.len()),
            _ => None,
        })
        .context("the tokenizer has no tokens")?;
    Ok((pairs, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_tokenizer::Tokenizer;

    fn builtin(n_vocab: Option<usize>) -> (Tokenizer, usize) {
        let (pairs, n) = tokenizer_metadata(None, n_vocab).unwrap();
        (Tokenizer::from_gguf(&hf::to_metadata(&pairs)).unwrap(), n)
    }

    #[test]
    fn builtin_merges_specials_and_round_trip() {
        let (t, n) = builtin(None);
        assert_eq!(n, 256 + MERGES.len() + SPECIALS.len());
        // " the" is one token (Ġ t, h e, Ġt he), " and" too.
        assert_eq!(t.encode(" the", false).len(), 1);
        assert_eq!(t.encode(" and", false).len(), 1);
        let ids = t.encode("<|im_start|>user\nhello, wörld 🦀<|im_end|>", true);
        assert_eq!(ids[0] as usize, 256 + MERGES.len() + 1);
        assert_eq!(
            t.decode(&ids, true),
            "<|im_start|>user\nhello, wörld 🦀<|im_end|>"
        );
    }

    #[test]
    fn padded_to_the_preset_vocabulary() {
        let (pairs, n) = tokenizer_metadata(None, Some(1000)).unwrap();
        assert_eq!(n, 1000);
        let meta = hf::to_metadata(&pairs);
        let Some(hearth_gguf::Value::Array(hearth_gguf::Array::String(tokens))) =
            meta.get("tokenizer.ggml.tokens")
        else {
            panic!("tokens")
        };
        assert_eq!(tokens[999], "[PAD999]");
        assert_eq!(meta.get_str("tokenizer.ggml.pre"), Some("qwen2"));
        assert!(meta
            .get_str("tokenizer.chat_template")
            .unwrap()
            .contains("<|im_start|>"));
        assert!(
            tokenizer_metadata(None, Some(100)).is_err(),
            "a vocabulary smaller than the tokenizer"
        );
    }
}
