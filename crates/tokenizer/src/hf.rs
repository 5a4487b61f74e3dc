//! Convert a Hugging Face `tokenizer.json` (+ `tokenizer_config.json`, optionally `config.json`) into
//! `tokenizer.ggml.*` metadata, the way llama.cpp's `convert_hf_to_gguf.py` does for byte-level BPE
//! models such as Qwen2 / Qwen3 (`_set_vocab_gpt2`, `get_vocab_base`, gguf-py's `SpecialVocab`):
//!
//! - `tokenizer.ggml.model = gpt2`, `tokenizer.ggml.pre` as given (Qwen2/3: `qwen2`);
//! - tokens in id order, the model's vocabulary and the added tokens together; ids below the padded
//!   vocabulary size that nothing uses become `[PAD{i}]` of type UNUSED;
//! - token types: added tokens that are special (or look special: `<|...|>`) are CONTROL, other added
//!   tokens USER_DEFINED (with `▁` turned back into spaces), everything else NORMAL; added tokens are
//!   taken verbatim (the converter round-trips non-normalized ones through the tokenizer, which is
//!   the identity for byte-level BPE vocabularies such as Qwen's);
//! - merges as `"a b"` strings, in rank order;
//! - BOS / EOS / UNK / SEP / PAD ids from `tokenizer_config.json`'s `*_token` entries (matched
//!   against the added tokens), then `config.json`'s `*_token_id` for those still unset;
//!   `add_bos_token` / `add_eos_token` flags; `tokenizer.chat_template` (a `chat_template.jinja` file
//!   beside them wins over the config's field, as in gguf-py).

