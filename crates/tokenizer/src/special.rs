//! Splitting text around special tokens, as llama.cpp's `tokenizer_st_partition`.
//!
//! Special tokens (control, user-defined and unknown) are tried longest first; each occurrence in a
//! still-unprocessed text fragment becomes a token fragment, and the text around it is searched for
//! the next special token. Control and unknown tokens are only matched when the caller asks
//! (`parse_special`); user-defined tokens always are, as in llama.cpp and Hugging Face. Tokens with
//! the `lstrip` / `rstrip` attribute swallow the ASCII whitespace before / after them.

/// Token attribute bits, as llama.cpp's `llama_token_attr`.
pub mod attr {
    /// Undefined type.
    pub const UNDEFINED: u32 = 0;
    /// Unknown token.
    pub const UNKNOWN: u32 = 1 << 0;
    /// Unused token.
    pub const UNUSED: u32 = 1 << 1;
    /// Normal token.
    pub const NORMAL: u32 = 1 << 2;
    /// Control token.
    pub const CONTROL: u32 = 1 << 3;
    /// User-defined token.
    pub const USER_DEFINED: u32 = 1 << 4;
    /// Byte token.
    pub const BYTE: u32 = 1 << 5;
    /// Strip whitespace on the left when matched.
    pub const LSTRIP: u32 = 1 << 7;
    /// Strip whitespace on the right when matched.
    pub const RSTRIP: u32 = 1 << 8;
}

/// A piece of the input: raw text still to be tokenized, or a matched special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment {
    /// Byte range `start..start + len` of the input text.
    Text(usize, usize),
    /// A special token id.
    Token(u32),
}

/// C's `isspace` in the "C" locale, which llama.cpp uses for lstrip / rstrip.
fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Partition `text` around the special tokens `specials` (ids in matching order, with their texts
/// and attributes looked up through `token`).
pub fn partition<'a>(
    text: &str,
    specials: &[u32],
    token: impl Fn(u32) -> (&'a str, u32),
    parse_special: bool,
) -> Vec<Fragment> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Fragment::Text(0, text.len()));
    let bytes = text.as_bytes();
    for &id in specials {
        let (tok, at) = token(id);
        if !parse_special && at & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        if tok.is_empty() {
            continue;
        }
        // Cheap pre-check: most special tokens do not occur at all.
        if !text.contains(tok) {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Fragment::Text(mut base, mut len) = f else {
                next.push(f);
                continue;
            };
            loop {
                let Some(rel) = text[base..base + len].find(tok) else {
                    if len > 0 {
                        next.push(Fragment::Text(base, len));
                    }
                    break;
                };
                let m = base + rel;
                if m > base {
                    let mut left = m - base;
                    if at & attr::LSTRIP != 0 {
                        while left > 0 && c_isspace(bytes[base + left - 1]) {
                            left -= 1;
                        }
                    }
                    if left > 0 {
                        next.push(Fragment::Text(base, left));
                    }
                }
                next.push(Fragment::Token(id));
                let end = m + tok.len();
                if end < base + len {
                    let mut r_off = end;
                    let mut r_len = base + len - end;
                    if at & attr::RSTRIP != 0 {
                        while r_len > 0 && c_isspace(bytes[r_off]) {
                            r_off += 1;
                            r_len -= 1;
                        }
                    }
                    base = r_off;
                    len = r_len;
                    if len == 0 {
                        break;
                    }
                } else {
                    break;
                }
            }
        }
        frags = next;
    }
    frags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, parse: bool) -> Vec<Fragment> {
        let toks = [
            ("<|im_end|>", attr::CONTROL),
            ("<think>", attr::USER_DEFINED),
        ];
        partition(text, &[0, 1], |id| toks[id as usize], parse)
    }

    #[test]
    fn control_only_when_asked() {
        use Fragment::*;
        assert_eq!(
            run("a<|im_end|>b", true),
            vec![Text(0, 1), Token(0), Text(11, 1)]
        );
        assert_eq!(run("a<|im_end|>b", false), vec![Text(0, 12)]);
        assert_eq!(
            run("<think>x<think>", false),
            vec![Token(1), Text(7, 1), Token(1)]
        );
        assert_eq!(run("", true), vec![]);
    }
}
