//! The tokenizer's inputs as plain data: what `tokenizer.ggml.*` metadata holds.
//!
//! [`VocabSpec`] is filled either from a GGUF file's metadata ([`VocabSpec::from_gguf`]) or from a list
//! of `(key, value)` pairs ([`VocabSpec::from_pairs`], e.g. the output of [`crate::hf`]), so that the
//! algorithmic core does not depend on where the vocabulary came from.

use crate::error::TokenizerError;

/// Token type of `tokenizer.ggml.token_type`: an ordinary token.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// Token type: the unknown token.
pub const TOKEN_TYPE_UNKNOWN: i32 = 2;
/// Token type: a control token (BOS, EOS, `<|im_start|>`...).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// Token type: a user-defined token (always matched as a whole, rendered as text).
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
/// Token type: an unused token (padding).
pub const TOKEN_TYPE_UNUSED: i32 = 5;
/// Token type: a byte token (`<0x0A>`).
pub const TOKEN_TYPE_BYTE: i32 = 6;

/// A metadata value, as much of GGUF's type system as the tokenizer keys need.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// A string.
    Str(String),
    /// An unsigned 32-bit integer (token ids).
    U32(u32),
    /// A boolean flag.
    Bool(bool),
    /// An array of strings (tokens, merges).
    Strings(Vec<String>),
    /// An array of signed 32-bit integers (token types).
    I32s(Vec<i32>),
    /// An array of 32-bit floats (scores).
    F32s(Vec<f32>),
}

