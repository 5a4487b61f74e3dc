//! Releasing decoded bytes as text only in whole UTF-8 characters.

/// Buffers bytes and releases the longest prefix that is complete UTF-8.
#[derive(Default, Debug)]
pub struct Utf8Buffer {
    pending: Vec<u8>,
}

impl Utf8Buffer {
    /// Adds bytes; returns the text that is now complete. Invalid sequences (which can never become
    /// valid) are replaced by U+FFFD rather than held forever.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[..valid]).expect("validated prefix"),
                    );
                    match e.error_len() {
                        // Incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left, lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_characters_across_pushes() {
        let mut b = Utf8Buffer::default();
        let e = "é".as_bytes();
        assert_eq!(b.push(&[b'a', e[0]]), "a");
        assert_eq!(b.push(&e[1..]), "é");
        assert_eq!(b.push(&[0xff, b'x']), "\u{FFFD}x");
        assert_eq!(b.push(&[0xe2, 0x82]), "");
        assert_eq!(b.finish(), "\u{FFFD}");
    }
}
