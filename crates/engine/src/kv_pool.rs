//! Ownership of the KV pool's blocks: refcounts, the free list, and the prefix cache.
//!
//! Every block is in exactly one state:
//! - **held**: one or more sequences have it in their block table (`refs > 0`);
//! - **cached**: no sequence holds it, but it is indexed as a known prefix block (in the LRU);
//! - **free**: nothing worth keeping.
//!
//! Full blocks are indexed by a hash chain: block `i` of a token sequence has the hash
//! `h_i = xxh3_128(h_{i-1} ‖ its BLOCK token ids)` with `h_{-1} = 0`, so equal hashes mean equal
//! whole prefixes, and a prompt's longest cached prefix is found block by block from its start,
//! whichever conversation computed it. A finished sequence's last, partial block is indexed too (by
//! its parent's hash and its tokens), so the next turn of a conversation can copy the rows it shares
//! instead of recomputing up to a block of tokens. Full blocks are immutable once indexed (a sequence
//! only writes at or after its own length, which is past every block it shares); a partial block is
//! never written again either: its reusers take a copy (copy-on-write at the last partial block).
//!
//! When a block is needed and none is free, the least recently used cached block is evicted. A
//! released sequence's blocks enter the LRU deepest first, so a conversation's tail goes before its
//! head, and a head shared by many conversations stays longest.
//!
//! This module is bookkeeping only; the data lives in [`hearth_model::KvCache`].

use std::collections::{BTreeMap, HashMap};

use hearth_model::KV_BLOCK as BLOCK;

/// The hash of a block of tokens that follows a prefix with hash `parent`.
pub fn chain(parent: u128, tokens: &[u32]) -> u128 {
    let mut bytes = Vec::with_capacity(16 + 4 * tokens.len());
    bytes.extend_from_slice(&parent.to_le_bytes());
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_128(&bytes)
}

/// The hash chain of the full blocks of `tokens`.
pub fn chain_all(tokens: &[u32]) -> Vec<u128> {
    let mut h = 0;
    tokens
        .chunks_exact(BLOCK)
        .map(|b| {
            h = chain(h, b);
            h
        })
        .collect()
}

#[derive(Clone, Default)]
struct Meta {
    refs: u32,
    /// Indexed: under `children[parent]`, and in `full` when it is full.
    indexed: bool,
    parent: u128,
    /// Its hash when it is full and indexed.
    hash: Option<u128>,
    /// The tokens of its rows (indexed blocks only).
    tokens: Vec<u32>,
    /// LRU key while cached.
    tick: u64,
}

/// A cached prefix found for a prompt.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Match {
    /// Full blocks shared from the start of the prompt, with their hashes.
    pub full: Vec<(u32, u128)>,
    /// A block whose first `rows` tokens continue the prompt after `full`: to be copied.
    pub partial: Option<(u32, usize)>,
}

impl Match {
    /// Tokens covered.
    pub fn tokens(&self) -> usize {
        self.full.len() * BLOCK + self.partial.map_or(0, |p| p.1)
    }
}

/// A cached block taken back for reuse: what it held, for the disk tier.
#[derive(Debug)]
pub struct Evicted {
    /// Its hash, when it was a full block.
    pub hash: Option<u128>,
    /// Its tokens.
    pub tokens: Vec<u32>,
}

/// Refcounts, free list, LRU and prefix index of a pool of blocks.
pub struct BlockPool {
    meta: Vec<Meta>,
    free: Vec<u32>,
    lru: BTreeMap<u64, u32>,
    full: HashMap<u128, u32>,
    children: HashMap<u128, Vec<u32>>,
    tick: u64,
}

impl BlockPool {
    /// A pool of `n` free blocks.
    pub fn new(n: usize) -> BlockPool {
        BlockPool {
            meta: vec![Meta::default(); n],
            // Popped from the end: low ids first.
            free: (0..n as u32).rev().collect(),
            lru: BTreeMap::new(),
            full: HashMap::new(),
            children: HashMap::new(),
            tick: 0,
        }
    }

