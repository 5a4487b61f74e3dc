//! The one error type of the crate: what was wrong with a schema or grammar, or with a token.

/// Why a constraint could not be built or followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstrainError {
    /// The JSON Schema is malformed, unsatisfiable or uses a keyword the engine does not implement
    /// (the message names it).
    #[error("invalid JSON schema: {0}")]
    Schema(String),
    /// The GBNF grammar does not parse; `line` and `column` count from 1.
    #[error("invalid GBNF grammar at line {line}, column {column}: {message}")]
    Gbnf {
        /// Line of the error.
        line: usize,
        /// Column (in characters) of the error.
        column: usize,
        /// What is wrong there.
        message: String,
    },
    /// The grammar parsed but the engine refused it (e.g. left recursion it cannot handle, a
    /// grammar too large).
    #[error("invalid grammar: {0}")]
    Grammar(String),
    /// The tokenizer cannot be turned into a token trie.
    #[error("cannot build the token trie: {0}")]
    Vocab(String),
    /// A token was committed that the constraint does not allow, or the engine failed mid-way.
    #[error("constraint violated: {0}")]
    Violated(String),
}
