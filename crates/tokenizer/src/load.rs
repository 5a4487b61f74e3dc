//! Building a [`Tokenizer`] from vocabulary data, as llama.cpp's `llama_vocab::impl::load`: the
//! defaults per model type and pre-tokenizer, token attributes from the token types, special ids,
//! and the tokens llama.cpp recognises by their text (end of turn / generation, fill-in-the-middle,
//! "unused"), including its model-specific quirks.

use crate::decode::render_piece;
use crate::special::attr;
use crate::{bpe, pretok, vocab, Kind, Tokenizer, TokenizerError, VocabSpec};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

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
}
