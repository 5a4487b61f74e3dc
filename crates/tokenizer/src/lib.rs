//! Tokenizers and chat templates from GGUF metadata, identical to llama.cpp's.
//!
//! The GGUF file is the source of truth: `tokenizer.ggml.model` picks the algorithm (`gpt2`:
//! byte-level BPE; `llama`: SentencePiece-style score merging with byte fallback),
//! `tokenizer.ggml.pre` picks the pre-tokenizer regexes, and the token types decide which tokens
//! are special. Everything follows llama.cpp's `llama-vocab.cpp` / `unicode.cpp`, including its
//! quirks, so that token ids match its `llama_tokenize` exactly; an unknown model or pre-tokenizer
//! is an error rather than a guess.
//!
//! - [`Tokenizer::encode`] / [`Tokenizer::encode_with_specials`]: text → ids. Special tokens typed
//!   in the text are only parsed as such when the caller asks (`parse_special`).
//! - [`Tokenizer::token_to_piece`], [`Tokenizer::decode`], [`StreamDecoder`]: ids → bytes / text.
//! - [`hf`]: convert a Hugging Face `tokenizer.json` into the same metadata.
//! - [`template`]: chat templates.
//!
//! ```no_run
//! let tok = hearth_tokenizer::Tokenizer::open("model.gguf")?;
//! // A prompt line as the parity fixtures and `hearth logits` write it: specials parsed, BOS per flag.
//! let ids = tok.encode_prompt_line(r"<|im_start|>user\nHi<|im_end|>\n");
//! // User text: a typed "<|im_end|>" stays text.
//! let user = tok.encode("I typed <|im_end|>", false);
//! let mut out = tok.stream_decoder(false);
//! for id in ids.iter().chain(&user) {
//!     print!("{}", out.push(*id));
//! }
//! print!("{}", out.finish());
//! # Ok::<(), hearth_tokenizer::TokenizerError>(())
//! ```
#![deny(missing_docs)]

mod bpe;
mod decode;
pub mod error;
pub mod hf;
mod load;
mod pretok;
pub mod special;
mod spm;
mod stream;
pub mod template;
mod unicode;
pub mod vocab;

pub use error::TokenizerError;
pub use stream::StreamDecoder;
pub use vocab::{MetaValue, VocabSpec};

use special::{attr, Fragment};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// Which algorithm turns text fragments into ids.
#[derive(Debug)]
enum Kind {
    /// Byte-level BPE with a regex pre-tokenizer.
    Bpe {
        pre: pretok::PreTokenizer,
        merges: bpe::Merges,
        ignore_merges: bool,
    },
    /// SentencePiece-style merging by score.
    Spm,
}

/// Words cached per tokenizer before the cache is cleared (bounds memory on adversarial input).
const WORD_CACHE_MAX: usize = 1 << 16;
/// Longest word (in bytes) that is cached.
const WORD_CACHE_MAX_LEN: usize = 256;

/// A tokenizer built from `tokenizer.ggml.*` metadata.
#[derive(Debug)]
pub struct Tokenizer {
    kind: Kind,
    model: String,
    pre: String,
    tokens: Vec<String>,  // [n_vocab]
    scores: Vec<f32>,     // [n_vocab]
    attrs: Vec<u32>,      // [n_vocab], special::attr bits
    pieces: Vec<Vec<u8>>, // [n_vocab], token_to_piece(id, render_special = true)
    ids: HashMap<String, u32>,
    byte_ids: [Option<u32>; 256],
    /// Special tokens in matching order: longest text first.
    specials: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    eog: BTreeSet<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    cache: Mutex<HashMap<String, Vec<u32>>>,
}

