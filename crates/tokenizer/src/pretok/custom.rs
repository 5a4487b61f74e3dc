//! llama.cpp's hand-written splitters for the GPT-2, Llama 3 and Qwen2 regexes
//! (`unicode_regex_split_custom_gpt2` / `_llama3` / `_qwen2`), ported line by line: they are what
//! llama.cpp runs for those regexes, and they may differ from a regex engine in corner cases.

use crate::unicode::Flags;

/// Port of llama.cpp's `unicode_regex_split_custom_gpt2`.
pub(super) fn split_gpt2(cpts: &[char], all_flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
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

/// Port of llama.cpp's `unicode_regex_split_custom_llama3` (`max_digits` = 3) and
/// `unicode_regex_split_custom_qwen2` (the same with `\p{N}` alone: `max_digits` = 1).
pub(super) fn split_llama3(
    cpts: &[char],
    all_flags: &[Flags],
    offsets: &[usize],
    max_digits: usize,
) -> Vec<usize> {
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
            // \p{N}{1,3} (Qwen2: \p{N})
            if flags.is_number() {
                let mut i0 = pos;
                while fl(pos).is_number() {
                    pos += 1;
                    if pos - i0 >= max_digits {
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
