//! The model's vocabulary as llguidance sees it: one byte string per logit row, in a token trie.
//!
//! Ordinary and user-defined tokens (`<tool_call>` in Qwen3) are the bytes they detokenize to, so a
//! grammar's literal text can be produced by the single token or spelled out by smaller ones, and
//! the text the engine streams is exactly the text the grammar checked. Control tokens
//! (`<|im_end|>`) get llguidance's special-token marker byte `0xFF` in front: no grammar text can
//! produce them; end of generation is decided separately (see [`crate::Constraint`]). Rows past the
//! tokenizer's vocabulary (padding of the output matrix) are empty and never allowed.

use std::sync::Arc;

use hearth_tokenizer::Tokenizer;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::ConstrainError;

/// A [`TokenizerEnv`] over Hearth's tokenizer.
pub(crate) struct HearthTokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
    canonical: bool,
}

impl HearthTokEnv {
    /// The environment of `tokenizer` for a model with `n_vocab` logit rows.
    pub(crate) fn build(
        tokenizer: Arc<Tokenizer>,
        n_vocab: usize,
    ) -> Result<TokEnv, ConstrainError> {
        let n_tok = tokenizer.vocab_size();
        if n_vocab < n_tok {
            return Err(ConstrainError::Vocab(format!(
                "the model has {n_vocab} logits but the tokenizer {n_tok} tokens"
            )));
        }
        let eos = tokenizer
            .eog_ids()
            .next()
            .or(tokenizer.eos_id())
            .ok_or_else(|| {
                ConstrainError::Vocab("the tokenizer has no end-of-generation token".into())
            })?;
        let mut words: Vec<Vec<u8>> = Vec::with_capacity(n_vocab);
        for id in 0..n_vocab as u32 {
            if (id as usize) >= n_tok {
                words.push(Vec::new());
            } else if tokenizer.is_control(id) || tokenizer.token_to_piece(id, false).is_empty() {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(tokenizer.token_text(id).as_bytes());
                words.push(w);
            } else {
                words.push(tokenizer.token_to_piece(id, false).to_vec());
            }
        }
        let info = TokRxInfo {
            vocab_size: n_vocab as u32,
            tok_eos: eos,
            tok_bos: tokenizer.bos_id(),
            tok_pad: tokenizer.pad_id(),
            tok_unk: tokenizer.unk_id(),
            tok_end_of_turn: tokenizer.eot_id(),
        };
        let trie = TokTrie::from(&info, &words);
        let eog: Vec<TokenId> = tokenizer
            .eog_ids()
            .filter(|&t| (t as usize) < n_vocab)
            .collect();
        let trie = if eog.is_empty() {
            trie
        } else {
            trie.with_eos_tokens(&eog)
        };
        let canonical = is_canonical(&tokenizer);
        Ok(Arc::new(HearthTokEnv {
            trie,
            tokenizer,
            canonical,
        }))
    }
}

/// llguidance forces the canonical tokenization of text the grammar fixes (a constant key, a tool
/// name); that is only right when tokenizing text and decoding it back is the identity, which
/// SentencePiece vocabularies with a space prefix break.
fn is_canonical(tok: &Tokenizer) -> bool {
    ["{\"name\": \"x\"}", "abc", " 12, true"].iter().all(|s| {
        let ids = tok.encode(s, false);
        ids.iter()
            .flat_map(|&id| tok.token_to_piece(id, false).iter().copied())
            .eq(s.bytes())
    })
}

impl TokenizerEnv for HearthTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) if self.canonical => self.tokenizer.encode(text, false),
            _ => self.trie.greedy_tokenize(s),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}