impl Tokenizer {
    /// Open a GGUF file (a model or a vocabulary-only file) and build its tokenizer.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Tokenizer, TokenizerError> {
        let g = hearth_gguf::Gguf::open(path.as_ref())?;
        Tokenizer::from_gguf(g.metadata())
    }

    /// Build from a GGUF file's metadata.
    pub fn from_gguf(meta: &hearth_gguf::Metadata) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(VocabSpec::from_gguf(meta)?)
    }

    /// Build from `(key, value)` pairs such as [`hf::convert`] returns.
    pub fn from_pairs(pairs: &[(String, MetaValue)]) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(VocabSpec::from_pairs(pairs)?)
    }

    /// Tokenize `text` without BOS / EOS. With `parse_special`, control tokens written in the text
    /// (`<|im_end|>`) become their ids; without it they are tokenized as ordinary text.
    /// User-defined tokens are always matched whole, as in llama.cpp.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.encode_with_specials(text, false, parse_special)
    }

    /// Tokenize as llama.cpp's `llama_tokenize(text, add_special, parse_special)`: with
    /// `add_special`, BOS is prepended when [`Tokenizer::add_bos`] and EOS appended when
    /// [`Tokenizer::add_eos`].
    pub fn encode_with_specials(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Vec<u32> {
        let frags = special::partition(
            text,
            &self.specials,
            |id| (self.tokens[id as usize].as_str(), self.attrs[id as usize]),
            parse_special,
        );
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.kind {
            Kind::Spm => {
                let v = spm::SpmVocab {
                    ids: &self.ids,
                    scores: &self.scores,
                    byte_ids: &self.byte_ids,
                    unk: self.unk,
                };
                // A space is prefixed to text at the start and after every special token.
                let mut prev_special = true;
                for f in frags {
                    match f {
                        Fragment::Text(s, l) => {
                            let mut t = String::with_capacity(l + 3);
                            if self.add_space_prefix && prev_special {
                                t.push(' ');
                            }
                            t.push_str(&text[s..s + l]);
                            let t = t.replace(' ', "\u{2581}");
                            spm::encode(&t, &v, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Kind::Bpe { pre, .. } => {
                for f in frags {
                    match f {
                        Fragment::Text(s, l) => {
                            for word in pre.split(&text[s..s + l], true) {
                                self.bpe_word(&word, &mut out);
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The convention of the parity fixtures and `hearth logits` for one prompt line: the two
    /// characters `\n` become a newline (nothing else is unescaped), special tokens are parsed, and
    /// BOS / EOS are added as the model's flags say.
    pub fn encode_prompt_line(&self, line: &str) -> Vec<u32> {
        let text = line.replace("\\n", "\n");
        self.encode_with_specials(&text, true, true)
    }

    fn bpe_word(&self, word: &str, out: &mut Vec<u32>) {
        let Kind::Bpe {
            merges,
            ignore_merges,
            ..
        } = &self.kind
        else {
            return;
        };
        if let Some(ids) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(word)
        {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        match self.ids.get(word) {
            Some(&id) if *ignore_merges => out.push(id),
            _ => {
                for (s, l) in merges.apply(word) {
                    let piece = &word[s..s + l];
                    match self.ids.get(piece) {
                        Some(&id) => out.push(id),
                        None => {
                            // llama.cpp looks up each byte of the piece as a one-byte token; only
                            // ASCII bytes can be one (tokens are valid UTF-8).
                            for &b in piece.as_bytes().iter().filter(|b| b.is_ascii()) {
                                if let Some(&id) = self.ids.get(&(b as char).to_string()) {
                                    out.push(id);
                                }
                            }
                        }
                    }
                }
            }
        }
        // Long words are rare and would make the cache's memory unbounded in bytes.
        if word.len() <= WORD_CACHE_MAX_LEN {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if cache.len() >= WORD_CACHE_MAX {
                cache.clear();
            }
            cache.insert(word.to_string(), out[start..].to_vec());
        }
    }

    /// A streaming detokenizer over this vocabulary.
    pub fn stream_decoder(&self, render_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, render_special)
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The raw vocabulary string of a token (`""` for an out-of-range id).
    pub fn token_text(&self, id: u32) -> &str {
        self.tokens
            .get(id as usize)
            .map(String::as_str)
            .unwrap_or("")
    }

    /// The id of a vocabulary string.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The token's attribute bits ([`special::attr`]); `0` for an out-of-range id.
    pub fn token_attr(&self, id: u32) -> u32 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    /// Whether the token is a control token (rendered only on request).
    pub fn is_control(&self, id: u32) -> bool {
        self.token_attr(id) & attr::CONTROL != 0
    }

    /// Whether the token ends generation: EOS, EOT, EOM and the tokens llama.cpp recognises by
    /// their text (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>`...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    /// Whether llama.cpp adds BOS to a prompt for this model.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether llama.cpp adds EOS to a prompt for this model.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Beginning-of-sequence token.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token.
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    /// End-of-message token.
    pub fn eom_id(&self) -> Option<u32> {
        self.eom
    }

    /// Padding token.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Unknown token.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    /// `tokenizer.ggml.model`.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// `tokenizer.ggml.pre` (empty when absent).
    pub fn pre(&self) -> &str {
        &self.pre
    }
}
