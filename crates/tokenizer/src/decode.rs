//! Detokenization as llama.cpp's `token_to_piece` / `llama_detokenize`: byte-level BPE pieces map
//! GPT-2's printable characters back to bytes, SentencePiece pieces turn `▁` into spaces and
//! `<0xXX>` tokens into bytes, control tokens render only on request, and vocabularies with
//! `clean_spaces` get Hugging Face's `clean_up_tokenization_spaces` passes.

use crate::special::attr;
use crate::{unicode, Tokenizer};

impl Tokenizer {
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
}

/// The bytes a token stands for, with `render_special` (llama.cpp's `token_to_piece` cache).
pub(crate) fn render_piece(text: &str, a: u32, spm: bool) -> Vec<u8> {
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
