//! The key/value cache: one pool of fixed-size blocks of [`BLOCK`] token positions, each holding a
//! K row and a V row per layer and position; every sequence has a table mapping its positions to
//! pool blocks (`table[p / BLOCK]`, row `p % BLOCK`).
//!
//! The model only reads and writes through the tables. Who owns which block — whether blocks are
//! shared by sequences with a common prefix, kept after a sequence ends as a prefix cache, evicted,
//! or saved to disk — is the caller's policy (the engine's scheduler); [`KvCache::new`] gives each of
//! `n_seq` sequences a fixed table of its own for the simple single-sequence users.
//!
//! A block is contiguous (`[n_layer, BLOCK, k_dim]` keys, then the values likewise), so it can be
//! copied (copy-on-write of a shared partial block), exported and imported (the disk cache) as one
//! piece. [`BLOCK`] equals attention's key block, so one attention block is one pool block.
//!
//! An f16 or f32 cache keeps each layer's keys of a block transposed, `[k_dim, BLOCK]`: attention
//! wants a block's keys with positions in vector lanes, and converting stored columns is a plain
//! conversion where transposing stored rows on every read cost most of a decode step's attention
//! at depth. Its values are kept head by head, `[n_kv, BLOCK, head_dim_v]`: attention reads one KV
//! head's value rows at a time, and as parts of whole-token rows they lie `v_dim` elements apart (1
//! KiB for Qwen3-MoE, 2 KiB for 8 KV heads of 128), 64 rows on a few sets of the L1 cache, which
//! could not hold them. Quantized keys and values (blocks of 32 elements along a row) stay rows.
//!
//! Sliding-window layers keep every position too, not a ring of `window` rows as llama.cpp's SWA
//! cache does: a position has the same address in every layer, so sharing a prefix or rewinding a
//! sequence needs no per-layer bookkeeping, and attention simply never reads behind a window.
//! Untouched blocks cost no resident memory (the store is a lazily mapped zeroed allocation, mapped in
//! 2 MiB pages where the OS has transparent huge pages).

use half::f16;

use crate::error::ModelError;
use crate::kv_quant::{self, KvQuant, QK};
use crate::memory::advise_huge_pages;

/// Token positions per pool block.
pub const BLOCK: usize = 64;

/// The shape of one token's cached keys and values: `n_kv` KV heads of `head_dim` key and
/// `head_dim_v` value elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvDims {
    /// KV heads.
    pub n_kv: usize,
    /// Elements of a key head.
    pub head_dim: usize,
    /// Elements of a value head.
    pub head_dim_v: usize,
}

impl KvDims {
    /// Width of all key heads together (one token's K row).
    pub fn k_dim(self) -> usize {
        self.n_kv * self.head_dim
    }

    /// Width of all value heads together (one token's V row).
    pub fn v_dim(self) -> usize {
        self.n_kv * self.head_dim_v
    }
}

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    /// Half precision (llama.cpp's default).
    F16,
    /// Single precision.
    F32,
    /// llama.cpp's `-ctk/-ctv q8_0`: blocks of 32 elements, 8-bit quants and an f16 scale
    /// (34 bytes per 32 elements).
    Q8_0,
    /// llama.cpp's `-ctk/-ctv q4_0`: blocks of 32 elements, 4-bit quants and an f16 scale
    /// (18 bytes per 32 elements).
    Q4_0,
}

impl KvType {
    /// Every type, for tests and listings.
    pub const ALL: [KvType; 4] = [KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0];

    /// Bytes of a row of `n` elements (a whole number of 32-element blocks for the quantized
    /// types, which [`KvType::check_heads`] makes sure of).
    pub fn row_bytes(self, n: usize) -> usize {
        match (self, self.quant()) {
            (_, Some(q)) => n.div_ceil(QK) * q.block_bytes(),
            (KvType::F16, None) => 2 * n,
            _ => 4 * n,
        }
    }

    /// The name used on the command line and in cache keys (`f16`, `f32`, `q8_0`, `q4_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// The block format of a quantized type.
    pub(crate) fn quant(self) -> Option<KvQuant> {
        match self {
            KvType::F16 | KvType::F32 => None,
            KvType::Q8_0 => Some(KvQuant::Q8_0),
            KvType::Q4_0 => Some(KvQuant::Q4_0),
        }
    }

