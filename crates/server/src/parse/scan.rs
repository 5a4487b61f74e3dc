//! Byte-level matching of tags that may be cut off at the end of the text seen so far.
//!
//! Every tag starts with `<` and is ASCII, so positions found here are always char boundaries
//! of the (UTF-8) text, and matching on bytes never slices a multi-byte char.

/// How the text at a position relates to a tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TagMatch {
    /// The text starts with the whole tag.
    Full,
    /// The text is a proper prefix of the tag: the next piece decides.
    Partial,
    /// The text cannot be this tag.
    No,
}

/// Whitespace as llama.cpp's `consume_spaces` and Python's `str.strip()` see it in practice.
pub(super) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Matches `tag` at the start of `s`.
pub(super) fn match_tag(s: &[u8], tag: &str) -> TagMatch {
    let t = tag.as_bytes();
    if s.starts_with(t) {
        TagMatch::Full
    } else if t.starts_with(s) {
        TagMatch::Partial
    } else {
        TagMatch::No
    }
}

/// The first of `tags` that `s` starts with in full, else whether any could still match.
pub(super) fn match_any(s: &[u8], tags: &[&'static str]) -> (TagMatch, &'static str) {
    let mut partial = false;
    for t in tags {
        match match_tag(s, t) {
            TagMatch::Full => return (TagMatch::Full, t),
            TagMatch::Partial => partial = true,
            TagMatch::No => {}
        }
    }
    if partial {
        (TagMatch::Partial, "")
    } else {
        (TagMatch::No, "")
    }
}

/// Longest whitespace run allowed between `<tool_call>` and `<function=` before the block is
/// taken as text; bounds what the parser holds back.
const MAX_OPEN_WS: usize = 256;
/// Longest function name in `<function=NAME>`; bounds what the parser holds back.
const MAX_NAME: usize = 256;

/// The opening of a Qwen3-Coder call after `<tool_call>`: whitespace, `<function=NAME>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum XmlOpen {
    /// Matched: bytes consumed and the function name.
    Full { len: usize, name: String },
    /// The text so far could still become an opening.
    Partial,
    /// Not an opening.
    No,
}

/// Matches whitespace then `<function=NAME>` at the start of `s` (the text after `<tool_call>`).
pub(super) fn match_xml_open(s: &[u8]) -> XmlOpen {
    const FUNC: &str = "<function=";
    let ws = s.iter().take_while(|b| is_ws(**b)).count();
    if ws > MAX_OPEN_WS {
        return XmlOpen::No;
    }
    let rest = &s[ws..];
    if rest.is_empty() {
        return XmlOpen::Partial;
    }
    match match_tag(rest, FUNC) {
        TagMatch::No => return XmlOpen::No,
        TagMatch::Partial => return XmlOpen::Partial,
        TagMatch::Full => {}
    }
    let after = &rest[FUNC.len()..];
    for (i, &b) in after.iter().enumerate() {
        if i > MAX_NAME {
            return XmlOpen::No;
        }
        match b {
            b'>' => {
                let name = String::from_utf8_lossy(&after[..i]).trim().to_string();
                if name.is_empty() {
                    return XmlOpen::No;
                }
                return XmlOpen::Full {
                    len: ws + FUNC.len() + i + 1,
                    name,
                };
            }
            b'<' | b'\n' => return XmlOpen::No,
            _ => {}
        }
    }
    if after.len() > MAX_NAME {
        XmlOpen::No
    } else {
        XmlOpen::Partial
    }
}

/// What follows a `<tool_call>`: which syntax the block is written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BlockOpen {
    /// Whitespace and `<function=NAME>` (Qwen3-Coder XML): bytes consumed and the name.
    Xml { len: usize, name: String },
    /// Whitespace and `{` (Qwen3 JSON); nothing is consumed.
    Json,
    /// The text so far could still become either.
    Partial,
    /// Neither.
    Other,
}

/// Matches the start of a tool-call block at the start of `s` (the text after `<tool_call>`).
/// Both syntaxes are recognised whatever the template teaches, since models fine-tuned on one
/// sometimes write the other.
pub(super) fn match_block_open(s: &[u8]) -> BlockOpen {
    let ws = s.iter().take_while(|b| is_ws(**b)).count();
    if ws > MAX_OPEN_WS {
        return BlockOpen::Other;
    }
    match s.get(ws) {
        None => BlockOpen::Partial,
        Some(b'{') => BlockOpen::Json,
        Some(b'<') => match match_xml_open(s) {
            XmlOpen::Full { len, name } => BlockOpen::Xml { len, name },
            XmlOpen::Partial => BlockOpen::Partial,
            XmlOpen::No => BlockOpen::Other,
        },
        Some(_) => BlockOpen::Other,
    }
}
