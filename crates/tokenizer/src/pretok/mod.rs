//! Pre-tokenizers: split text into words before BPE, exactly as llama.cpp's `unicode_regex_split`.
//!
//! `tokenizer.ggml.pre` names a list of regexes (llama-vocab.cpp, `llm_tokenizer_bpe`). Each regex
//! splits every piece produced by the previous one further; text that no match covers stays a piece
//! of its own. llama.cpp runs them in three ways, and we copy each because they do not always agree
//! with a textbook regex engine:
//!
//! - the GPT-2, Llama-3 and Qwen2 regexes have hand-written matchers
//!   (`unicode_regex_split_custom_*`), ported here line by line;
//! - a regex that uses `\p{..}` runs on a "collapsed" text in which every non-ASCII code point is
//!   replaced by one stand-in per class (letter, number, punctuation, mark, symbol, other; non-ASCII
//!   whitespace becomes `\x0B`), and each `\p{X}` by a class of that stand-in plus X's ASCII members;
//! - any other regex runs on the text itself, with non-ASCII whitespace replaced by `\x0B`.
//!
//! We use private-use characters as the stand-ins and `fancy-regex` (backtracking, leftmost-first
//! like ECMAScript `std::regex`, with the look-arounds these patterns need).

mod custom;
mod table;

pub use table::pre_config;

use crate::error::TokenizerError;
use crate::unicode::{self, Flags};
use custom::{split_gpt2, split_llama3};
use fancy_regex::Regex;
use table::{GPT2, LLAMA3, LLAMA3_ORIG, QWEN2};

/// How one regex of the list is matched.
#[derive(Debug)]
enum Splitter {
    Gpt2,
    Llama3,
    Qwen2,
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
            } else if e == QWEN2 {
                Splitter::Qwen2
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
                Splitter::Llama3 => split_llama3(&cpts, &flags, &offsets, 3),
                Splitter::Qwen2 => split_llama3(&cpts, &flags, &offsets, 1),
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