use crate::error::TokenizerError;
use crate::vocab::TOKEN_TYPE_USER_DEFINED;
use crate::vocab::{keys, MetaValue, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;

/// Options of the conversion.
#[derive(Clone, Debug)]
pub struct HfOptions {
    /// `tokenizer.ggml.pre` to write (llama.cpp detects it by hashing the tokenizer's output; we are
    /// told). Qwen2 and Qwen3 use `qwen2`.
    pub pre: String,
    /// Pad the vocabulary to this many entries (the model's `vocab_size`); `None` takes
    /// `config.json`'s `vocab_size` when given, else the tokenizer's own size.
    pub vocab_size: Option<usize>,
}

impl Default for HfOptions {
    fn default() -> HfOptions {
        HfOptions {
            pre: "qwen2".to_string(),
            vocab_size: None,
        }
    }
}

fn err(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::Hf(msg.into())
}

fn read(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn read_opt(path: &Path) -> Result<Option<String>, TokenizerError> {
    if path.exists() {
        read(path).map(Some)
    } else {
        Ok(None)
    }
}

/// Convert the tokenizer files in `dir` (`tokenizer.json` required; `tokenizer_config.json`,
/// `config.json` and `chat_template.jinja` used when present).
pub fn convert_dir(
    dir: &Path,
    opts: &HfOptions,
) -> Result<Vec<(String, MetaValue)>, TokenizerError> {
    let tokenizer = read(&dir.join("tokenizer.json"))?;
    let config = read_opt(&dir.join("tokenizer_config.json"))?;
    let model_config = read_opt(&dir.join("config.json"))?;
    let template = read_opt(&dir.join("chat_template.jinja"))?;
    convert(
        &tokenizer,
        config.as_deref(),
        model_config.as_deref(),
        template.as_deref(),
        opts,
    )
}

fn parse(text: &str, what: &str) -> Result<Json, TokenizerError> {
    serde_json::from_str(text).map_err(|e| err(format!("{what}: {e}")))
}

/// llama.cpp's `does_token_look_special`: added tokens that ought to be control tokens even when
/// not marked special.
fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<｜") && t.ends_with("｜>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// Convert file contents: `tokenizer.json`, and optionally `tokenizer_config.json`, the model's
/// `config.json` and a `chat_template.jinja`.
pub fn convert(
    tokenizer_json: &str,
    tokenizer_config_json: Option<&str>,
    config_json: Option<&str>,
    chat_template_file: Option<&str>,
    opts: &HfOptions,
) -> Result<Vec<(String, MetaValue)>, TokenizerError> {
    let tj = parse(tokenizer_json, "tokenizer.json")?;
    let tc = match tokenizer_config_json {
        Some(t) => parse(t, "tokenizer_config.json")?,
        None => Json::Null,
    };
    let mc = match config_json {
        Some(t) => parse(t, "config.json")?,
        None => Json::Null,
    };
    let model = &tj["model"];
    if model["type"].as_str() != Some("BPE") {
        return Err(err(format!(
            "model type {} is not BPE; only byte-level BPE tokenizers are converted",
            model["type"]
        )));
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| err("model.vocab is not an object"))?;

    // id -> (text, added token info)
    let mut by_id: HashMap<usize, String> = HashMap::with_capacity(vocab.len() + 64);
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| err(format!("model.vocab[{text:?}] is not an id")))?;
        by_id.insert(id as usize, text.clone());
    }
    struct Added {
        special: bool,
    }
    let mut added: HashMap<usize, Added> = HashMap::new();
    let added_list = tj["added_tokens"].as_array().cloned().unwrap_or_default();
    for a in &added_list {
        let id = a["id"]
            .as_u64()
            .ok_or_else(|| err("added token without id"))? as usize;
        let content = a["content"]
            .as_str()
            .ok_or_else(|| err("added token without content"))?;
        by_id.insert(id, content.to_string());
        added.insert(
            id,
            Added {
                special: a["special"].as_bool().unwrap_or(false),
            },
        );
    }
    let max_id = by_id
        .keys()
        .copied()
        .max()
        .ok_or_else(|| err("empty vocabulary"))?;
    let n = opts
        .vocab_size
        .or_else(|| mc["vocab_size"].as_u64().map(|v| v as usize))
        .unwrap_or(max_id + 1);
    if max_id >= n {
        return Err(err(format!(
            "token id {max_id} does not fit the vocabulary size {n}"
        )));
    }
    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for i in 0..n {
        match by_id.get(&i) {
            None => {
                tokens.push(format!("[PAD{i}]"));
                types.push(TOKEN_TYPE_UNUSED);
            }
            Some(t) => match added.get(&i) {
                Some(a) if a.special || looks_special(t) => {
                    tokens.push(t.clone());
                    types.push(TOKEN_TYPE_CONTROL);
                }
                Some(_) => {
                    tokens.push(t.replace('\u{2581}', " "));
                    types.push(TOKEN_TYPE_USER_DEFINED);
                }
                None => {
                    tokens.push(t.clone());
                    types.push(TOKEN_TYPE_NORMAL);
                }
            },
        }
    }

    let mut merges = Vec::new();
    for m in model["merges"].as_array().cloned().unwrap_or_default() {
        match m {
            Json::String(s) => merges.push(s),
            Json::Array(pair) if pair.len() == 2 => {
                let a = pair[0]
                    .as_str()
                    .ok_or_else(|| err("merge is not a string"))?;
                let b = pair[1]
                    .as_str()
                    .ok_or_else(|| err("merge is not a string"))?;
                merges.push(format!("{a} {b}"));
            }
            other => return Err(err(format!("unexpected merge entry {other}"))),
        }
    }

    let mut out: Vec<(String, MetaValue)> = vec![
        (keys::MODEL.into(), MetaValue::Str("gpt2".into())),
        (keys::PRE.into(), MetaValue::Str(opts.pre.clone())),
        (keys::TOKENS.into(), MetaValue::Strings(tokens)),
        (keys::TOKEN_TYPE.into(), MetaValue::I32s(types)),
        (keys::MERGES.into(), MetaValue::Strings(merges)),
    ];

    // Special token ids: tokenizer_config's `<typ>_token` (a string or {"content": ..}) matched
    // against the added tokens, then config.json's `<typ>_token_id`.
    let special_types: [(&str, &str); 5] = [
        ("bos", keys::BOS),
        ("eos", keys::EOS),
        ("unk", keys::UNK),
        ("sep", keys::SEP),
        ("pad", keys::PAD),
    ];
    for (typ, key) in special_types {
        let entry = &tc[format!("{typ}_token")];
        let content = match entry {
            Json::String(s) => Some(s.as_str()),
            Json::Object(o) => o.get("content").and_then(Json::as_str),
            _ => None,
        };
        let mut id = content.and_then(|c| {
            added_list
                .iter()
                .find(|a| a["content"].as_str() == Some(c))
                .and_then(|a| a["id"].as_u64())
        });
        if id.is_none() {
            id = mc[format!("{typ}_token_id")].as_u64();
        }
        if let Some(id) = id.filter(|&id| (id as usize) < n) {
            out.push((key.into(), MetaValue::U32(id as u32)));
        }
    }
    for (typ, key) in [("bos", keys::ADD_BOS), ("eos", keys::ADD_EOS)] {
        if let Some(b) = tc[format!("add_{typ}_token")].as_bool() {
            out.push((key.into(), MetaValue::Bool(b)));
        }
    }
    let template = match chat_template_file {
        Some(t) => Some(t.to_string()),
        None => match &tc["chat_template"] {
            Json::String(s) => Some(s.clone()),
            // A list of named templates: the default one.
            Json::Array(list) => list
                .iter()
                .find(|t| t["name"].as_str() == Some("default"))
                .and_then(|t| t["template"].as_str())
                .map(str::to_string),
            _ => None,
        },
    };
    if let Some(t) = template {
        out.push((keys::CHAT_TEMPLATE.into(), MetaValue::Str(t)));
    }
    Ok(out)
}

