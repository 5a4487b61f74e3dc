//! Streaming detokenization: emit text as tokens arrive, only in whole UTF-8 characters.
//!
//! Byte-level BPE and byte-fallback tokens split multi-byte characters across tokens (an emoji is
//! often three or four tokens). The decoder keeps an incomplete trailing sequence until the bytes
//! that complete it arrive; bytes that can never form a character are replaced by U+FFFD at once.
//! Each token contributes its [`crate::Tokenizer::token_to_piece`], as llama.cpp's examples print
//! generated tokens; in particular a SentencePiece token keeps its leading space (`▁world` → " world"),
//! which is right for a continuation. When the ids are a whole text from its start, use
//! [`StreamDecoder::at_text_start`] to drop that first space as [`crate::Tokenizer::decode`] does; the
//! concatenation of everything emitted then equals `decode` of the same ids for vocabularies without
//! `clean_spaces` (that clean-up needs look-ahead and is not applied here).

use crate::Tokenizer;

/// Incremental detokenizer; see the module documentation.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    render_special: bool,
    pending: Vec<u8>,
    first: bool,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder over `tok`; control tokens are rendered only with `render_special`.
    pub fn new(tok: &'a Tokenizer, render_special: bool) -> StreamDecoder<'a> {
        StreamDecoder {
            tok,
            render_special,
            pending: Vec::new(),
            first: false,
        }
    }

    /// The ids start a text: drop the SentencePiece space prefix of the first token, as `decode`.
    pub fn at_text_start(mut self) -> StreamDecoder<'a> {
        self.first = true;
        self
    }

    /// Add one token and return the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let mut piece = self.tok.token_to_piece(id, self.render_special);
        // SentencePiece: the first token's space prefix is not part of the text (as `decode`).
        if self.first && self.tok.add_space_prefix && piece.first() == Some(&b' ') {
            piece = &piece[1..];
        }
        self.first = false;
        self.pending.extend_from_slice(piece);
        self.drain(false)
    }

    /// Flush whatever is buffered (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    /// Bytes held back because they may start a character that is not complete yet.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    fn drain(&mut self, all: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // Infallible: `valid_up_to` bytes are valid UTF-8.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            rest = &after[bad..];
                        }
                        None => {
                            // An incomplete sequence at the end: wait for more bytes.
                            rest = after;
                            if all {
                                out.push('\u{FFFD}');
                                rest = &[];
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}
