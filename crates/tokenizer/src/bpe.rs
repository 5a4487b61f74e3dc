//! Byte-pair merging of one pre-tokenized word, as llama.cpp's `llm_tokenizer_bpe_session`.
//!
//! The word starts as one symbol per UTF-8 character. Every adjacent pair that has a merge rule is
//! queued by (rank, position); the lowest rank (leftmost on ties) is merged first, and the pairs
//! around the merged symbol are queued again. Stale queue entries (a side already merged away or
//! grown) are skipped. The result is a list of byte ranges of the word.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// The merge table: `"left right"` → rank (index in `tokenizer.ggml.merges`).
#[derive(Debug, Default)]
pub struct Merges {
    ranks: HashMap<String, u32>,
}

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Merges {
    /// Build from merge strings. As llama.cpp, the split is at the first space after the first
    /// byte, and the first occurrence of a pair keeps its rank.
    pub fn new(merges: &[String]) -> Merges {
        let mut ranks = HashMap::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            let key = match m.as_bytes().iter().skip(1).position(|&b| b == b' ') {
                Some(p) => {
                    let p = p + 1;
                    format!("{} {}", &m[..p], &m[p + 1..])
                }
                None => " ".to_string(),
            };
            ranks.entry(key).or_insert(i as u32);
        }
        Merges { ranks }
    }

    fn rank(&self, key: &mut String, left: &str, right: &str) -> Option<u32> {
        key.clear();
        key.push_str(left);
        key.push(' ');
        key.push_str(right);
        self.ranks.get(key.as_str()).copied()
    }

    /// Merge `word` and return its final symbols as byte ranges `(start, len)`, in order.
    pub fn apply(&self, word: &str) -> Vec<(usize, usize)> {
        let mut syms: Vec<Sym> = Vec::with_capacity(word.len());
        let n_chars = word.chars().count();
        for (i, (start, c)) in word.char_indices().enumerate() {
            syms.push(Sym {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: if i + 1 < n_chars { Some(i + 1) } else { None },
            });
        }
        // (rank, left, right, size): the min-heap pops the lowest rank, then the leftmost pair.
        let mut queue: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
        let mut key = String::new();
        let text = |s: &Sym| &word[s.start..s.start + s.len];
        let mut push = |queue: &mut BinaryHeap<_>, syms: &[Sym], l: usize, r: usize| {
            if let Some(rank) = self.rank(&mut key, text(&syms[l]), text(&syms[r])) {
                queue.push(Reverse((rank, l, r, syms[l].len + syms[r].len)));
            }
        };
        for i in 1..syms.len() {
            push(&mut queue, &syms, i - 1, i);
        }
        while let Some(Reverse((_, l, r, size))) = queue.pop() {
            let (ln, rn) = (syms[l].len, syms[r].len);
            // Symbols only grow rightwards or vanish, so an unchanged total size means both sides
            // are still the pair that was queued (llama.cpp compares the texts; same outcome).
            if ln == 0 || rn == 0 || ln + rn != size {
                continue;
            }
            syms[l].len += rn;
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if let Some(nx) = syms[r].next {
                syms[nx].prev = Some(l);
            }
            if let Some(pv) = syms[l].prev {
                push(&mut queue, &syms, pv, l);
            }
            if let Some(nx) = syms[l].next {
                push(&mut queue, &syms, l, nx);
            }
        }
        let mut out = Vec::new();
        let mut i = if syms.is_empty() { None } else { Some(0) };
        while let Some(k) = i {
            if syms[k].len > 0 {
                out.push((syms[k].start, syms[k].len));
            }
            i = syms[k].next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_lowest_rank_first() {
        let m = Merges::new(&["b c".into(), "a b".into(), "a bc".into()]);
        let w = "abc";
        let parts: Vec<&str> = m.apply(w).iter().map(|&(s, l)| &w[s..s + l]).collect();
        assert_eq!(parts, vec!["abc"]);
        let m = Merges::new(&["a b".into(), "b c".into()]);
        let parts: Vec<&str> = m.apply(w).iter().map(|&(s, l)| &w[s..s + l]).collect();
        assert_eq!(parts, vec!["ab", "c"]);
    }

    #[test]
    fn empty_and_single() {
        let m = Merges::new(&[]);
        assert!(m.apply("").is_empty());
        assert_eq!(m.apply("é"), vec![(0, 2)]);
    }
}
