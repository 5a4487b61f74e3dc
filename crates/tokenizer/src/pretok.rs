//! Pre-tokenizers: split text into words before BPE, exactly as llama.cpp's `unicode_regex_split`.
//!
//! `tokenizer.ggml.pre` names a list of regexes (llama-vocab.cpp, `llm_tokenizer_bpe`). Each regex
//! splits every piece produced by the previous one further; text that no match covers stays a piece
//! of its own. llama.cpp runs them in three ways, and we copy each because they do not always agree
//! with a textbook regex engine:
//!
//! - the GPT-2 and Llama-3 regexes have hand-written matchers (`unicode_regex_split_custom_*`), ported
//!   here line by line;
//! - a regex that uses `\p{..}` runs on a "collapsed" text in which every non-ASCII code point is
//!   replaced by one stand-in per class (letter, number, punctuation, mark, symbol, other; non-ASCII
//!   whitespace becomes `\x0B`), and each `\p{X}` by a class of that stand-in plus X's ASCII members;
//! - any other regex runs on the text itself, with non-ASCII whitespace replaced by `\x0B`.
//!
//! We use private-use characters as the stand-ins and `fancy-regex` (backtracking, leftmost-first
//! like ECMAScript `std::regex`, with the look-arounds these patterns need).

use crate::error::TokenizerError;
use crate::unicode::{self, Flags};
use fancy_regex::Regex;

/// GPT-2's regex; llama.cpp matches it with a hand-written splitter.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's regex (case-insensitive contractions spelled out); hand-written splitter in llama.cpp.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The same regex as in the tokenizer.json of Llama 3; llama.cpp routes it to the same splitter.
const LLAMA3_ORIG: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// DeepSeek LLM's letters and punctuation, code point for code point as in llama-vocab.cpp (spelled
// with escapes: several of these code points have canonical singleton decompositions that any
// normalizing editor would silently change, e.g. U+2126 OHM SIGN -> U+03A9).
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";
const DEEPSEEK_LLM_PUNCT: &str =
    "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+";
// [一-龥ࠀ-一가-퟿]+, spelled with escapes so that no editor or normalizer can touch it.
const CJK: &str = "[\u{4E00}-\u{9FA5}\u{0800}-\u{4E00}\u{AC00}-\u{D7FF}]+";
const DEEPSEEK3_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const PORO: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const UFAKZEKA: &str =
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What a `tokenizer.ggml.pre` value selects in llama.cpp (llama-vocab.cpp, `load`).
#[derive(Clone, Debug)]
pub struct PreConfig {
    /// The regexes, applied in order.
    pub regexes: Vec<&'static str>,
    /// `clean_spaces`: detokenizer removes spaces before punctuation (`clean_up_tokenization_spaces`).
    pub clean_spaces: bool,
    /// `ignore_merges`: a word that is a whole token is taken as is, without BPE.
    pub ignore_merges: bool,
    /// Default of `add_bos` before `tokenizer.ggml.add_bos_token` overrides it.
    pub add_bos: bool,
    /// The BOS token is disabled by default (ChatGLM).
    pub no_bos: bool,
}