    /// Whether heads of `head_dim` (K) and `head_dim_v` (V) elements fit this type: a quantized
    /// cache stores each head as whole 32-element blocks, as llama.cpp requires too.
    pub fn check_heads(self, head_dim: usize, head_dim_v: usize) -> Result<(), ModelError> {
        if self.quant().is_none() || (head_dim.is_multiple_of(QK) && head_dim_v.is_multiple_of(QK))
        {
            return Ok(());
        }
        Err(ModelError::KvType {
            ty: self.name(),
            head_dim,
            head_dim_v,
        })
    }
}

/// `src` as f16 bits, rounded to nearest even: the activation quantizer's F16 rows (F16C where the
/// CPU has it, one call per row), where `half`'s slice conversion made a call per 8 elements (the
/// engine thread runs the KV writes alone, while the worker waits).
fn f16_bits(src: &[f32], dst: &mut [u16]) {
    // SAFETY: the u16s' memory viewed as the bytes it is made of (any bytes are valid u16s).
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), 2 * dst.len()) };
    hearth_quant::quantize_row(hearth_quant::GgmlType::F16, src, bytes)
        .expect("an f16 row of every length");
    // The quantizer writes little-endian bytes.
    for x in dst {
        *x = u16::from_le(*x);
    }
}

/// One kind of row storage, rows of `width` elements.
struct Store {
    width: usize,
    data: Data,
    layout: Layout,
}

/// How a [`Store`] orders its rows' elements.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Row after row (quantized rows).
    Rows,
    /// Each run of [`BLOCK`] rows in segments of `seg` elements of every row: `[width / seg,
    /// BLOCK, seg]`, element `j` of row `p` at `(j / seg * BLOCK + p) * seg + j % seg`. Keys
    /// transposed (`seg` 1, `[width, BLOCK]`), values head by head (`seg` the head's width).
    Runs { seg: usize },
}

impl Layout {
    /// Where element `j` of row `row` of `width` elements is, in elements.
    fn element(self, width: usize, row: usize, j: usize) -> usize {
        match self {
            Layout::Runs { seg } => {
                (row - row % BLOCK) * width + (j / seg * BLOCK + row % BLOCK) * seg + j % seg
            }
            Layout::Rows => row * width + j,
        }
    }
}

enum Data {
    // f16 bits: `vec![0u16; n]` is a zeroed allocation the OS maps lazily, where `vec![f16::ZERO; n]`
    // would write every element and make the whole cache resident up front.
    F16(Vec<u16>),
    F32(Vec<f32>),
    // Whole rows of blocks, `KvQuant::row_bytes(width)` bytes each.
    Quant(KvQuant, Vec<u8>),
}

impl Store {
    /// `rows` zeroed rows (zeroed allocations map lazily, so an unused pool costs no resident
    /// memory); an f16 or f32 store in runs of [`BLOCK`] rows of `seg`-element segments
    /// ([`Layout::Runs`]), a quantized one row after row.
    fn new(ty: KvType, rows: usize, width: usize, seg: usize) -> Store {
        let mut data = match (ty, ty.quant()) {
            (_, Some(q)) => Data::Quant(q, vec![0u8; rows * ty.row_bytes(width)]),
            (KvType::F16, None) => Data::F16(vec![0u16; rows * width]),
            _ => Data::F32(vec![0.0; rows * width]),
        };
        // Attention at depth streams the store: 2 MiB pages, mapped as the pool fills.
        match &mut data {
            Data::F16(v) => advise_huge_pages(v),
            Data::F32(v) => advise_huge_pages(v),
            Data::Quant(_, v) => advise_huge_pages(v),
        }
        let layout = match ty.quant() {
            Some(_) => Layout::Rows,
            None => {
                assert!(seg > 0 && width.is_multiple_of(seg) && rows.is_multiple_of(BLOCK));
                Layout::Runs { seg }
            }
        };
        Store {
            width,
            data,
            layout,
        }
    }

    /// Where element `j` of row `row` is, in elements (f16 and f32 stores).
    fn element(&self, row: usize, j: usize) -> usize {
        self.layout.element(self.width, row, j)
    }

    /// Elements (f16, f32) or bytes (quantized) per row.
    fn unit(&self) -> usize {
        match &self.data {
            Data::F16(_) | Data::F32(_) => self.width,
            Data::Quant(q, _) => q.row_bytes(self.width),
        }
    }

