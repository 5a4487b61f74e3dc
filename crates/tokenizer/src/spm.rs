//! SentencePiece-style tokenization (`tokenizer.ggml.model = llama`), as llama.cpp's
//! `llm_tokenizer_spm_session`.
//!
//! The (already space-escaped) text starts as one symbol per UTF-8 character. Every adjacent pair
//! whose concatenation is a vocabulary token is queued by that token's score; the best score (leftmost
//! on ties) is merged first. Symbols left that are not tokens fall back to byte tokens `<0xXX>`.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    // Max-heap: higher score first, then the leftmost pair (llama.cpp's comparator).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// What the SPM merge needs from the vocabulary.
pub struct SpmVocab<'a> {
    /// Token text → id.
    pub ids: &'a HashMap<String, u32>,
    /// Scores by id.
    pub scores: &'a [f32],
    /// Byte → its `<0xXX>` token (or the one-byte token).
    pub byte_ids: &'a [Option<u32>; 256],
    /// Fallback when a byte has no token at all (llama.cpp would abort).
    pub unk: Option<u32>,
}

/// Tokenize `text` (spaces already replaced by `▁`) and append the ids to `out`.
pub fn encode(text: &str, v: &SpmVocab<'_>, out: &mut Vec<u32>) {
    let n_chars = text.chars().count();
    let mut syms: Vec<Sym> = Vec::with_capacity(n_chars);
    for (i, (start, c)) in text.char_indices().enumerate() {
        syms.push(Sym {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: if i + 1 < n_chars { Some(i + 1) } else { None },
        });
    }
    let mut queue = BinaryHeap::new();
    let try_add = |queue: &mut BinaryHeap<Bigram>, syms: &[Sym], l: usize, r: usize| {
        let size = syms[l].len + syms[r].len;
        let s = &text[syms[l].start..syms[l].start + size];
        if let Some(&id) = v.ids.get(s) {
            let score = v.scores.get(id as usize).copied().unwrap_or(0.0);
            queue.push(Bigram {
                score,
                left: l,
                right: r,
                size,
            });
        }
    };
    for i in 1..syms.len() {
        try_add(&mut queue, &syms, i - 1, i);
    }
    while let Some(b) = queue.pop() {
        let (ln, rn) = (syms[b.left].len, syms[b.right].len);
        if ln == 0 || rn == 0 || ln + rn != b.size {
            continue;
        }
        syms[b.left].len += rn;
        syms[b.right].len = 0;
        syms[b.left].next = syms[b.right].next;
        if let Some(nx) = syms[b.right].next {
            syms[nx].prev = Some(b.left);
        }
        if let Some(pv) = syms[b.left].prev {
            try_add(&mut queue, &syms, pv, b.left);
        }
        if let Some(nx) = syms[b.left].next {
            try_add(&mut queue, &syms, b.left, nx);
        }
    }
    let mut i = if syms.is_empty() { None } else { Some(0) };
    while let Some(k) = i {
        let s = syms[k];
        if s.len > 0 {
            let piece = &text[s.start..s.start + s.len];
            match v.ids.get(piece) {
                Some(&id) => out.push(id),
                // Only an unmerged character can miss the vocabulary (every merge forms a token),
                // so llama.cpp's `rev_merge` recursion reduces to byte fallback here.
                None => {
                    for &b in piece.as_bytes() {
                        if let Some(id) = v.byte_ids[b as usize].or(v.unk) {
                            out.push(id);
                        }
                    }
                }
            }
        }
        i = s.next;
    }
}