/// The configuration of a pre-tokenizer name, or `None` when llama.cpp does not know it (or we do
/// not support it: then we refuse to guess rather than tokenize differently).
pub fn pre_config(name: &str) -> Option<PreConfig> {
    let cfg = |regexes: Vec<&'static str>, clean_spaces: bool| PreConfig {
        regexes,
        clean_spaces,
        ignore_merges: false,
        add_bos: false,
        no_bos: false,
    };
    let default = || vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"];
    let starcoder = || vec![r"\p{N}", GPT2];
    Some(match name {
        // llama.cpp warns and uses `default` when the key is missing; we get "" for a missing key.
        "" | "default" => cfg(default(), true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreConfig {
            ignore_merges: true,
            add_bos: true,
            ..cfg(vec![LLAMA3], true)
        },
        "deepseek-llm" => cfg(
            vec![
                "[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                DEEPSEEK_LLM_PUNCT,
                r"\s+$",
                CJK,
                r"\p{N}+",
            ],
            false,
        ),
        "deepseek-coder" => cfg(
            vec!["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"],
            false,
        ),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => cfg(
            vec![
                r"\p{N}{1,3}",
                "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
                DEEPSEEK3_MAIN,
            ],
            false,
        ),
        "falcon" => cfg(
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            true,
        ),
        "mpt" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
        | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" | "olmo" | "jais" => {
            cfg(vec![GPT2], true)
        }
        "trillion" | "granite-docling" => cfg(vec![GPT2], false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            cfg(starcoder(), true)
        }
        "command-r" | "smollm" => cfg(starcoder(), false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" => {
            cfg(vec![QWEN2], false)
        }
        "megrez" | "stablelm2" => cfg(vec![QWEN2], true),
        "qwen35" => cfg(vec![QWEN35], false),
        "dbrx" | "smaug-bpe" => cfg(vec![LLAMA3], true),
        "poro-chat" => cfg(vec![PORO], false),
        "bloom" | "gpt3-finnish" => cfg(vec![PORO], true),
        "glm4" | "chatglm-bpe" => PreConfig {
            no_bos: true,
            ..cfg(vec![LLAMA3], true)
        },
        "viking" => cfg(vec![PORO, r"\p{N}"], false),
        "tekken" => PreConfig {
            ignore_merges: true,
            add_bos: true,
            ..cfg(vec![TEKKEN], false)
        },
        "chameleon" => PreConfig {
            add_bos: true,
            ..cfg(
                vec![
                    "<sentinel:[0-9]+>",
                    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                    "([\\t\\n]|    |  )",
                    r"\p{N}",
                    r"[\p{P}!-/:-@\[-`{-~]",
                    GPT2,
                ],
                false,
            )
        },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => cfg(vec![GPT4O], false),
        "seed-coder" => cfg(vec![SEED_CODER], false),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => cfg(vec![BAILINGMOE], false),
        "grok-2" => cfg(vec![QWEN2], false),
        "ufakzeka" => cfg(vec![UFAKZEKA], false),
        _ => return None,
    })
}

/// How one regex of the list is matched.
#[derive(Debug)]
enum Splitter {
    Gpt2,
    Llama3,
    /// On the collapsed text, with `\p{..}` rewritten.
    Collapsed(Box<Regex>),
    /// On the text itself (non-ASCII whitespace as `\x0B`).
    Raw(Box<Regex>),
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub struct PreTokenizer {
    splitters: Vec<Splitter>,
}

// Stand-ins for non-ASCII code points in the collapsed text (llama.cpp uses bytes 0xD0..0xD5).
const REP_OTHER: char = '\u{E000}';
const REP_NUMBER: char = '\u{E001}';
const REP_LETTER: char = '\u{E002}';
const REP_PUNCT: char = '\u{E003}';
const REP_ACCENT: char = '\u{E004}';
const REP_SYMBOL: char = '\u{E005}';

/// The stand-in and ASCII members of a `\p{..}` class, as llama.cpp's `k_ucat_cpt` / `k_ucat_map`.
fn ucat(pat: &str) -> Option<(char, &'static str)> {
    Some(match pat {
        r"\p{N}" => (REP_NUMBER, "0-9"),
        r"\p{L}" | r"\p{Lu}" | r"\p{Ll}" | r"\p{Lt}" | r"\p{Lm}" | r"\p{Lo}" => {
            (REP_LETTER, "A-Za-z")
        }
        // llama.cpp's ASCII punctuation: !-#%-*,-/:-;?-@[-]_{}
        r"\p{P}" => (REP_PUNCT, r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
        r"\p{M}" => (REP_ACCENT, ""),
        // llama.cpp's ASCII symbols: $+<=>^`|~ (older llama.cpp left out '~'; the current one, which
        // our oracle vectors come from, has it).
        r"\p{S}" => (REP_SYMBOL, r"\$\+<->\^`\|~"),
        _ => return None,
    })
}

/// Rewrite a regex for the collapsed text, as llama.cpp's `unicode_regex_split` does.
fn collapse_regex(expr: &str) -> Result<String, TokenizerError> {
    if !expr.is_ascii() {
        return Err(TokenizerError::Regex {
            regex: expr.to_string(),
            reason: "unicode categories and non-ASCII characters together are not supported".into(),
        });
    }
    let b = expr.as_bytes();
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && c == b']' && i > 0 && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if c == b'\\' && i + 3 < b.len() && b[i + 1] == b'p' && b[i + 2] == b'{' {
            if let Some(rel) = expr[i + 3..].find('}') {
                let closing = i + 3 + rel;
                if closing <= i + 10 {
                    if let Some((rep, ascii)) = ucat(&expr[i..=closing]) {
                        if !inside {
                            out.push('[');
                        }
                        out.push(rep);
                        out.push_str(ascii);
                        if !inside {
                            out.push(']');
                        }
                        i = closing + 1;
                        continue;
                    }
                }
            }
        }
        out.push(c as char);
        i += 1;
    }
    Ok(out)
}

fn uses_categories(expr: &str) -> bool {
    [
        r"\p{N}", r"\p{L}", r"\p{P}", r"\p{M}", r"\p{S}", r"\p{Lu}", r"\p{Ll}", r"\p{Lt}",
        r"\p{Lm}", r"\p{Lo}",
    ]
    .iter()
    .any(|p| expr.contains(p))
}

fn compile(expr: &str) -> Result<Regex, TokenizerError> {
    fancy_regex::RegexBuilder::new(expr)
        .backtrack_limit(100_000_000)
        .build()
        .map_err(|e| TokenizerError::Regex {
            regex: expr.to_string(),
            reason: e.to_string(),
        })
}

impl PreTokenizer {
    /// Compile a list of regexes.
    pub fn new(exprs: &[&str]) -> Result<PreTokenizer, TokenizerError> {
        let mut splitters = Vec::with_capacity(exprs.len());
        for &e in exprs {
            let s = if e == GPT2 {
                Splitter::Gpt2
            } else if e == LLAMA3 || e == LLAMA3_ORIG {
                Splitter::Llama3
            } else if uses_categories(e) {
                Splitter::Collapsed(Box::new(compile(&collapse_regex(e)?)?))
            } else {
                Splitter::Raw(Box::new(compile(e)?))
            };
            splitters.push(s);
        }
        Ok(PreTokenizer { splitters })
    }