    /// Stores row `row`; a quantized row's bytes depend on `src` alone.
    fn write(&mut self, row: usize, src: &[f32]) {
        debug_assert_eq!(src.len(), self.width);
        let (layout, width, unit) = (self.layout, self.width, self.unit());
        match (layout, &mut self.data) {
            (Layout::Runs { seg: 1 }, data) => {
                // Element `j` of the row at `j * BLOCK` of its block's run (the same conversion).
                let at = layout.element(width, row, 0);
                let mut h = [0u16; 256];
                for (c, src) in src.chunks(256).enumerate() {
                    let at = at + (c * 256) * BLOCK;
                    match data {
                        Data::F16(v) => {
                            f16_bits(src, &mut h[..src.len()]);
                            assert!(
                                at + (src.len() - 1) * BLOCK < v.len(),
                                "key row in the store"
                            );
                            for (d, x) in v[at..].iter_mut().step_by(BLOCK).zip(&h[..src.len()]) {
                                *d = *x;
                            }
                        }
                        Data::F32(v) => {
                            for (i, x) in src.iter().enumerate() {
                                v[at + i * BLOCK] = *x;
                            }
                        }
                        Data::Quant(..) => unreachable!("quantized rows are rows"),
                    }
                }
            }
            (Layout::Runs { seg }, data) => {
                for (h, src) in src.chunks(seg).enumerate() {
                    let at = layout.element(width, row, h * seg);
                    match data {
                        Data::F16(v) => f16_bits(src, &mut v[at..at + seg]),
                        Data::F32(v) => v[at..at + seg].copy_from_slice(src),
                        Data::Quant(..) => unreachable!("quantized rows are rows"),
                    }
                }
            }
            (Layout::Rows, Data::Quant(q, v)) => {
                let at = row * unit;
                kv_quant::store_row(hearth_quant::kernel_level(), *q, src, &mut v[at..at + unit])
            }
            (Layout::Rows, _) => unreachable!("f16 and f32 rows are stored in runs"),
        }
    }

    /// Asks for the cache lines that [`Store::write`] of row `row` stores into (a hint: nothing
    /// is read or written). A key row of an f16 or f32 store touches a line per element.
    fn prefetch_row(&self, row: usize) {
        // The store's first byte and the bytes per unit `element` / `unit` count in.
        let (base, elem) = match &self.data {
            Data::F16(v) => (v.as_ptr().cast::<u8>(), 2),
            Data::F32(v) => (v.as_ptr().cast::<u8>(), 4),
            Data::Quant(_, v) => (v.as_ptr(), 1),
        };
        let line = |at: usize| {
            let p = base.wrapping_add(at * elem);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(p.cast());
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = p;
        };
        match self.layout {
            Layout::Runs { seg: 1 } => {
                for j in 0..self.width {
                    line(self.element(row, j));
                }
            }
            Layout::Runs { seg } => {
                for h in 0..self.width / seg {
                    let at = self.element(row, h * seg);
                    for o in (0..seg).step_by(64 / elem) {
                        line(at + o);
                    }
                }
            }
            Layout::Rows => {
                let (at, unit) = (row * self.unit(), self.unit());
                for o in (0..unit).step_by(64) {
                    line(at + o);
                }
            }
        }
    }

