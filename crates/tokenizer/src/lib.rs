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
pub mod error;
pub mod hf;
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

/// Token texts that llama.cpp treats as end of turn when no EOT id is given.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Token texts that llama.cpp treats as end of generation (`special_eog_ids`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

const FIM_PRE: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP: &[&str] = &["<|file_sep|>"];

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

    /// Build from plain vocabulary data, following llama.cpp's `llama_vocab::impl::load`.
    pub fn from_spec(spec: VocabSpec) -> Result<Tokenizer, TokenizerError> {
        let n = spec.tokens.len();
        if n == 0 || n > i32::MAX as usize {
            return Err(TokenizerError::BadVocabSize(n));
        }
        // Defaults of llama.cpp per model type, before the file's keys override them.
        let (mut bos, mut eos, mut unk): (Option<u32>, Option<u32>, Option<u32>);
        let mut add_bos;
        let mut add_eos = false;
        let mut add_space_prefix;
        let clean_spaces;
        let pre_name = spec.pre.clone().unwrap_or_default();
        let kind = match spec.model.as_str() {
            "llama" => {
                (bos, eos, unk) = (Some(1), Some(2), Some(0));
                add_space_prefix = true;
                clean_spaces = false;
                add_bos = true;
                Kind::Spm
            }
            "gpt2" => {
                (bos, eos, unk) = (Some(11), Some(11), None);
                let merges = spec
                    .merges
                    .as_ref()
                    .ok_or_else(|| TokenizerError::MissingKey(vocab::keys::MERGES.into()))?;
                let cfg = pretok::pre_config(&pre_name)
                    .ok_or_else(|| TokenizerError::UnknownPre(pre_name.clone()))?;
                add_space_prefix = false;
                clean_spaces = cfg.clean_spaces;
                add_bos = cfg.add_bos;
                if cfg.no_bos {
                    bos = None;
                }
                Kind::Bpe {
                    pre: pretok::PreTokenizer::new(&cfg.regexes)?,
                    merges: bpe::Merges::new(merges),
                    ignore_merges: cfg.ignore_merges,
                }
            }
            other => return Err(TokenizerError::UnknownModel(other.to_string())),
        };
        if let Some(v) = spec.add_space_prefix {
            add_space_prefix = v;
        }

        if let Some(s) = &spec.scores {
            if s.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    key: vocab::keys::SCORES.into(),
                    got: s.len(),
                    expected: n,
                });
            }
        }
        if let Some(t) = &spec.token_types {
            if t.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    key: vocab::keys::TOKEN_TYPE.into(),
                    got: t.len(),
                    expected: n,
                });
            }
        }
        let mut tokens = spec.tokens;
        let mut ids = HashMap::with_capacity(n);
        let mut attrs = Vec::with_capacity(n);
        for (i, word) in tokens.iter_mut().enumerate() {
            if word.is_empty() {
                *word = format!("[EMPTY_{i}]");
            }
            if let Some(&first) = ids.get(word.as_str()) {
                return Err(TokenizerError::DuplicateToken {
                    text: word.clone(),
                    first,
                    second: i as u32,
                });
            }
            ids.insert(word.clone(), i as u32);
            attrs.push(match &spec.token_types {
                None => attr::NORMAL,
                Some(t) => match t[i] {
                    vocab::TOKEN_TYPE_NORMAL => attr::NORMAL,
                    vocab::TOKEN_TYPE_UNKNOWN => attr::UNKNOWN,
                    vocab::TOKEN_TYPE_CONTROL => attr::CONTROL,
                    vocab::TOKEN_TYPE_USER_DEFINED => attr::USER_DEFINED,
                    vocab::TOKEN_TYPE_UNUSED => attr::UNUSED,
                    vocab::TOKEN_TYPE_BYTE => attr::BYTE,
                    _ => attr::UNDEFINED,
                },
            });
        }
        let scores = match spec.scores {
            Some(mut s) => {
                s.truncate(n);
                s
            }
            None => vec![0.0; n],
        };

        // Special ids: defaults out of range are disabled; the file's value wins when in range.
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let pick = |default: Option<u32>, key: Option<u32>| in_range(key).or(in_range(default));
        bos = pick(bos, spec.bos);
        eos = pick(eos, spec.eos);
        unk = pick(unk, spec.unk);
        let mut eot = in_range(spec.eot);
        let mut eom = in_range(spec.eom);
        let pad = in_range(spec.pad);
        if let Some(v) = spec.add_bos {
            add_bos = v;
        }
        if let Some(v) = spec.add_eos {
            add_eos = v;
        }
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                flag: vocab::keys::ADD_BOS,
                key: vocab::keys::BOS,
            });
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                flag: vocab::keys::ADD_EOS,
                key: vocab::keys::EOS,
            });
        }

        // Auto-detect EOT / EOM / FIM tokens by their text, as llama.cpp does; a token found this
        // way becomes a control token. (llama.cpp walks a hash map; we walk ids in order.)
        let mut fim: [Option<u32>; 6] = [None; 6];
        let fim_lists = [FIM_PRE, FIM_SUF, FIM_MID, FIM_PAD, FIM_REP, FIM_SEP];
        // llama.cpp takes whichever EOT text its hash map yields first; we take the first of the
        // list that exists ("<|eot_id|>", then "<|im_end|>", ...), the real end of turn.
        if eot.is_none() {
            if let Some(&id) = EOT_TEXTS.iter().find_map(|t| ids.get(*t)) {
                eot = Some(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        for (i, t) in tokens.iter().enumerate() {
            let id = i as u32;
            if eom.is_none() && t == "<|eom_id|>" {
                eom = Some(id);
                attrs[i] |= attr::CONTROL;
            }
            for (slot, list) in fim.iter_mut().zip(fim_lists) {
                if slot.is_none() && list.contains(&t.as_str()) {
                    *slot = Some(id);
                    attrs[i] |= attr::CONTROL;
                }
            }
        }
        // Control tokens named "unused" are unused.
        for (t, a) in tokens.iter().zip(attrs.iter_mut()) {
            if *a & attr::CONTROL != 0 && t.contains("unused") {
                *a |= attr::UNUSED;
            }
        }
        let mut eog: BTreeSet<u32> = fim[3..].iter().flatten().copied().collect();
        for (i, t) in tokens.iter().enumerate() {
            if EOG_TEXTS.contains(&t.as_str()) {
                eog.insert(i as u32);
                attrs[i] |= attr::CONTROL;
            }
            // gpt-oss: these always render as text.
            if matches!(
                t.as_str(),
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                attrs[i] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        // o200k_harmony / solar-open: "<|end|>" is not end of generation there.
        let has = |s: &str| eog.iter().any(|&id| tokens[id as usize] == s);
        if (has("<|return|>") && has("<|call|>") || has("<|calls|>") && has("<|flush|>"))
            && has("<|end|>")
        {
            if let Some(&end) = eog.iter().find(|&&id| tokens[id as usize] == "<|end|>") {
                eog.remove(&end);
                attrs[end as usize] = attr::USER_DEFINED;
            }
        }
        // gemma4 / paddleocr: "</s>" is not end of generation when "<|tool_response>" is.
        let has = |s: &str| eog.iter().any(|&id| tokens[id as usize] == s);
        if has("<|tool_response>") && has("</s>") {
            if let Some(&s) = eog.iter().find(|&&id| tokens[id as usize] == "</s>") {
                eog.remove(&s);
                attrs[s as usize] = attr::NORMAL;
            }
        }

        // Special tokens, longest first (llama.cpp sorts by length; ties keep id order here).
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(tokens[id as usize].len()));

        let is_spm = matches!(kind, Kind::Spm);
        let pieces: Vec<Vec<u8>> = (0..n)
            .map(|i| render_piece(&tokens[i], attrs[i], is_spm))
            .collect();

        // Phi-3: llama.cpp keys per-token strip attributes on the model name.
        let name = spec.name.unwrap_or_default().to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &specials {
                attrs[id as usize] |= attr::RSTRIP;
            }
            if let Some(&id) = ids.get("</s>") {
                attrs[id as usize] |= attr::RSTRIP;
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(&id) = ids.get(t) {
                    attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        }

        let mut byte_ids = [None; 256];
        if is_spm {
            for (b, slot) in byte_ids.iter_mut().enumerate() {
                *slot = ids.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                    char::from_u32(b as u32)
                        .filter(|_| b < 0x80)
                        .and_then(|c| ids.get(&c.to_string()).copied())
                });
            }
        }

        Ok(Tokenizer {
            kind,
            model: spec.model,
            pre: pre_name,
            tokens,
            scores,
            attrs,
            pieces,
            ids,
            byte_ids,
            specials,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            cache: Mutex::new(HashMap::new()),
        })
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
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= WORD_CACHE_MAX {
            cache.clear();
        }
        cache.insert(word.to_string(), out[start..].to_vec());
    }

    /// The bytes of one token. Control and unknown tokens render as nothing unless
    /// `render_special`; out-of-range ids render as nothing.
    pub fn token_to_piece(&self, id: u32, render_special: bool) -> &[u8] {
        let Some(&a) = self.attrs.get(id as usize) else {
            return &[];
        };
        if !render_special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return &[];
        }
        &self.pieces[id as usize]
    }

    /// Detokenize as llama.cpp's `llama_detokenize(remove_special = false, unparse_special =
    /// render_special)`: concatenated pieces, the space prefix of SentencePiece removed from the
    /// first token, and `clean_up_tokenization_spaces` where the vocabulary asks for it. Invalid
    /// UTF-8 is replaced (lossily) only at the end.
    pub fn decode(&self, ids: &[u32], render_special: bool) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, render_special)).into_owned()
    }

    /// [`Tokenizer::decode`] without the final UTF-8 conversion.
    pub fn decode_bytes(&self, ids: &[u32], render_special: bool) -> Vec<u8> {
        let mut text = Vec::new();
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let mut p = self.token_to_piece(id, render_special);
            if remove_space && p.first() == Some(&b' ') {
                p = &p[1..];
            }
            remove_space = false;
            text.extend_from_slice(p);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
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

/// The bytes a token stands for, with `render_special` (llama.cpp's `token_to_piece` cache).
fn render_piece(text: &str, a: u32, spm: bool) -> Vec<u8> {
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return text.as_bytes().to_vec();
    }
    if a & attr::NORMAL != 0 {
        if spm {
            return text.replace('\u{2581}', " ").into_bytes();
        }
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match unicode::char_to_byte(c) {
                Some(b) => out.push(b),
                None => {
                    // llama.cpp's `llama_decode_text` marks characters outside the byte table.
                    out.extend_from_slice(b"[UNK_BYTE_0x");
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.extend_from_slice(format!("{b:02x}").as_bytes());
                    }
                    out.extend_from_slice(text.as_bytes());
                    out.push(b']');
                }
            }
        }
        return out;
    }
    if a & attr::BYTE != 0 {
        let b = text
            .get(3..5)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .unwrap_or(0);
        return vec![b];
    }
    Vec::new()
}