    /// Blocks in the pool.
    pub fn len(&self) -> usize {
        self.meta.len()
    }

    /// Whether the pool has no blocks.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    /// Blocks that can be had now: free ones and cached ones.
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Cached blocks (held by no sequence, kept as prefix cache).
    pub fn cached(&self) -> usize {
        self.lru.len()
    }

    /// A block for a sequence to write (refcount 1): a free one, else the least recently used
    /// cached one, whose former content is returned. None when every block is held.
    pub fn alloc(&mut self) -> Option<(u32, Option<Evicted>)> {
        if let Some(b) = self.free.pop() {
            self.meta[b as usize].refs = 1;
            return Some((b, None));
        }
        let (_, b) = self.lru.pop_first()?;
        let evicted = self.unindex(b);
        self.meta[b as usize].refs = 1;
        Some((b, Some(evicted)))
    }

    /// One more holder of block `b` (a sequence sharing it).
    pub fn retain(&mut self, b: u32) {
        let m = &mut self.meta[b as usize];
        if m.refs == 0 {
            self.lru.remove(&m.tick);
        }
        m.refs += 1;
    }

    /// A sequence lets go of its blocks (its table, in order). Blocks no longer held become cached
    /// when indexed (the last ones first in line for eviction), free otherwise.
    pub fn release(&mut self, table: &[u32]) {
        for &b in table.iter().rev() {
            let m = &mut self.meta[b as usize];
            assert!(m.refs > 0, "block {b} released more often than held");
            m.refs -= 1;
            if m.refs > 0 {
                continue;
            }
            if m.indexed {
                self.tick += 1;
                m.tick = self.tick;
                self.lru.insert(self.tick, b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// Marks blocks as just used (a prefix hit on them): later to be evicted.
    fn touch(&mut self, b: u32) {
        let m = &mut self.meta[b as usize];
        if m.refs == 0 && m.indexed {
            self.lru.remove(&m.tick);
            self.tick += 1;
            m.tick = self.tick;
            self.lru.insert(self.tick, b);
        }
    }

    /// Indexes a held block that has just become full, under its prefix's hash `parent`, as `hash`.
    /// A block computed twice (two sequences prefilling the same prefix side by side) stays
    /// indexed once; the other copy is freed when its sequence lets go. Returns whether it was
    /// indexed.
    pub fn register_full(&mut self, b: u32, parent: u128, hash: u128, tokens: &[u32]) -> bool {
        debug_assert_eq!(tokens.len(), BLOCK);
        if self.full.contains_key(&hash) || self.meta[b as usize].indexed {
            return false;
        }
        self.full.insert(hash, b);
        self.index(b, parent, Some(hash), tokens);
        true
    }

    /// Indexes the last, partial block of a sequence about to let go of it: its `tokens` follow a
    /// prefix with hash `parent`.
    pub fn register_partial(&mut self, b: u32, parent: u128, tokens: &[u32]) {
        debug_assert!(!tokens.is_empty() && tokens.len() < BLOCK);
        if self.meta[b as usize].indexed {
            return;
        }
        // One partial block per continuation: an identical one already indexed is enough.
        let dup = self.children.get(&parent).is_some_and(|c| {
            c.iter()
                .any(|&o| self.meta[o as usize].tokens.starts_with(tokens))
        });
        if !dup {
            self.index(b, parent, None, tokens);
        }
    }

    fn index(&mut self, b: u32, parent: u128, hash: Option<u128>, tokens: &[u32]) {
        let m = &mut self.meta[b as usize];
        m.indexed = true;
        m.parent = parent;
        m.hash = hash;
        m.tokens.clear();
        m.tokens.extend_from_slice(tokens);
        self.children.entry(parent).or_default().push(b);
    }

    fn unindex(&mut self, b: u32) -> Evicted {
        let m = &mut self.meta[b as usize];
        m.indexed = false;
        let (parent, hash, tokens) = (m.parent, m.hash.take(), std::mem::take(&mut m.tokens));
        if let Some(h) = hash {
            if self.full.get(&h) == Some(&b) {
                self.full.remove(&h);
            }
        }
        if let Some(c) = self.children.get_mut(&parent) {
            c.retain(|&o| o != b);
            if c.is_empty() {
                self.children.remove(&parent);
            }
        }
        Evicted { hash, tokens }
    }

    /// The longest cached prefix of `prompt[..limit]`: full blocks by the hash chain, then the
    /// indexed block sharing the most tokens with the rest. `hashes` is `prompt`'s hash chain
    /// ([`chain_all`]). The blocks found count as used now.
    pub fn lookup(&mut self, prompt: &[u32], hashes: &[u128], limit: usize) -> Match {
        let limit = limit.min(prompt.len());
        let mut m = Match::default();
        let mut parent = 0;
        for (i, &h) in hashes.iter().enumerate() {
            if (i + 1) * BLOCK > limit {
                break;
            }
            match self.full.get(&h) {
                Some(&b) => {
                    m.full.push((b, h));
                    parent = h;
                }
                None => break,
            }
        }
        let start = m.full.len() * BLOCK;
        m.partial = self.best_partial(parent, &prompt[start..limit.max(start)]);
        for &(b, _) in &m.full {
            self.touch(b);
        }
        if let Some((b, _)) = m.partial {
            self.touch(b);
        }
        m
    }

    /// The indexed block after a prefix with hash `parent` whose tokens share the most with `rest`
    /// (at least one): `(block, tokens shared)`.
    pub fn best_partial(&self, parent: u128, rest: &[u32]) -> Option<(u32, usize)> {
        if rest.is_empty() {
            return None;
        }
        let best = self.children.get(&parent).and_then(|c| {
            c.iter()
                .map(|&b| {
                    let t = &self.meta[b as usize].tokens;
                    (b, t.iter().zip(rest).take_while(|(a, b)| a == b).count())
                })
                .max_by_key(|&(b, n)| (n, std::cmp::Reverse(b)))
        });
        best.filter(|&(_, n)| n > 0)
    }

    /// The indexed full blocks and their hashes.
    pub fn full_blocks(&self) -> impl Iterator<Item = (u32, u128)> + '_ {
        self.full.iter().map(|(&h, &b)| (b, h))
    }

    /// Whether a full block with this hash is indexed.
    pub fn has(&self, hash: u128) -> bool {
        self.full.contains_key(&hash)
    }

    /// The tokens of an indexed block.
    pub fn tokens(&self, b: u32) -> &[u32] {
        &self.meta[b as usize].tokens
    }

    /// Holders of block `b`.
    pub fn refs(&self, b: u32) -> u32 {
        self.meta[b as usize].refs
    }

    /// Makes the refcounts agree with the sequences' block tables again, after a panic left a
    /// change half done (blocks taken for a request that never got its slot, a block retained
    /// for a copy that did not happen): a block no table holds becomes cached when it is indexed
    /// (cached blocks keep their place in the LRU), free otherwise; a held one is neither.
    pub fn reconcile(&mut self, tables: &[&[u32]]) {
        let mut held = vec![0u32; self.meta.len()];
        for t in tables {
            for &b in *t {
                if let Some(h) = held.get_mut(b as usize) {
                    *h += 1;
                }
            }
        }
        let old = std::mem::take(&mut self.lru);
        for (tick, b) in old {
            let m = &self.meta[b as usize];
            if held[b as usize] == 0 && m.indexed && m.tick == tick {
                self.lru.insert(tick, b);
            }
        }
        self.free.clear();
        // Popped from the end: low ids first, as in a new pool.
        for b in (0..self.meta.len()).rev() {
            let m = &mut self.meta[b];
            m.refs = held[b];
            if m.refs > 0 {
                continue;
            }
            if !m.indexed {
                self.free.push(b as u32);
            } else if self.lru.get(&m.tick) != Some(&(b as u32)) {
                self.tick += 1;
                m.tick = self.tick;
                self.lru.insert(self.tick, b as u32);
            }
        }
    }

    /// Checks the pool's invariants against the sequences' block tables: every block in exactly
    /// one state, refcounts equal to the number of table entries, the indexes consistent.
    pub fn check(&self, tables: &[&[u32]]) -> Result<(), String> {
        let mut held = vec![0u32; self.meta.len()];
        for t in tables {
            for &b in *t {
                held[b as usize] += 1;
            }
        }
        let mut seen = vec![0u8; self.meta.len()];
        for &b in &self.free {
            seen[b as usize] += 1;
        }
        for &b in self.lru.values() {
            seen[b as usize] += 1;
        }
        for (b, m) in self.meta.iter().enumerate() {
            if m.refs != held[b] {
                return Err(format!(
                    "block {b}: refcount {} but {} holders",
                    m.refs, held[b]
                ));
            }
            let states = seen[b] + u8::from(m.refs > 0);
            if states != 1 {
                return Err(format!("block {b} is in {states} states"));
            }
            if self.free.contains(&(b as u32)) && m.indexed {
                return Err(format!("block {b} is free and indexed"));
            }
            if m.refs == 0 && !m.indexed && !self.free.contains(&(b as u32)) {
                return Err(format!("block {b} is lost"));
            }
        }
        for (h, &b) in &self.full {
            if self.meta[b as usize].hash != Some(*h) {
                return Err(format!("full index names block {b} for another hash"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| seed * 1000 + i).collect()
    }

    #[test]
    fn a_released_prefix_is_found_and_shared() {
        let mut p = BlockPool::new(8);
        let t = toks(1, 2 * BLOCK + 10);
        let hashes = chain_all(&t);
        let table: Vec<u32> = (0..3).map(|_| p.alloc().unwrap().0).collect();
        p.register_full(table[0], 0, hashes[0], &t[..BLOCK]);
        p.register_full(table[1], hashes[0], hashes[1], &t[BLOCK..2 * BLOCK]);
        p.register_partial(table[2], hashes[1], &t[2 * BLOCK..]);
        p.release(&table);
        p.check(&[]).unwrap();
        assert_eq!(p.cached(), 3);
        // A longer prompt with the same start finds both full blocks and the partial one.
        let mut u = t.clone();
        u.extend(toks(2, 30));
        let m = p.lookup(&u, &chain_all(&u), u.len() - 1);
        assert_eq!(m.full.iter().map(|f| f.0).collect::<Vec<_>>(), table[..2]);
        assert_eq!(m.partial, Some((table[2], 10)));
        assert_eq!(m.tokens(), 2 * BLOCK + 10);
        // A prompt that differs at token 3 shares no full block, only the first block's first rows.
        let mut w = t.clone();
        w[3] += 1;
        let m = p.lookup(&w, &chain_all(&w), w.len());
        assert_eq!((m.full.len(), m.partial), (0, Some((table[0], 3))));
        // A prompt that differs at its first token shares nothing.
        w[0] += 1;
        assert_eq!(p.lookup(&w, &chain_all(&w), w.len()), Match::default());
    }

    #[test]
    fn eviction_takes_the_least_recently_used_tail_first() {
        let mut p = BlockPool::new(3);
        let t = toks(1, 3 * BLOCK);
        let h = chain_all(&t);
        let table: Vec<u32> = (0..3).map(|_| p.alloc().unwrap().0).collect();
        for i in 0..3 {
            let parent = if i == 0 { 0 } else { h[i - 1] };
            p.register_full(table[i], parent, h[i], &t[i * BLOCK..(i + 1) * BLOCK]);
        }
        p.release(&table);
        let (b, ev) = p.alloc().unwrap();
        assert_eq!(b, table[2]);
        assert_eq!(ev.unwrap().hash, Some(h[2]));
        // The head is still found; the tail is gone.
        let m = p.lookup(&t, &h, t.len());
        assert_eq!(m.full.len(), 2);
        assert!(p.alloc().is_some() && p.alloc().is_some() && p.alloc().is_none());
        p.check(&[&[b], &[table[1]], &[table[0]]]).unwrap();
    }

    #[test]
    fn refcounts_return_to_zero_under_random_traffic() {
        // Sequences with common prefixes come and go; the invariants hold after every step and the
        // pool is whole at the end.
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut p = BlockPool::new(24);
        let mut live: Vec<Vec<u32>> = Vec::new();
        for _ in 0..2000 {
            if live.len() < 4 && next() % 2 == 0 {
                let n = 1 + (next() % (4 * BLOCK as u64)) as usize;
                let t = toks((next() % 3) as u32, n);
                let h = chain_all(&t);
                let m = p.lookup(&t, &h, n);
                let mut table: Vec<u32> = m.full.iter().map(|f| f.0).collect();
                let need = n.div_ceil(BLOCK) - table.len();
                if p.available() < need + m.full.iter().filter(|f| p.refs(f.0) == 0).count() {
                    continue;
                }
                table.iter().for_each(|&b| p.retain(b));
                for _ in 0..need {
                    table.push(p.alloc().expect("counted available").0);
                }
                for i in m.full.len()..n / BLOCK {
                    let parent = if i == 0 { 0 } else { h[i - 1] };
                    p.register_full(table[i], parent, h[i], &t[i * BLOCK..(i + 1) * BLOCK]);
                }
                if !n.is_multiple_of(BLOCK) {
                    let parent = if n / BLOCK == 0 { 0 } else { h[n / BLOCK - 1] };
                    p.register_partial(table[n / BLOCK], parent, &t[n / BLOCK * BLOCK..]);
                }
                live.push(table);
            } else if !live.is_empty() {
                let i = (next() % live.len() as u64) as usize;
                let t = live.swap_remove(i);
                p.release(&t);
            }
            let tables: Vec<&[u32]> = live.iter().map(|t| &t[..]).collect();
            p.check(&tables).unwrap();
        }
        for t in live.drain(..) {
            p.release(&t);
        }
        p.check(&[]).unwrap();
        assert_eq!(p.available(), 24);
    }

    #[test]
    fn reconcile_gives_back_what_a_panic_left_held() {
        // Two sequences share a cached head; a third "admission" takes blocks and a retain and
        // never records them in a table (as a panic half way through admitting leaves them).
        let mut p = BlockPool::new(12);
        let t = toks(1, 3 * BLOCK + 5);
        let h = chain_all(&t);
        let mut a = Vec::new();
        for i in 0..4 {
            a.push(p.alloc().unwrap().0);
            if i < 3 {
                let parent = if i == 0 { 0 } else { h[i - 1] };
                p.register_full(a[i], parent, h[i], &t[i * BLOCK..(i + 1) * BLOCK]);
            }
        }
        p.release(&a);
        let m = p.lookup(&t, &h, t.len());
        assert_eq!(m.full.len(), 3);
        let b: Vec<u32> = m.full[..2].iter().map(|f| f.0).collect();
        b.iter().for_each(|&x| p.retain(x));
        // The lost admission.
        p.retain(m.full[2].0);
        let lost = [p.alloc().unwrap().0, p.alloc().unwrap().0];
        assert!(
            p.check(&[&b[..]]).is_err(),
            "the pool disagrees with the tables"
        );
        p.reconcile(&[&b[..]]);
        p.check(&[&b[..]]).unwrap();
        // The lost blocks are back (two free, the third cached again), the shared head still held
        // and the whole prefix still found.
        assert_eq!(p.available(), 12 - 2);
        assert!(lost.iter().all(|&x| p.refs(x) == 0));
        assert_eq!(p.lookup(&t, &h, t.len()).full.len(), 3);
        p.release(&b);
        p.check(&[]).unwrap();
        assert_eq!(p.available(), 12);
    }
}
