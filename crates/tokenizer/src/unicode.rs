//! Code-point classes and the GPT-2 byte ↔ unicode mapping, as llama.cpp's `unicode.cpp` uses them.
//!
//! llama.cpp classifies every code point into one regex category (`\p{N}`, `\p{L}`, `\p{Z}`, `\p{M}`,
//! `\p{P}`, `\p{S}`, `\p{C}`) plus a separate "whitespace" flag (the Unicode `White_Space` set, which
//! is what Python's `regex` module calls `\s`). Pre-tokenizers are defined in terms of these classes,
//! so we reproduce them here from the Unicode general category.

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// The code-point is unassigned (`\p{Cn}`; llama.cpp's table keeps it apart from `\p{C}`).
pub const UNDEFINED: u16 = 0x0001;
/// The code-point is a number (`\p{N}`).
pub const NUMBER: u16 = 0x0002;
/// The code-point is a letter (`\p{L}`).
pub const LETTER: u16 = 0x0004;
/// The code-point is a separator (`\p{Z}`).
pub const SEPARATOR: u16 = 0x0008;
/// The code-point is a combining mark (`\p{M}`).
pub const ACCENT_MARK: u16 = 0x0010;
/// The code-point is punctuation (`\p{P}`).
pub const PUNCTUATION: u16 = 0x0020;
/// The code-point is a symbol (`\p{S}`).
pub const SYMBOL: u16 = 0x0040;
/// The code-point is a control, format or private-use code point (`\p{C}` but `\p{Cn}`).
pub const CONTROL: u16 = 0x0080;
/// Mask of the category bits above.
pub const MASK_CATEGORIES: u16 = 0x00FF;
/// The code-point is whitespace (Unicode `White_Space`).
pub const WHITESPACE: u16 = 0x0100;

/// Flags of one code point; `0` means "outside the text" (llama.cpp's default-constructed flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags(pub u16);

impl Flags {
    /// `\p{N}`.
    pub fn is_number(self) -> bool {
        self.0 & NUMBER != 0
    }
    /// `\p{L}`.
    pub fn is_letter(self) -> bool {
        self.0 & LETTER != 0
    }
    /// `\s`.
    pub fn is_whitespace(self) -> bool {
        self.0 & WHITESPACE != 0
    }
    /// Any flag at all (llama.cpp's `as_uint() != 0`).
    pub fn any(self) -> bool {
        self.0 != 0
    }
    /// The category bits alone.
    pub fn category(self) -> u16 {
        self.0 & MASK_CATEGORIES
    }
}

/// The Unicode `White_Space` property: llama.cpp's `unicode_set_whitespace`.
fn is_white_space(cp: u32) -> bool {
    matches!(
        cp,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

/// The flags of a code point.
///
/// llama.cpp's table (unicode-data.cpp) is Unicode 15.1. The `unicode-general-category` crate is
/// pinned to its Unicode 15.0 release, and the 15.1 additions are patched in here, so that the two
/// agree on every code point: newer Unicode versions would classify code points that llama.cpp
/// still treats as unassigned.
pub fn flags(c: char) -> Flags {
    let cp = c as u32;
    let cat = match cp {
        // Unicode 15.1: ideographic description characters and a CJK stroke (So) ...
        0x2FFC..=0x2FFF | 0x31EF => SYMBOL,
        // ... and CJK Unified Ideographs Extension I (Lo).
        0x2EBF0..=0x2EE5D => LETTER,
        _ => category(c),
    };
    let ws = if is_white_space(cp) { WHITESPACE } else { 0 };
    Flags(cat | ws)
}

fn category(c: char) -> u16 {
    match get_general_category(c) {
        G::UppercaseLetter
        | G::LowercaseLetter
        | G::TitlecaseLetter
        | G::ModifierLetter
        | G::OtherLetter => LETTER,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => NUMBER,
        G::SpaceSeparator | G::LineSeparator | G::ParagraphSeparator => SEPARATOR,
        G::NonspacingMark | G::SpacingMark | G::EnclosingMark => ACCENT_MARK,
        G::ConnectorPunctuation
        | G::DashPunctuation
        | G::OpenPunctuation
        | G::ClosePunctuation
        | G::InitialPunctuation
        | G::FinalPunctuation
        | G::OtherPunctuation => PUNCTUATION,
        G::MathSymbol | G::CurrencySymbol | G::ModifierSymbol | G::OtherSymbol => SYMBOL,
        G::Unassigned => UNDEFINED,
        // Control, format, surrogate, private use (and any future category).
        _ => CONTROL,
    }
}

/// GPT-2's byte → printable code point table (`bytes_to_unicode` in OpenAI's encoder.py).
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut assigned = [false; 256];
    for b in (0x21u32..=0x7E).chain(0xA1..=0xAC).chain(0xAE..=0xFF) {
        // Infallible: every value here is a valid scalar below 0x100.
        table[b as usize] = char::from_u32(b).unwrap_or('\0');
        assigned[b as usize] = true;
    }
    let mut n = 0u32;
    for b in 0..256usize {
        if !assigned[b] {
            table[b] = char::from_u32(256 + n).unwrap_or('\0');
            n += 1;
        }
    }
    table
}

/// The byte a GPT-2 byte-level character stands for, if any.
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(cp as u8),
        0x100..=0x143 => {
            // The 68 bytes that are not printable, in increasing order.
            let n = (cp - 0x100) as usize;
            (0u32..256)
                .filter(|b| !matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF))
                .nth(n)
                .map(|b| b as u8)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_round_trips() {
        let t = byte_to_char_table();
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
    }

    #[test]
    fn classes() {
        assert!(flags('a').is_letter());
        assert!(flags('中').is_letter());
        assert!(flags('٣').is_number());
        assert!(flags('\u{3000}').is_whitespace());
        assert!(!flags('\u{1C}').is_whitespace());
        assert_eq!(flags('~').category(), SYMBOL);
    }
}