impl MetaValue {
    /// The same value as a GGUF metadata value (for writing it into a file).
    pub fn to_gguf(&self) -> hearth_gguf::Value {
        use hearth_gguf::{Array, Value};
        match self {
            MetaValue::Str(s) => Value::String(s.clone()),
            MetaValue::U32(v) => Value::U32(*v),
            MetaValue::Bool(b) => Value::Bool(*b),
            MetaValue::Strings(v) => Value::Array(Array::String(v.clone())),
            MetaValue::I32s(v) => Value::Array(Array::I32(v.clone())),
            MetaValue::F32s(v) => Value::Array(Array::F32(v.clone())),
        }
    }
}

/// Put converted pairs into a GGUF [`hearth_gguf::Metadata`] (later keys do not overwrite earlier).
pub fn to_metadata(pairs: &[(String, MetaValue)]) -> hearth_gguf::Metadata {
    let mut m = hearth_gguf::Metadata::new();
    for (k, v) in pairs {
        // A duplicate key keeps the first value; `convert` never produces one.
        let _ = m.insert(k.clone(), v.to_gguf());
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_tokenizer_json() {
        let tj = r#"{
          "added_tokens": [
            {"id": 5, "content": "<|end|>", "special": true, "normalized": false},
            {"id": 6, "content": "<tool>", "special": false, "normalized": false}
          ],
          "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "c": 4},
                    "merges": [["a", "b"]]}
        }"#;
        let tc = r#"{"eos_token": "<|end|>", "add_bos_token": false, "chat_template": "{{x}}"}"#;
        let opts = HfOptions {
            pre: "qwen2".into(),
            vocab_size: Some(9),
        };
        let pairs = convert(tj, Some(tc), None, None, &opts).unwrap();
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        let Some(MetaValue::Strings(tokens)) = get(keys::TOKENS) else {
            panic!()
        };
        assert_eq!(tokens[5], "<|end|>");
        assert_eq!(tokens[8], "[PAD8]");
        assert_eq!(
            get(keys::TOKEN_TYPE),
            Some(MetaValue::I32s(vec![1, 1, 1, 1, 1, 3, 4, 5, 5]))
        );
        assert_eq!(
            get(keys::MERGES),
            Some(MetaValue::Strings(vec!["a b".into()]))
        );
        assert_eq!(get(keys::EOS), Some(MetaValue::U32(5)));
        assert_eq!(get(keys::ADD_BOS), Some(MetaValue::Bool(false)));
        assert_eq!(
            get(keys::CHAT_TEMPLATE),
            Some(MetaValue::Str("{{x}}".into()))
        );
        let m = to_metadata(&pairs);
        assert_eq!(m.get_str(keys::PRE), Some("qwen2"));
    }
}