/// llama.cpp's `clean_spaces` passes of `detokenize` (Hugging Face's
/// `clean_up_tokenization_spaces`), ported literally: in place, including the NUL it writes over a
/// removed space, which later comparisons then see.
fn clean_up_spaces(t: &mut Vec<u8>) {
    // Pass 1: " ?", " !", " .", " ," lose the space.
    let n = t.len();
    let mut total = n.min(1);
    for i in 1..n {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        t[total] = x;
        total += 1;
    }
    t.truncate(total);
    // Pass 2: a single apostrophe between spaces loses both spaces.
    let n = t.len();
    let mut total = n.min(1);
    let mut i = 1;
    while i < n {
        let x = t[i];
        if x == b'\'' && i + 1 < n && t[i - 1] == b' ' && t[i + 1] == b' ' {
            total -= 1;
            i += 1;
            t[i] = 0;
        }
        t[total] = x;
        total += 1;
        i += 1;
    }
    t.truncate(total);
    // Pass 3: " 's", " 'm", " 're", " 've" lose the space.
    let n = t.len();
    let mut total = n.min(1);
    for i in 1..n {
        let x = t[i];
        if t[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = t[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if x1 != b't' && x1 != b'd' && i + 2 < n {
                let x2 = t[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        t[total] = x;
        total += 1;
    }
    t.truncate(total);
}

#[cfg(test)]
mod tests {
    use super::clean_up_spaces;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_up_spaces(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    }

    #[test]
    fn clean_up_spaces_as_llama_cpp() {
        assert_eq!(
            clean("Hello , world . Yes ? No !"),
            "Hello, world. Yes? No!"
        );
        assert_eq!(
            clean("I 'm sure you 're right , it 's he 'll"),
            "I'm sure you're right, it's he 'll"
        );
        assert_eq!(clean("do n't 'd"), "do n't 'd");
        assert_eq!(clean("a ' b"), "a'b");
        // The NUL llama.cpp writes over a removed space hides it from the next comparison.
        assert_eq!(clean("a ' ' b"), "a'' b");
        assert_eq!(clean(""), "");
        assert_eq!(clean(" ."), ".");
    }
}