    /// Split `text` into words. With `byte_encode`, each word's UTF-8 bytes are mapped to GPT-2's
    /// printable characters (the form in which byte-level BPE vocabularies store tokens).
    pub fn split(&self, text: &str, byte_encode: bool) -> Vec<String> {
        let cpts: Vec<char> = text.chars().collect();
        if cpts.is_empty() {
            return Vec::new();
        }
        let flags: Vec<Flags> = cpts.iter().map(|&c| unicode::flags(c)).collect();
        let mut collapsed: Option<Vec<char>> = None;
        let mut raw: Option<Vec<char>> = None;
        let mut offsets = vec![cpts.len()];
        for s in &self.splitters {
            offsets = match s {
                Splitter::Gpt2 => split_gpt2(&cpts, &flags, &offsets),
                Splitter::Llama3 => split_llama3(&cpts, &flags, &offsets),
                Splitter::Collapsed(re) => {
                    let t = collapsed.get_or_insert_with(|| collapse_text(&cpts, &flags));
                    split_regex(re, t, &offsets)
                }
                Splitter::Raw(re) => {
                    let t = raw.get_or_insert_with(|| {
                        cpts.iter()
                            .zip(&flags)
                            .map(|(&c, f)| {
                                if (c as u32) > 0x7F && f.is_whitespace() {
                                    '\x0B'
                                } else {
                                    c
                                }
                            })
                            .collect()
                    });
                    split_regex(re, t, &offsets)
                }
            };
        }
        let table = if byte_encode {
            Some(unicode::byte_to_char_table())
        } else {
            None
        };
        let mut words = Vec::with_capacity(offsets.len());
        let mut start = 0;
        let mut buf = [0u8; 4];
        for &len in &offsets {
            let end = (start + len).min(cpts.len());
            let mut w = String::new();
            for &c in &cpts[start..end] {
                match &table {
                    Some(t) => {
                        for &b in c.encode_utf8(&mut buf).as_bytes() {
                            w.push(t[b as usize]);
                        }
                    }
                    None => w.push(c),
                }
            }
            words.push(w);
            start = end;
        }
        words
    }
}

fn collapse_text(cpts: &[char], flags: &[Flags]) -> Vec<char> {
    cpts.iter()
        .zip(flags)
        .map(|(&c, f)| {
            if (c as u32) < 128 {
                c
            } else if f.is_whitespace() {
                '\x0B'
            } else {
                match f.category() {
                    unicode::NUMBER => REP_NUMBER,
                    unicode::LETTER => REP_LETTER,
                    unicode::PUNCTUATION => REP_PUNCT,
                    unicode::ACCENT_MARK => REP_ACCENT,
                    unicode::SYMBOL => REP_SYMBOL,
                    _ => REP_OTHER,
                }
            }
        })
        .collect()
}

/// Run a regex over each piece, as llama.cpp's `unicode_regex_split_stl`: matches and the gaps
/// between them become pieces. Lengths are in code points.
fn split_regex(re: &Regex, text: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    for &len in offsets {
        let chunk: String = text[start..start + len].iter().collect();
        // Walk matches in order, converting byte offsets to code-point counts as we go.
        let mut byte_pos = 0usize;
        let mut cpt_pos = 0usize;
        let mut prev_end = 0usize; // in code points
        let to_cpt = |byte: usize, byte_pos: &mut usize, cpt_pos: &mut usize| {
            if byte > *byte_pos {
                *cpt_pos += chunk[*byte_pos..byte].chars().count();
                *byte_pos = byte;
            }
            *cpt_pos
        };
        for m in re.find_iter(&chunk) {
            // A backtracking-limit error leaves the rest of the piece unsplit rather than panic.
            let Ok(m) = m else { break };
            let s = to_cpt(m.start(), &mut byte_pos, &mut cpt_pos);
            let e = to_cpt(m.end(), &mut byte_pos, &mut cpt_pos);
            if s > prev_end {
                out.push(s - prev_end);
            }
            if e > s {
                out.push(e - s);
            }
            prev_end = e;
        }
        if prev_end < len {
            out.push(len - prev_end);
        }
        start += len;
    }
    out
}

/// Port of llama.cpp's `unicode_regex_split_custom_gpt2`.
fn split_gpt2(cpts: &[char], all_flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    for &offset in offsets {
        let ini = start;
        let end = start + offset;
        start = end;
        let cpt = |p: usize| -> Option<char> {
            if ini <= p && p < end {
                Some(cpts[p])
            } else {
                None
            }
        };
        let fl = |p: usize| -> Flags {
            if ini <= p && p < end {
                all_flags[p]
            } else {
                Flags::default()
            }
        };
        let mut prev_end = ini;
        let mut add = |e: usize, out: &mut Vec<usize>| -> usize {
            let len = e - prev_end;
            if len > 0 {
                out.push(len);
            }
            prev_end = e;
            len
        };
        let mut pos = ini;
        while pos < end {
            let c = cpt(pos);
            let flags = fl(pos);
            // 's|'t|'re|'ve|'m|'ll|'d
            if c == Some('\'') && pos + 1 < end {
                let n = cpt(pos + 1);
                if matches!(n, Some('s' | 't' | 'm' | 'd')) {
                    pos += add(pos + 2, &mut out);
                    continue;
                }
                if pos + 2 < end {
                    let nn = cpt(pos + 2);
                    if matches!(
                        (n, nn),
                        (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
                    ) {
                        pos += add(pos + 3, &mut out);
                        continue;
                    }
                }
            }
            let space = c == Some(' ');
            let mut flags2 = if space { fl(pos + 1) } else { flags };
            // <space>?\p{L}+
            if flags2.is_letter() {
                pos += space as usize;
                while flags2.is_letter() {
                    pos += 1;
                    flags2 = fl(pos);
                }
                add(pos, &mut out);
                continue;
            }
            // <space>?\p{N}+
            if flags2.is_number() {
                pos += space as usize;
                while flags2.is_number() {
                    pos += 1;
                    flags2 = fl(pos);
                }
                add(pos, &mut out);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+
            let other =
                |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
            if other(flags2) {
                pos += space as usize;
                while other(flags2) {
                    pos += 1;
                    flags2 = fl(pos);
                }
                add(pos, &mut out);
                continue;
            }
            let mut num_ws = 0;
            while fl(pos + num_ws).is_whitespace() {
                num_ws += 1;
            }
            // \s+(?!\S)
            if num_ws > 1 && cpt(pos + num_ws).is_some() {
                pos += num_ws - 1;
                add(pos, &mut out);
                continue;
            }
            // \s+
            if num_ws > 0 {
                pos += num_ws;
                add(pos, &mut out);
                continue;
            }
            // no match
            pos += 1;
            add(pos, &mut out);
        }
    }
    out
}

fn lower(c: Option<char>) -> Option<char> {
    c.map(|c| c.to_lowercase().next().unwrap_or(c))
}

/// Port of llama.cpp's `unicode_regex_split_custom_llama3`.
fn split_llama3(cpts: &[char], all_flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    for &offset in offsets {
        let ini = start;
        let end = start + offset;
        start = end;
        let cpt = |p: usize| -> Option<char> {
            if ini <= p && p < end {
                Some(cpts[p])
            } else {
                None
            }
        };
        let fl = |p: usize| -> Flags {
            if ini <= p && p < end {
                all_flags[p]
            } else {
                Flags::default()
            }
        };
        let mut prev_end = ini;
        let mut add = |e: usize, out: &mut Vec<usize>| -> usize {
            let len = e - prev_end;
            if len > 0 {
                out.push(len);
            }
            prev_end = e;
            len
        };
        let mut pos = ini;
        while pos < end {
            let c = cpt(pos);
            let flags = fl(pos);
            // (?i:'s|'t|'re|'ve|'m|'ll|'d)
            if c == Some('\'') && pos + 1 < end {
                let n = lower(cpt(pos + 1));
                if matches!(n, Some('s' | 't' | 'm' | 'd')) {
                    pos += add(pos + 2, &mut out);
                    continue;
                }
                if pos + 2 < end {
                    let nn = lower(cpt(pos + 2));
                    if matches!(
                        (n, nn),
                        (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
                    ) {
                        pos += add(pos + 3, &mut out);
                        continue;
                    }
                }
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(c == Some('\r') || c == Some('\n') || flags.is_number())
                && (flags.is_letter() || fl(pos + 1).is_letter())
            {
                pos += 1;
                while fl(pos).is_letter() {
                    pos += 1;
                }
                add(pos, &mut out);
                continue;
            }
            // \p{N}{1,3}
            if flags.is_number() {
                let mut i0 = pos;
                while fl(pos).is_number() {
                    pos += 1;
                    if pos - i0 >= 3 {
                        add(pos, &mut out);
                        i0 = pos;
                    }
                }
                add(pos, &mut out);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (llama.cpp tests `flags`, not `flags2`, first)
            let space = c == Some(' ');
            let mut flags2 = if space { fl(pos + 1) } else { flags };
            if !(flags2.is_whitespace() || flags2.is_letter() || flags2.is_number()) && flags.any()
            {
                pos += space as usize;
                while !(flags2.is_whitespace() || flags2.is_letter() || flags2.is_number())
                    && flags2.any()
                {
                    pos += 1;
                    flags2 = fl(pos);
                }
                while matches!(cpt(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                add(pos, &mut out);
                continue;
            }
            let mut num_ws = 0;
            let mut last_rn = 0;
            while fl(pos + num_ws).is_whitespace() {
                if matches!(cpt(pos + num_ws), Some('\r' | '\n')) {
                    last_rn = pos + num_ws + 1;
                }
                num_ws += 1;
            }
            // \s*[\r\n]+
            if last_rn > 0 {
                pos = last_rn;
                add(pos, &mut out);
                continue;
            }
            // \s+(?!\S)
            if num_ws > 1 && cpt(pos + num_ws).is_some() {
                pos += num_ws - 1;
                add(pos, &mut out);
                continue;
            }
            // \s+
            if num_ws > 0 {
                pos += num_ws;
                add(pos, &mut out);
                continue;
            }
            pos += 1;
            add(pos, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[&str] = &[
        "",
        "default",
        "llama-bpe",
        "deepseek-llm",
        "deepseek-coder",
        "deepseek-v3",
        "falcon",
        "gpt-2",
        "starcoder",
        "smollm",
        "qwen2",
        "qwen35",
        "poro-chat",
        "chatglm-bpe",
        "viking",
        "tekken",
        "chameleon",
        "gpt-4o",
        "seed-coder",
        "bailingmoe",
        "ufakzeka",
    ];

    #[test]
    fn every_known_pre_tokenizer_compiles() {
        for name in ALL {
            let cfg = pre_config(name).unwrap();
            let pt = PreTokenizer::new(&cfg.regexes).unwrap_or_else(|e| panic!("{name}: {e}"));
            // Smoke: splitting never loses text.
            let text = "Hello, y'all! 3333 日本語  \n\n\tok 🦙";
            let words = pt.split(text, false);
            assert_eq!(words.concat(), text, "{name}");
        }
        assert!(pre_config("no-such-pre").is_none());
    }

    #[test]
    fn qwen2_splits_digits_and_spaces() {
        let pt = PreTokenizer::new(&[QWEN2]).unwrap();
        assert_eq!(
            pt.split("ab 123  cd\n\n x", false),
            vec!["ab", " ", "1", "2", "3", " ", " cd", "\n\n", " x"]
        );
    }

    #[test]
    fn gpt2_custom() {
        let pt = PreTokenizer::new(&[GPT2]).unwrap();
        assert_eq!(
            pt.split("Hello world's  end!!", false),
            vec!["Hello", " world", "'s", " ", " end", "!!"]
        );
    }
}