/// Everything the tokenizer reads from `tokenizer.ggml.*` (and `general.name`).
#[derive(Clone, Debug, Default)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`: `gpt2` or `llama`.
    pub model: String,
    /// `tokenizer.ggml.pre`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges` ("a b", rank = index).
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`.
    pub eom: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (sic, as llama.cpp spells it).
    pub sep: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `general.name` (llama.cpp keys a Phi-3 quirk on it).
    pub name: Option<String>,
}

/// The keys, spelled once.
pub mod keys {
    /// Tokenizer model.
    pub const MODEL: &str = "tokenizer.ggml.model";
    /// Pre-tokenizer.
    pub const PRE: &str = "tokenizer.ggml.pre";
    /// Token strings.
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    /// Token scores.
    pub const SCORES: &str = "tokenizer.ggml.scores";
    /// Token types.
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    /// BPE merges.
    pub const MERGES: &str = "tokenizer.ggml.merges";
    /// BOS id.
    pub const BOS: &str = "tokenizer.ggml.bos_token_id";
    /// EOS id.
    pub const EOS: &str = "tokenizer.ggml.eos_token_id";
    /// EOT id.
    pub const EOT: &str = "tokenizer.ggml.eot_token_id";
    /// EOM id.
    pub const EOM: &str = "tokenizer.ggml.eom_token_id";
    /// Unknown id.
    pub const UNK: &str = "tokenizer.ggml.unknown_token_id";
    /// Separator id.
    pub const SEP: &str = "tokenizer.ggml.seperator_token_id";
    /// Padding id.
    pub const PAD: &str = "tokenizer.ggml.padding_token_id";
    /// Add BOS flag.
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    /// Add EOS flag.
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    /// Add space prefix flag.
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
    /// Chat template.
    pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
    /// Model name.
    pub const NAME: &str = "general.name";
}

fn wrong(key: &str, expected: &'static str) -> TokenizerError {
    TokenizerError::WrongType {
        key: key.to_string(),
        expected,
    }
}

impl VocabSpec {
    /// Read the tokenizer keys of a GGUF file's metadata. Integer ids of any width are accepted;
    /// llama.cpp requires `token_type` to be i32 and scores f32 or i32, and so do we.
    pub fn from_gguf(meta: &hearth_gguf::Metadata) -> Result<VocabSpec, TokenizerError> {
        use hearth_gguf::{Array, Value};
        let s = |k: &str| -> Result<Option<String>, TokenizerError> {
            match meta.get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_str()
                    .map(|x| Some(x.to_string()))
                    .ok_or_else(|| wrong(k, "string")),
            }
        };
        let u = |k: &str| -> Result<Option<u32>, TokenizerError> {
            match meta.get(k) {
                None => Ok(None),
                // llama.cpp reads ids as u32; a negative id (some converters write -1) is "unset".
                Some(v) if v.as_i64().is_some_and(|x| x < 0) => Ok(None),
                Some(v) => v.as_u32().map(Some).ok_or_else(|| wrong(k, "u32")),
            }
        };
        let b = |k: &str| -> Result<Option<bool>, TokenizerError> {
            match meta.get(k) {
                None => Ok(None),
                Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong(k, "bool")),
            }
        };
        let strings = |k: &str| -> Result<Option<Vec<String>>, TokenizerError> {
            match meta.get(k) {
                None => Ok(None),
                Some(Value::Array(Array::String(v))) => Ok(Some(v.clone())),
                Some(_) => Err(wrong(k, "array of strings")),
            }
        };
        Ok(VocabSpec {
            model: s(keys::MODEL)?.ok_or_else(|| TokenizerError::MissingKey(keys::MODEL.into()))?,
            pre: s(keys::PRE)?,
            tokens: strings(keys::TOKENS)?
                .ok_or_else(|| TokenizerError::MissingKey(keys::TOKENS.into()))?,
            scores: match meta.get(keys::SCORES) {
                None => None,
                Some(Value::Array(Array::F32(v))) => Some(v.clone()),
                Some(Value::Array(Array::I32(v))) => Some(v.iter().map(|&x| x as f32).collect()),
                Some(_) => return Err(wrong(keys::SCORES, "array of f32 or i32")),
            },
            token_types: match meta.get(keys::TOKEN_TYPE) {
                None => None,
                Some(Value::Array(Array::I32(v))) => Some(v.clone()),
                Some(_) => return Err(wrong(keys::TOKEN_TYPE, "array of i32")),
            },
            merges: strings(keys::MERGES)?,
            bos: u(keys::BOS)?,
            eos: u(keys::EOS)?,
            eot: u(keys::EOT)?,
            eom: u(keys::EOM)?,
            unk: u(keys::UNK)?,
            sep: u(keys::SEP)?,
            pad: u(keys::PAD)?,
            add_bos: b(keys::ADD_BOS)?,
            add_eos: b(keys::ADD_EOS)?,
            add_space_prefix: b(keys::ADD_SPACE_PREFIX)?,
            name: s(keys::NAME)?,
        })
    }

    /// Build from `(key, value)` pairs; unknown keys are ignored.
    pub fn from_pairs(pairs: &[(String, MetaValue)]) -> Result<VocabSpec, TokenizerError> {
        let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v);
        let s = |k: &str| -> Result<Option<String>, TokenizerError> {
            match get(k) {
                None => Ok(None),
                Some(MetaValue::Str(v)) => Ok(Some(v.clone())),
                Some(_) => Err(wrong(k, "string")),
            }
        };
        let u = |k: &str| -> Result<Option<u32>, TokenizerError> {
            match get(k) {
                None => Ok(None),
                Some(MetaValue::U32(v)) => Ok(Some(*v)),
                Some(_) => Err(wrong(k, "u32")),
            }
        };
        let b = |k: &str| -> Result<Option<bool>, TokenizerError> {
            match get(k) {
                None => Ok(None),
                Some(MetaValue::Bool(v)) => Ok(Some(*v)),
                Some(_) => Err(wrong(k, "bool")),
            }
        };
        let strings = |k: &str| -> Result<Option<Vec<String>>, TokenizerError> {
            match get(k) {
                None => Ok(None),
                Some(MetaValue::Strings(v)) => Ok(Some(v.clone())),
                Some(_) => Err(wrong(k, "array of strings")),
            }
        };
        Ok(VocabSpec {
            model: s(keys::MODEL)?.ok_or_else(|| TokenizerError::MissingKey(keys::MODEL.into()))?,
            pre: s(keys::PRE)?,
            tokens: strings(keys::TOKENS)?
                .ok_or_else(|| TokenizerError::MissingKey(keys::TOKENS.into()))?,
            scores: match get(keys::SCORES) {
                None => None,
                Some(MetaValue::F32s(v)) => Some(v.clone()),
                Some(_) => return Err(wrong(keys::SCORES, "array of f32")),
            },
            token_types: match get(keys::TOKEN_TYPE) {
                None => None,
                Some(MetaValue::I32s(v)) => Some(v.clone()),
                Some(_) => return Err(wrong(keys::TOKEN_TYPE, "array of i32")),
            },
            merges: strings(keys::MERGES)?,
            bos: u(keys::BOS)?,
            eos: u(keys::EOS)?,
            eot: u(keys::EOT)?,
            eom: u(keys::EOM)?,
            unk: u(keys::UNK)?,
            sep: u(keys::SEP)?,
            pad: u(keys::PAD)?,
            add_bos: b(keys::ADD_BOS)?,
            add_eos: b(keys::ADD_EOS)?,
            add_space_prefix: b(keys::ADD_SPACE_PREFIX)?,
            name: s(keys::NAME)?,
        })
    }
}