    /// Rows `row..row + count` (a whole run of [`BLOCK`] rows from its first if stored in runs).
    fn rows(&self, row: usize, count: usize) -> Rows<'_> {
        let (at, len) = (row * self.unit(), count * self.unit());
        let runs = self.layout != Layout::Rows;
        assert!(!runs || (row.is_multiple_of(BLOCK) && count == BLOCK));
        match (&self.data, self.layout) {
            (Data::F16(v), Layout::Runs { seg: 1 }) => Rows::F16T(as_f16(&v[at..at + len])),
            (Data::F32(v), Layout::Runs { seg: 1 }) => Rows::F32T(&v[at..at + len]),
            (Data::F16(v), _) => Rows::F16H(as_f16(&v[at..at + len])),
            (Data::F32(v), _) => Rows::F32H(&v[at..at + len]),
            (Data::Quant(q, v), _) => Rows::Quant {
                ty: *q,
                data: &v[at..at + len],
                stride: self.unit(),
            },
        }
    }

    /// The memory of rows `row..row + count` as bytes (for prefetch hints).
    fn bytes(&self, row: usize, count: usize) -> &[u8] {
        let (at, len) = (row * self.unit(), count * self.unit());
        fn raw<T>(v: &[T]) -> &[u8] {
            // SAFETY: plain numbers, viewed as the bytes they are made of.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), size_of_val(v)) }
        }
        match &self.data {
            Data::F16(v) => raw(&v[at..at + len]),
            Data::F32(v) => raw(&v[at..at + len]),
            Data::Quant(_, v) => &v[at..at + len],
        }
    }

    /// Copies rows `src..src + count` to `dst..` (within one run from its first row if stored in
    /// runs).
    fn copy_within(&mut self, src: usize, dst: usize, count: usize) {
        if let Layout::Runs { seg } = self.layout {
            assert!(src.is_multiple_of(BLOCK) && dst.is_multiple_of(BLOCK) && count <= BLOCK);
            // Each segment's first `count` rows, one piece of memory.
            for j in (0..self.width).step_by(seg) {
                let (s, d, n) = (self.element(src, j), self.element(dst, j), count * seg);
                match &mut self.data {
                    Data::F16(v) => v.copy_within(s..s + n, d),
                    Data::F32(v) => v.copy_within(s..s + n, d),
                    Data::Quant(..) => unreachable!("quantized rows are rows"),
                }
            }
            return;
        }
        let u = self.unit();
        let (src, dst, len) = (src * u, dst * u, count * u);
        match &mut self.data {
            Data::F16(v) => v.copy_within(src..src + len, dst),
            Data::F32(v) => v.copy_within(src..src + len, dst),
            Data::Quant(_, v) => v.copy_within(src..src + len, dst),
        }
    }

    /// Rows `row..row + count` as little-endian bytes in storage order (whole runs if stored in
    /// runs), appended to `out`.
    fn export(&self, row: usize, count: usize, out: &mut Vec<u8>) {
        debug_assert!(
            self.layout == Layout::Rows
                || (row.is_multiple_of(BLOCK) && count.is_multiple_of(BLOCK))
        );
        let (at, len) = (row * self.unit(), count * self.unit());
        match &self.data {
            Data::F16(v) => v[at..at + len]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::F32(v) => v[at..at + len]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::Quant(_, v) => out.extend_from_slice(&v[at..at + len]),
        }
    }

    /// Row `row`'s bytes as a row-major store would hold them.
    #[cfg(test)]
    fn row_bytes_at(&self, row: usize) -> Vec<u8> {
        let at = |j: usize| self.element(row, j);
        match &self.data {
            Data::F16(v) => (0..self.width)
                .flat_map(|j| v[at(j)].to_le_bytes())
                .collect(),
            Data::F32(v) => (0..self.width)
                .flat_map(|j| v[at(j)].to_le_bytes())
                .collect(),
            Data::Quant(_, v) => v[row * self.unit()..(row + 1) * self.unit()].to_vec(),
        }
    }

    /// Rows from `row` on from [`Store::export`]'s bytes (whole rows).
    fn import(&mut self, row: usize, bytes: &[u8]) {
        let at = row * self.unit();
        match &mut self.data {
            Data::F16(v) => {
                for (d, b) in v[at..].iter_mut().zip(bytes.chunks_exact(2)) {
                    *d = u16::from_le_bytes([b[0], b[1]]);
                }
            }
            Data::F32(v) => {
                for (d, b) in v[at..].iter_mut().zip(bytes.chunks_exact(4)) {
                    *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Data::Quant(_, v) => v[at..at + bytes.len()].copy_from_slice(bytes),
        }
    }
}

/// A read view of cache rows.
pub(crate) enum Rows<'a> {
    /// A block's rows transposed, `[width, BLOCK]`: element `j` of position `p` at
    /// `j * BLOCK + p` (f16 and f32 keys).
    F16T(&'a [f16]),
    F32T(&'a [f32]),
    /// A block's rows head by head, `[heads, BLOCK, head_dim_v]`: element `e` of head `h` at
    /// position `p` at `(h * BLOCK + p) * head_dim_v + e` (f16 and f32 values).
    F16H(&'a [f16]),
    F32H(&'a [f32]),
    /// Quantized rows of `stride` bytes each (a whole token's row; head `h` of `head_dim` elements
    /// at byte `h * ty.row_bytes(head_dim)` within it).
    Quant {
        ty: KvQuant,
        data: &'a [u8],
        stride: usize,
    },
}

/// Keys and values of up to `n_seq` sequences of up to `n_ctx` positions each, in a pool of
/// `n_blocks` blocks of [`BLOCK`] positions.
pub struct KvCache {
    n_seq: usize,
    n_layer: usize,
    n_ctx: usize,
    n_blocks: usize,
    dims: KvDims,
    ty: KvType,
    k: Store, // [n_blocks, n_layer, BLOCK, k_dim], or [.., k_dim, BLOCK] for f16 and f32
    v: Store, // [n_blocks, n_layer, BLOCK, v_dim], or [.., n_kv, BLOCK, head_dim_v] for f16 and f32
    /// Per sequence: the pool block of each run of [`BLOCK`] positions.
    tables: Vec<Vec<u32>>,
}

impl KvCache {
    /// A cache for `n_seq` sequences of `n_ctx` positions, each with blocks of its own.
    pub fn new(n_seq: usize, n_layer: usize, n_ctx: usize, dims: KvDims, ty: KvType) -> KvCache {
        let per_seq = n_ctx.div_ceil(BLOCK);
        let mut kv = KvCache::pool(n_seq * per_seq, n_seq, n_ctx, n_layer, dims, ty);
        for (s, table) in kv.tables.iter_mut().enumerate() {
            table.extend((s * per_seq..(s + 1) * per_seq).map(|b| b as u32));
        }
        kv
    }

    /// A pool of `n_blocks` blocks for `n_seq` sequences of up to `n_ctx` positions, with empty
    /// tables: the caller assigns blocks with [`KvCache::table_mut`].
    ///
    /// # Panics
    /// If an f16 or f32 cache's value heads are empty (`dims.head_dim_v` 0; a loaded model's
    /// config never has that), or there are more than `u32::MAX` blocks.
    pub fn pool(
        n_blocks: usize,
        n_seq: usize,
        n_ctx: usize,
        n_layer: usize,
        dims: KvDims,
        ty: KvType,
    ) -> KvCache {
        assert!(n_blocks <= u32::MAX as usize, "block ids are u32");
        let rows = n_blocks * n_layer * BLOCK;
        KvCache {
            n_seq,
            n_layer,
            n_ctx,
            n_blocks,
            dims,
            ty,
            k: Store::new(ty, rows, dims.k_dim(), 1),
            v: Store::new(ty, rows, dims.v_dim(), dims.head_dim_v),
            tables: vec![Vec::new(); n_seq],
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

    /// Blocks in the pool.
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Element type.
    pub fn ty(&self) -> KvType {
        self.ty
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.n_blocks * self.block_bytes()
    }

    /// How an exported block is laid out, for the keys of caches on disk: blocks written with
    /// another layout are foreign.
    pub fn block_layout(ty: KvType, n_layer: usize, dims: KvDims) -> String {
        let (k_dim, v_dim) = (dims.k_dim(), dims.v_dim());
        let (keys, values) = if ty.quant().is_some() {
            (format!("{BLOCK}, k {k_dim}"), format!("{BLOCK}, {v_dim}"))
        } else {
            let (n_kv, hdv) = (dims.n_kv, dims.head_dim_v);
            (
                format!("k {k_dim} transposed, {BLOCK}"),
                format!("n_kv {n_kv}, {BLOCK}, {hdv}"),
            )
        };
        format!("blocks of {BLOCK} tokens: [n_layer {n_layer}, {keys}] then v [{values}]")
    }

    /// Bytes of one block (its keys and values at every layer): the size of an exported block.
    pub fn block_bytes(&self) -> usize {
        let (k, v) = (self.dims.k_dim(), self.dims.v_dim());
        self.n_layer * BLOCK * (self.ty.row_bytes(k) + self.ty.row_bytes(v))
    }

    /// The blocks of a sequence: `table[i]` holds positions `[i * BLOCK, (i + 1) * BLOCK)`.
    pub fn table(&self, seq: usize) -> &[u32] {
        &self.tables[seq]
    }

    /// The block table of a sequence, for the caller's allocator. Ids must be below
    /// [`KvCache::n_blocks`]; a forward pass checks that every position it writes has a block.
    pub fn table_mut(&mut self, seq: usize) -> &mut Vec<u32> {
        &mut self.tables[seq]
    }

    /// Whether `seq` has a valid block for position `pos`.
    pub(crate) fn covers(&self, seq: usize, pos: usize) -> bool {
        seq < self.n_seq
            && pos < self.n_ctx
            && self.tables[seq]
                .get(pos / BLOCK)
                .is_some_and(|&b| (b as usize) < self.n_blocks)
    }

    /// Checks that a batch's rows have blocks (before anything is written).
    pub(crate) fn check(&self, seq: usize, pos: usize) -> Result<(), ModelError> {
        if self.covers(seq, pos) {
            return Ok(());
        }
        Err(ModelError::Batch(format!(
            "sequence {seq} position {pos} has no KV block ({} sequences of up to {} positions, {} blocks of {BLOCK})",
            self.n_seq, self.n_ctx, self.n_blocks
        )))
    }

    fn row_index(&self, block: usize, layer: usize, row: usize) -> usize {
        (block * self.n_layer + layer) * BLOCK + row
    }

    /// Stores one token's K and V rows.
    pub(crate) fn store(&mut self, seq: usize, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let b = self.tables[seq][pos / BLOCK] as usize;
        let i = self.row_index(b, layer, pos % BLOCK);
        self.k.write(i, k);
        self.v.write(i, v);
    }

    /// Asks for the cache lines that [`KvCache::store`] of this position will write, ahead of it
    /// (a hint: the stores of a key row go to a line per element, lines that left the caches
    /// since the sequence's last step).
    pub(crate) fn prefetch_store(&self, seq: usize, layer: usize, pos: usize) {
        let Some(&b) = self.tables.get(seq).and_then(|t| t.get(pos / BLOCK)) else {
            return;
        };
        let i = self.row_index(b as usize, layer, pos % BLOCK);
        self.k.prefetch_row(i);
        self.v.prefetch_row(i);
    }

    /// The K and V rows (`[BLOCK, k_dim]`, `[BLOCK, v_dim]`; the keys `[k_dim, BLOCK]` in an f16
    /// or f32 cache) of the `i`-th block of a sequence at a layer: positions
    /// `[i * BLOCK, (i + 1) * BLOCK)`.
    pub(crate) fn block_rows(&self, seq: usize, layer: usize, i: usize) -> (Rows<'_>, Rows<'_>) {
        let b = self.tables[seq][i] as usize;
        let r = self.row_index(b, layer, 0);
        (self.k.rows(r, BLOCK), self.v.rows(r, BLOCK))
    }

    /// The memory of the keys and of the values of the block that holds position `pos` of a
    /// sequence at a layer (for prefetch hints).
    pub(crate) fn block_bytes_at(&self, seq: usize, layer: usize, pos: usize) -> [&[u8]; 2] {
        let b = self.tables[seq][pos / BLOCK] as usize;
        let r = self.row_index(b, layer, 0);
        [self.k.bytes(r, BLOCK), self.v.bytes(r, BLOCK)]
    }

    /// Copies the first `rows` positions of block `src` into block `dst` at every layer (a
    /// sequence's private copy of a shared partial block).
    pub fn copy_block(&mut self, src: u32, dst: u32, rows: usize) {
        let (src, dst, rows) = (src as usize, dst as usize, rows.min(BLOCK));
        assert!(src < self.n_blocks && dst < self.n_blocks);
        if src == dst || rows == 0 {
            return;
        }
        for l in 0..self.n_layer {
            let (s, d) = (self.row_index(src, l, 0), self.row_index(dst, l, 0));
            self.k.copy_within(s, d, rows);
            self.v.copy_within(s, d, rows);
        }
    }

    /// Block `b` as bytes ([`KvCache::block_bytes`] of them: its keys, then its values, little-endian).
    pub fn export_block(&self, b: u32, out: &mut Vec<u8>) {
        let b = b as usize;
        assert!(b < self.n_blocks);
        out.reserve(self.block_bytes());
        let rows = self.n_layer * BLOCK;
        let r = self.row_index(b, 0, 0);
        self.k.export(r, rows, out);
        self.v.export(r, rows, out);
    }

    /// Fills block `b` from [`KvCache::export_block`]'s bytes. Refused (nothing written) unless
    /// `bytes` has exactly [`KvCache::block_bytes`] bytes.
    pub fn import_block(&mut self, b: u32, bytes: &[u8]) -> Result<(), ModelError> {
        let b = b as usize;
        if b >= self.n_blocks || bytes.len() != self.block_bytes() {
            return Err(ModelError::Batch(format!(
                "a KV block of {} bytes for block {b} (blocks are {} bytes, {} of them)",
                bytes.len(),
                self.block_bytes(),
                self.n_blocks
            )));
        }
        let rows = self.n_layer * BLOCK;
        let kb = rows * self.ty.row_bytes(self.dims.k_dim());
        let r = self.row_index(b, 0, 0);
        self.k.import(r, &bytes[..kb]);
        self.v.import(r, &bytes[kb..]);
        Ok(())
    }
}

#[cfg(test)]
impl KvCache {
    /// The K and V bytes of position `p` of block `b` at layer `l`, row-major.
    fn position_bytes(&self, b: u32, l: usize, p: usize) -> Vec<u8> {
        let r = self.row_index(b as usize, l, p);
        let mut out = self.k.row_bytes_at(r);
        out.extend(self.v.row_bytes_at(r));
        out
    }
}

fn as_f16(bits: &[u16]) -> &[f16] {
    // SAFETY: `half::f16` is `repr(transparent)` over `u16`: same size, alignment and validity.
    unsafe { std::slice::from_raw_parts(bits.as_ptr() as *const f16, bits.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_quant::Level;

    #[test]
    fn a_store_prefetch_is_only_a_hint() {
        // Every store type, positions in and past the sequences' blocks: nothing changes, nothing
        // panics.
        let dims = KvDims {
            n_kv: 2,
            head_dim: 32,
            head_dim_v: 32,
        };
        for ty in KvType::ALL {
            let mut kv = KvCache::pool(4, 2, 4 * BLOCK, 2, dims, ty);
            kv.table_mut(0).extend([3, 1]);
            let k: Vec<f32> = (0..64).map(|i| i as f32 * 0.25).collect();
            kv.store(0, 1, BLOCK + 7, &k, &k);
            let before = kv.position_bytes(1, 1, 7);
            for (seq, pos) in [
                (0, 0),
                (0, BLOCK + 7),
                (0, 2 * BLOCK - 1),
                (0, 2 * BLOCK),
                (1, 0),
                (9, 3),
            ] {
                for layer in 0..2 {
                    kv.prefetch_store(seq, layer, pos);
                }
            }
            assert_eq!(kv.position_bytes(1, 1, 7), before, "{}", ty.name());
        }
    }

    #[test]
    fn positions_map_through_the_table() {
        // Two KV heads of 2 key and 3 value elements.
        let dims = KvDims {
            n_kv: 2,
            head_dim: 2,
            head_dim_v: 3,
        };
        let mut kv = KvCache::pool(4, 2, 4 * BLOCK, 2, dims, KvType::F32);
        kv.table_mut(0).extend([2, 0]);
        kv.table_mut(1).push(2); // shares the first block
        assert!(kv.covers(0, BLOCK + 5) && !kv.covers(0, 2 * BLOCK) && !kv.covers(1, BLOCK));
        let v: [f32; 6] = std::array::from_fn(|i| 10.0 + i as f32);
        kv.store(0, 1, BLOCK + 1, &[1.0, 2.0, 3.0, 4.0], &v);
        kv.store(0, 1, 3, &[6.0, 7.0, 8.0, 9.0], &v);
        // Keys transposed (element j of position p at j * BLOCK + p), values head by head (head
        // h's row p at (h * BLOCK + p) * 3).
        let (k, v) = kv.block_rows(0, 1, 1);
        let (Rows::F32T(k), Rows::F32H(v)) = (k, v) else {
            panic!("f32 rows")
        };
        let at = |j: usize| j * BLOCK + 1;
        assert_eq!(
            [k[at(0)], k[at(1)], k[at(2)], k[at(3)]],
            [1.0, 2.0, 3.0, 4.0]
        );
        let (h0, h1) = (3, (BLOCK + 1) * 3);
        assert_eq!(
            (&v[h0..h0 + 3], &v[h1..h1 + 3]),
            (&[10.0, 11.0, 12.0][..], &[13.0, 14.0, 15.0][..])
        );
        let (Rows::F32T(k), _) = kv.block_rows(1, 1, 0) else {
            panic!("f32 rows")
        };
        assert_eq!([k[3], k[BLOCK + 3], k[2 * BLOCK + 3]], [6.0, 7.0, 8.0]);
    }

    #[test]
    fn quantized_rows_are_their_blocks() {
        // A row's bytes are kv_quant's blocks of that row alone, at the row's place in its block.
        for ty in [KvType::Q8_0, KvType::Q4_0] {
            let (kd, vd) = (64, 96);
            let dims = KvDims {
                n_kv: 1,
                head_dim: kd,
                head_dim_v: vd,
            };
            let mut kv = KvCache::pool(2, 1, 2 * BLOCK, 1, dims, ty);
            kv.table_mut(0).extend([1, 0]);
            let k: Vec<f32> = (0..kd).map(|i| (i as f32 * 0.3).sin()).collect();
            let v: Vec<f32> = (0..vd).map(|i| (i as f32 * 0.7).cos() * 3.0).collect();
            kv.store(0, 0, BLOCK + 5, &k, &v);
            let q = ty.quant().unwrap();
            let (mut kb, mut vb) = (vec![0u8; ty.row_bytes(kd)], vec![0u8; ty.row_bytes(vd)]);
            kv_quant::store_row(Level::Scalar, q, &k, &mut kb);
            kv_quant::store_row(Level::Scalar, q, &v, &mut vb);
            let (
                Rows::Quant {
                    data: kr,
                    stride: ks,
                    ..
                },
                Rows::Quant {
                    data: vr,
                    stride: vs,
                    ..
                },
            ) = kv.block_rows(0, 0, 1)
            else {
                panic!("quantized rows")
            };
            assert_eq!((ks, vs), (kb.len(), vb.len()));
            assert_eq!(
                (&kr[5 * ks..6 * ks], &vr[5 * vs..6 * vs]),
                (&kb[..], &vb[..])
            );
            assert!(kr[..5 * ks].iter().all(|&b| b == 0));
            assert_eq!(kv.block_bytes(), BLOCK * (kb.len() + vb.len()));
        }
        assert!(
            KvType::Q8_0.check_heads(64, 128).is_ok() && KvType::F16.check_heads(80, 80).is_ok()
        );
        let e = KvType::Q4_0.check_heads(80, 64).unwrap_err().to_string();
        assert!(e.contains("q4_0") && e.contains("80"), "{e}");
    }

    #[test]
    fn blocks_copy_export_and_import_whole() {
        for ty in KvType::ALL {
            // Rows of one 32-element block, so the quantized types fit too, in two heads.
            let w = 32;
            let dims = KvDims {
                n_kv: 2,
                head_dim: w / 2,
                head_dim_v: w / 2,
            };
            let mut kv = KvCache::pool(3, 1, 3 * BLOCK, 2, dims, ty);
            kv.table_mut(0).extend([1, 2]);
            for p in 0..BLOCK + 3 {
                let x = p as f32;
                let k: Vec<f32> = (0..w).map(|i| x - i as f32).collect();
                let v: Vec<f32> = (0..w).map(|i| x * 0.5 + i as f32).collect();
                kv.store(0, p % 2, p, &k, &v);
            }
            let mut a = Vec::new();
            kv.export_block(1, &mut a);
            assert_eq!(a.len(), kv.block_bytes());
            kv.import_block(0, &a).unwrap();
            let mut b = Vec::new();
            kv.export_block(0, &mut b);
            assert_eq!(a, b);
            assert!(kv.import_block(0, &a[1..]).is_err() && kv.import_block(3, &a).is_err());
            // A partial copy moves only the rows asked for, at every layer.
            kv.copy_block(2, 0, 2);
            for l in 0..2 {
                for p in 0..2 {
                    assert_eq!(kv.position_bytes(0, l, p), kv.position_bytes(2, l, p));
                }
                assert_eq!(kv.position_bytes(0, l, 2), kv.position_bytes(1, l, 2));
            }
            // Position 66 (layer 0, row 2 of block 2) was not copied over position 2.
            assert_ne!(kv.position_bytes(0, 0, 2), kv.position_bytes(2, 0, 2));
        }
    }
}
