//! The error type of the tokenizer crate.

use thiserror::Error;

/// Everything that can go wrong while building a tokenizer from metadata.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// A required metadata key is absent.
    #[error("missing tokenizer metadata key '{0}'")]
    MissingKey(String),
    /// A metadata key has another type than the one the tokenizer needs.
    #[error("metadata key '{key}' has the wrong type: expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What we expected.
        expected: &'static str,
    },
    /// `tokenizer.ggml.model` names a tokenizer we do not implement.
    #[error("unknown tokenizer model '{0}' (supported: gpt2, llama)")]
    UnknownModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer we do not know; we refuse to guess its regex.
    #[error("unknown pre-tokenizer '{0}': refusing to guess a pre-tokenizer regex")]
    UnknownPre(String),
    /// A pre-tokenizer regex does not compile.
    #[error("pre-tokenizer regex {regex:?} does not compile: {reason}")]
    Regex {
        /// The regex (as given to the engine).
        regex: String,
        /// The engine's message.
        reason: String,
    },
    /// The same token text appears twice in the vocabulary.
    #[error("duplicate token in vocabulary: {text:?} has ids {first} and {second}")]
    DuplicateToken {
        /// The token text.
        text: String,
        /// Its first id.
        first: u32,
        /// Its second id.
        second: u32,
    },
    /// A per-token array is shorter than the token list.
    #[error("'{key}' has {got} entries but the vocabulary has {expected} tokens")]
    LengthMismatch {
        /// The key of the array.
        key: String,
        /// Its length.
        got: usize,
        /// The number of tokens.
        expected: usize,
    },
    /// The vocabulary is empty or larger than the id space.
    #[error("vocabulary has {0} tokens; expected between 1 and 2^31")]
    BadVocabSize(usize),
    /// `add_bos_token` / `add_eos_token` is set but the token id is not.
    #[error("{flag} is true, but {key} is not set")]
    MissingSpecial {
        /// The flag key.
        flag: &'static str,
        /// The id key.
        key: &'static str,
    },
    /// A Hugging Face tokenizer file could not be used.
    #[error("Hugging Face tokenizer: {0}")]
    Hf(String),
    /// The GGUF file could not be read.
    #[error(transparent)]
    Gguf(#[from] hearth_gguf::GgufError),
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}
