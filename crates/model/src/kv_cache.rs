//! The key/value cache: per sequence slot, per layer, per position, one K row and one V row.
//!
//! Sliding-window layers keep every position too, not a ring of `window` rows as llama.cpp's SWA
//! cache does: a position has the same address in every layer, so copying a prefix, rewinding a
//! sequence or (later) sharing blocks between sequences needs no per-layer bookkeeping, and
//! attention simply never reads behind a window. Untouched positions cost no resident memory (the
//! store is a lazily mapped zeroed allocation); a paged cache can free the blocks a window has left.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    /// Half precision (llama.cpp's default).
    F16,
    /// Single precision.
    F32,
}

enum Store {
    // f16 bits: `vec![0u16; n]` is a zeroed allocation the OS maps lazily, where `vec![f16::ZERO; n]`
    // would write every element and make the whole cache resident up front.
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl Store {
    fn new(ty: KvType, n: usize) -> Store {
        // Zeroed allocations map lazily, so an unused context costs no resident memory.
        match ty {
            KvType::F16 => Store::F16(vec![0u16; n]),
            KvType::F32 => Store::F32(vec![0.0; n]),
        }
    }

    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            // The slice conversion (F16C where the CPU has it), not a detected call per element.
            Store::F16(v) => v[at..at + src.len()]
                .reinterpret_cast_mut::<f16>()
                .convert_from_f32_slice(src),
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
        }
    }
}

/// A read view of one head's rows.
pub(crate) enum Rows<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
}

/// Keys and values of up to `n_seq` sequences of up to `n_ctx` positions each.
pub struct KvCache {
    n_seq: usize,
    n_layer: usize,
    n_ctx: usize,
    k_dim: usize,
    v_dim: usize,
    ty: KvType,
    k: Store, // [n_seq, n_layer, n_ctx, k_dim]
    v: Store, // [n_seq, n_layer, n_ctx, v_dim]
}

impl KvCache {
    /// A cache for `n_seq` sequences of `n_ctx` positions.
    pub fn new(
        n_seq: usize,
        n_layer: usize,
        n_ctx: usize,
        k_dim: usize,
        v_dim: usize,
        ty: KvType,
    ) -> KvCache {
        let n = n_seq * n_layer * n_ctx;
        KvCache {
            n_seq,
            n_layer,
            n_ctx,
            k_dim,
            v_dim,
            ty,
            k: Store::new(ty, n * k_dim),
            v: Store::new(ty, n * v_dim),
        }
    }

    /// Positions per sequence.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Sequence slots.
    pub fn n_seq(&self) -> usize {
        self.n_seq
    }

    /// Element type.
    pub fn ty(&self) -> KvType {
        self.ty
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        let el = match self.ty {
            KvType::F16 => 2,
            KvType::F32 => 4,
        };
        self.n_seq * self.n_layer * self.n_ctx * (self.k_dim + self.v_dim) * el
    }

    fn row_index(&self, seq: usize, layer: usize, pos: usize) -> usize {
        (seq * self.n_layer + layer) * self.n_ctx + pos
    }

    /// Stores one token's K and V rows.
    pub(crate) fn store(&mut self, seq: usize, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let i = self.row_index(seq, layer, pos);
        self.k.write(i * self.k_dim, k);
        self.v.write(i * self.v_dim, v);
    }

    /// K rows `[0, len)` of a sequence at a layer: `[len, k_dim]`.
    pub(crate) fn keys(&self, seq: usize, layer: usize, len: usize) -> Rows<'_> {
        let s = self.row_index(seq, layer, 0) * self.k_dim;
        match &self.k {
            Store::F16(v) => Rows::F16(as_f16(&v[s..s + len * self.k_dim])),
            Store::F32(v) => Rows::F32(&v[s..s + len * self.k_dim]),
        }
    }

    /// V rows `[0, len)` of a sequence at a layer: `[len, v_dim]`.
    pub(crate) fn values(&self, seq: usize, layer: usize, len: usize) -> Rows<'_> {
        let s = self.row_index(seq, layer, 0) * self.v_dim;
        match &self.v {
            Store::F16(v) => Rows::F16(as_f16(&v[s..s + len * self.v_dim])),
            Store::F32(v) => Rows::F32(&v[s..s + len * self.v_dim]),
        }
    }

    /// Copies the first `len` positions of sequence `src` into sequence `dst` (prefix reuse).
    pub fn copy_prefix(&mut self, src: usize, dst: usize, len: usize) {
        if src == dst || len == 0 {
            return;
        }
        for l in 0..self.n_layer {
            let (s, d) = (self.row_index(src, l, 0), self.row_index(dst, l, 0));
            match (&mut self.k, &mut self.v) {
                (Store::F16(k), Store::F16(v)) => {
                    k.copy_within(s * self.k_dim..(s + len) * self.k_dim, d * self.k_dim);
                    v.copy_within(s * self.v_dim..(s + len) * self.v_dim, d * self.v_dim);
                }
                (Store::F32(k), Store::F32(v)) => {
                    k.copy_within(s * self.k_dim..(s + len) * self.k_dim, d * self.k_dim);
                    v.copy_within(s * self.v_dim..(s + len) * self.v_dim, d * self.v_dim);
                }
                _ => unreachable!("K and V share one type"),
            }
        }
    }
}

fn as_f16(bits: &[u16]) -> &[f16] {
    // SAFETY: `half::f16` is `repr(transparent)` over `u16`: same size, alignment and validity.
    unsafe { std::slice::from_raw_parts(bits.as_ptr() as *const f16, bits.len()) }
}
