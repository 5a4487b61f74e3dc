//! Quantized KV rows, llama.cpp's `-ctk/-ctv q8_0|q4_0`: storing a token's K or V row, the scores
//! of queries against a block of cached K rows, and a block of V rows back to f32.
//!
//! The rounding points are those of ggml-cpu's flash attention (`ggml_compute_forward_flash_attn_ext_f16`
//! with a quantized K and V; its tiled and split-KV paths take only f16/f32 caches):
//! - a K or V row is stored with the CPU `from_float` of the type (`ggml_compute_forward_set_rows`):
//!   for Q8_0 the x86 `quantize_row_q8_0` (`id = 127 / amax`, round half to even; not the
//!   reference `quantize_row_q8_0_ref`, `1 / d` and `roundf`, that `hearth_quant` writes weights
//!   and activations with), for Q4_0 `quantize_row_q4_0_ref`. Hearth uses the x86 rule on every
//!   architecture, so a row's bytes are the same everywhere (llama.cpp's NEON build differs);
//! - the query is quantized to K's `vec_dot_type` (Q8_0 for both) with the same Q8_0 `from_float`,
//!   and each score is K's `vec_dot` against it: an exact integer sum per 32-block, then one f32
//!   chain `acc = fma(dk * dq, isum_b, acc)` over the blocks in order (`hearth_quant`'s SIMD kernels,
//!   which compute it for any number of rows and tokens, and for a decoding row's few queries
//!   on AVX2 a kernel with the queries in lanes; ggml sums its lanes in another order);
//! - V rows are dequantized to f32 (`to_float`, exact: one product `q * d` per element) and the
//!   output is accumulated in f32 by attention as for an f16 cache.
//!
//! The rows arrive here rotated, Q and K alike, V with the output rotated back after attention,
//! as llama.cpp rotates a quantized cache ([`crate::kv_rotate`]); these kernels do not see it.
//!
//! Every element's bytes or bits are a function of its own row (and query) only, and every kernel
//! level (AVX-512, AVX2, scalar) gives the same bits: the scalar functions here are the twins the
//! SIMD ones are tested against.

#[cfg(target_arch = "x86_64")]
use std::ptr::read_unaligned;

use half::f16;
#[cfg(target_arch = "x86_64")]
use hearth_quant::simd::{vec_dot_matrix_at, Isa};
use hearth_quant::{cast_blocks, cast_blocks_mut, BlockQ4_0, BlockQ8_0, GgmlType, Level};

use crate::attention::KEYS;
#[cfg(target_arch = "x86_64")]
use crate::attention::MAX_HEAD_DIM;

/// Elements per quant block of both types.
pub(crate) const QK: usize = 32;

/// A quantized KV type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum KvQuant {
    /// 8-bit quants and an f16 scale per 32 elements (34 bytes).
    Q8_0,
    /// 4-bit quants and an f16 scale per 32 elements (18 bytes).
    Q4_0,
}

impl KvQuant {
    /// The GGML type.
    pub(crate) fn ggml(self) -> GgmlType {
        match self {
            KvQuant::Q8_0 => GgmlType::Q8_0,
            KvQuant::Q4_0 => GgmlType::Q4_0,
        }
    }

    /// Bytes of one 32-element block.
    pub(crate) fn block_bytes(self) -> usize {
        match self {
            KvQuant::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
            KvQuant::Q4_0 => std::mem::size_of::<BlockQ4_0>(),
        }
    }

    /// Bytes of a row of `n` elements (`n` a multiple of [`QK`]).
    pub(crate) fn row_bytes(self, n: usize) -> usize {
        debug_assert!(n.is_multiple_of(QK));
        n / QK * self.block_bytes()
    }
}

/// Bytes of a Q8_0 query row of `n` elements.
pub(crate) fn q8_row_bytes(n: usize) -> usize {
    KvQuant::Q8_0.row_bytes(n)
}

// ---------------------------------------------------------------------------------------------
// Storing a row.

/// Stores one row `src` (a token's K or V row, or a query) as `ty` blocks into `dst` (exactly
/// `ty.row_bytes(src.len())` bytes), rounded as llama.cpp's CPU `from_float` (see the module).
pub(crate) fn store_row(level: Level, ty: KvQuant, src: &[f32], dst: &mut [u8]) {
    assert!(src.len().is_multiple_of(QK) && dst.len() == ty.row_bytes(src.len()));
    match ty {
        KvQuant::Q8_0 => {
            let out: &mut [BlockQ8_0] = cast_blocks_mut(dst).expect("whole blocks");
            #[cfg(target_arch = "x86_64")]
            if level >= Level::Avx2 {
                // SAFETY: the level is at most what the CPU supports (hearth_quant checks);
                // lengths are checked above.
                return unsafe { store_q8_0_avx2(src, out) };
            }
            let _ = level;
            store_q8_0_scalar(src, out)
        }
        // Cold (one row per token and layer), so the reference quantizer at every level.
        KvQuant::Q4_0 => {
            hearth_quant::quantize_row_q4_0(src, cast_blocks_mut(dst).expect("whole blocks"))
        }
    }
}

/// `_mm_max_ps` on one lane: the second operand unless the first is greater (so a NaN in either
/// gives the second).
#[inline(always)]
fn maxps(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `vcvtps2dq` of an integral value, then the saturating packs to i8: out-of-range and NaN are
/// `i32::MIN` there, so -128 here.
#[inline(always)]
fn pack_i8(r: f32) -> i8 {
    let i = if r.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&r) {
        i32::MIN
    } else {
        r as i32
    };
    i.clamp(-128, 127) as i8
}

/// The scale (f16 bits, LE) and multiplier of a Q8_0 block whose maximum magnitude is `amax`.
#[inline(always)]
fn q8_scale(amax: f32) -> ([u8; 2], f32) {
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (f16::from_f32(d).to_bits().to_le_bytes(), id)
}

/// ggml-cpu's x86 `quantize_row_q8_0`, lane for lane: the maximum magnitude reduced in its
/// order (which decides the result only for NaN), `id = 127 / amax`, round half to even.
fn store_q8_0_scalar(src: &[f32], out: &mut [BlockQ8_0]) {
    for (x, b) in src.chunks_exact(QK).zip(out) {
        let mut m = [0f32; 8];
        for (l, m) in m.iter_mut().enumerate() {
            *m = x[l].abs();
            for r in 1..4 {
                *m = maxps(*m, x[8 * r + l].abs());
            }
        }
        let m4: [f32; 4] = std::array::from_fn(|l| maxps(m[l + 4], m[l]));
        let amax = maxps(maxps(m4[0], m4[2]), maxps(m4[1], m4[3]));
        let (d, id) = q8_scale(amax);
        b.d = d;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = pack_i8((v * id).round_ties_even());
        }
    }
}

/// [`store_q8_0_scalar`] with AVX2: llama.cpp's own instruction sequence.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_q8_0_avx2(src: &[f32], out: &mut [BlockQ8_0]) {
    use std::arch::x86_64::*;
    for (x, b) in src.chunks_exact(QK).zip(out) {
        let v: [__m256; 4] = std::array::from_fn(|r| _mm256_loadu_ps(x[8 * r..].as_ptr()));
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for r in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *r));
        }
        let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let (d, id) = q8_scale(_mm_cvtss_f32(m4));
        b.d = d;
        let mul = _mm256_set1_ps(id);
        let i: [__m256i; 4] = std::array::from_fn(|r| {
            _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(_mm256_mul_ps(v[r], mul)))
        });
        let lo = _mm256_packs_epi32(i[0], i[1]);
        let hi = _mm256_packs_epi32(i[2], i[3]);
        let q = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(lo, hi),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
        );
        _mm256_storeu_si256(b.qs.as_mut_ptr().cast(), q);
    }
}

// ---------------------------------------------------------------------------------------------
// Scores.

/// Cached K rows of one KV head in one block: row `k` (`k < count`) is
/// `data[k * stride..k * stride + ty.row_bytes(head_dim)]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyRows<'a> {
    /// The type of the rows.
    pub ty: KvQuant,
    /// The bytes, starting at the head's first row.
    pub data: &'a [u8],
    /// Bytes from one row to the next (a whole token's K row).
    pub stride: usize,
    /// Rows, at most [`KEYS`].
    pub count: usize,
}

impl<'a> KeyRows<'a> {
    /// The rows of head `h` (of `dim` elements) among `count` whole-token rows of `stride` bytes
    /// starting at `rows`.
    pub(crate) fn head(
        ty: KvQuant,
        rows: &'a [u8],
        stride: usize,
        dim: usize,
        h: usize,
        count: usize,
    ) -> KeyRows<'a> {
        KeyRows {
            ty,
            data: &rows[h * ty.row_bytes(dim)..],
            stride,
            count,
        }
    }
}

/// The raw scores `q · k` of `n` queries (Q8_0 rows of `hd` elements back to back in `q`, as
/// [`store_row`] writes them) against the block's keys: `out[j * KEYS + k]` for query `j` and key
/// `k < keys.count`, zero for the lanes past it (`out`: `[n, KEYS]`). Each score is a function of
/// its query row and key row only, the same bits at every level and for any `n`.
///
/// `ahead` names rows (and their bytes) to bring into L2 meanwhile, the next block's K and V rows
/// of the head: the AVX2 queries-in-lanes kernel prefetches them a row per key it scores, the
/// others at once.
pub(crate) fn scores(
    level: Level,
    hd: usize,
    keys: &KeyRows,
    q: &[u8],
    n: usize,
    out: &mut [f32],
    ahead: &[Ahead],
) {
    let qb = q8_row_bytes(hd);
    assert!(hd.is_multiple_of(QK) && keys.count <= KEYS && n * KEYS <= out.len());
    assert!(q.len() >= n * qb);
    let krow = keys.ty.row_bytes(hd);
    assert!(keys.count == 0 || keys.data.len() >= (keys.count - 1) * keys.stride + krow);
    for j in 0..n {
        out[j * KEYS + keys.count..(j + 1) * KEYS].fill(0.0);
    }
    if keys.count == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && n <= QUERY_LANES && hd <= MAX_HEAD_DIM {
        // A key costs the queries-in-lanes kernel the same for 1 query as for 4 (two keys a
        // register, `scores_pairs`) and for 5 as for 8; Q4_0 keys in `hearth_quant`'s kernel
        // cost per query, less than Q8_0's: one layer of the Qwen3-0.6B shape (2 queries per KV
        // head) at depth 4096, fastest of 60, 1823-1843 us there against 1980-2094 here (one key
        // a register), and with two keys a register 1526-1551 against 1529-1542 (6 alternating
        // runs); SmolLM2's 3 about the same before pairs; the MoE's 8 ~10% faster here.
        let lanes = match keys.ty {
            KvQuant::Q8_0 => true,
            KvQuant::Q4_0 => n >= 3,
        };
        if lanes {
            // SAFETY: the level is at most what the CPU supports (hearth_quant checks); the
            // lengths are checked above.
            return unsafe { scores_lanes_avx2(hd, keys, q, n, out, ahead) };
        }
    }
    for a in ahead {
        for k in 0..a.rows.count {
            a.prefetch(k);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if level >= Level::Avx2 {
        // hearth_quant's kernels compute the chain of `score_scalar` for any number of rows and
        // tokens, at every SIMD set (its tests check the sets agree bit for bit).
        let isa = if hearth_quant::kernel_level() == level {
            hearth_quant::kernel_isa()
        } else {
            Isa::from(level)
        };
        let w = hearth_quant::Rows {
            data: keys.data,
            stride: keys.stride,
            count: keys.count,
        };
        let a = hearth_quant::Rows {
            data: &q[..n * qb],
            stride: qb,
            count: n,
        };
        return vec_dot_matrix_at(isa, keys.ty.ggml(), hd, w, a, out, KEYS);
    }
    let _ = level;
    for j in 0..n {
        let qj: &[BlockQ8_0] = cast_blocks(&q[j * qb..(j + 1) * qb]).expect("whole blocks");
        for k in 0..keys.count {
            let row = &keys.data[k * keys.stride..k * keys.stride + krow];
            out[j * KEYS + k] = score_scalar(keys.ty, row, qj);
        }
    }
}

/// Most queries [`scores_lanes_avx2`] takes: one per lane.
#[cfg(target_arch = "x86_64")]
const QUERY_LANES: usize = 8;

/// One block of the queries in the lanes of [`scores_lanes_avx2`]: `qs[j]` holds in lane `l` bytes
/// `4j..4j + 4` of query `l`'s block (zero past the queries), `qa[j]` their absolute values (for
/// Q8_0 keys), `dq` the queries' scales, `q8` 8 times the sums of their quants (the offset of
/// Q4_0 keys). For [`scores_pairs`] lanes 4..8 repeat lanes 0..4.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct LaneBlock {
    qs: [std::arch::x86_64::__m256i; 8],
    qa: [std::arch::x86_64::__m256i; 8],
    dq: std::arch::x86_64::__m256,
    q8: std::arch::x86_64::__m256i,
}

/// [`scores`] of up to 8 queries on AVX2: a decoding row's query heads of one KV head. The
/// queries sit in the lanes (set up once per call: per block and 4-byte group, the 8 queries'
/// bytes, their absolute values, their sums, their scales) and each key's 4-byte groups are
/// broadcast, so a key's integer sums come out for all 8 queries at once, with no transposed key
/// rows and no per-query reduction. For Q8_0 keys the key-rows-in-lanes kernel of `hearth_quant`
/// is built for many tokens against long rows, and here (64 keys of 4 blocks, 8 queries: the
/// Qwen3-MoE shape) it took 36% of a decode step's attention at depth 16384. With this kernel and the next block's
/// rows prefetched a row per key (`ahead`) instead of all at once, that attention (12 layers, 2
/// threads, `bench_attention_at_depth`) went from 58-63 to 45-48 ms (fastest of 8, 3 alternating
/// runs). Q4_0 keys take their nibbles as the unsigned operand (`Σ nib * q - 8 Σ q`). Each
/// score's integer sum per block is exact and its f32 chain `acc = fma(dk * dq, isum_b, acc)`
/// runs over the blocks in order, as in [`score_scalar`] (Q8_0's sign trick `|q| * sign(k, q)`
/// is exact for quants in -127..=127, which every quantizer here writes; `hearth_quant` makes the
/// same assumption).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `hd <= MAX_HEAD_DIM`, `n <= QUERY_LANES` and the lengths are
/// those [`scores`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_lanes_avx2(
    hd: usize,
    keys: &KeyRows,
    q: &[u8],
    n: usize,
    out: &mut [f32],
    ahead: &[Ahead],
) {
    use std::arch::x86_64::*;
    const MAX_BLOCKS: usize = MAX_HEAD_DIM / QK;
    let (nb, qb) = (hd / QK, q8_row_bytes(hd));
    // The queries' blocks in lanes, one `LaneBlock` each.
    let pairs = n <= PAIR_QUERIES;
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    // Only the query's `nb` blocks are written (and read): zeroing all `MAX_BLOCKS` was 4-5% of
    // the attention of a quantized cache.
    let mut buf = [std::mem::MaybeUninit::<LaneBlock>::uninit(); MAX_BLOCKS];
    for (b, slot) in buf.iter_mut().enumerate().take(nb) {
        let mut d = [0u16; QUERY_LANES];
        let rows: [__m256; 8] = std::array::from_fn(|l| {
            if l < n {
                let at = l * qb + b * Q8_BYTES;
                d[l] = u16::from_le_bytes([q[at], q[at + 1]]);
                let x = &q[at + 2..at + Q8_BYTES];
                // SAFETY: `x` holds the block's 32 quants.
                _mm256_castsi256_ps(unsafe { _mm256_loadu_si256(x.as_ptr().cast()) })
            } else {
                _mm256_setzero_ps()
            }
        });
        // SAFETY: the caller's CPU has AVX2 and F16C.
        let mut dq = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast())) };
        // SAFETY: as above.
        let groups = unsafe { transpose8(rows) };
        let mut qs: [__m256i; 8] = std::array::from_fn(|j| _mm256_castps_si256(groups[j]));
        let mut sum = _mm256_setzero_si256();
        for q in &qs {
            let p = _mm256_maddubs_epi16(ones8, *q);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones16));
        }
        let mut q8 = _mm256_slli_epi32::<3>(sum);
        if pairs {
            // Lanes 4..8 repeat lanes 0..4: the upper half of a register serves a second key.
            for q in &mut qs {
                *q = _mm256_permute2x128_si256::<0x00>(*q, *q);
            }
            dq = _mm256_permute2f128_ps::<0x00>(dq, dq);
            q8 = _mm256_permute2x128_si256::<0x00>(q8, q8);
        }
        slot.write(LaneBlock {
            qs,
            qa: qs.map(|q| _mm256_abs_epi8(q)),
            dq,
            q8,
        });
    }
    // SAFETY: the first `nb` entries were written above.
    let lanes: &[LaneBlock] = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), nb) };
    if pairs {
        // SAFETY: the caller's contract; the queries' lanes are set up for pairs of keys.
        return unsafe { scores_pairs(keys, lanes, n, out, ahead) };
    }
    // Eight keys at a time, turned into eight queries' runs of 8 scores.
    const { assert!(KEYS.is_multiple_of(8)) };
    let mut k0 = 0;
    while k0 < keys.count {
        let mut r = [_mm256_setzero_ps(); 8];
        let mut i = 0;
        while i < 8 && k0 + i < keys.count {
            for a in ahead {
                a.prefetch(k0 + i);
                a.prefetch(k0 + i + 1);
            }
            let at = |k: usize| {
                // SAFETY: row `k < count` lies within `keys.data` (checked by the caller).
                unsafe { keys.data.as_ptr().add(k * keys.stride) }
            };
            // SAFETY (all four): the rows hold `nb` blocks of the type; the caller's CPU has
            // AVX2, FMA and F16C.
            if i + 1 < 8 && k0 + i + 1 < keys.count {
                let rows = [at(k0 + i), at(k0 + i + 1)];
                [r[i], r[i + 1]] = match keys.ty {
                    KvQuant::Q8_0 => unsafe { q8_0_keys::<2>(rows, lanes) },
                    KvQuant::Q4_0 => unsafe { q4_0_keys::<2>(rows, lanes) },
                };
                i += 2;
            } else {
                let rows = [at(k0 + i)];
                [r[i]] = match keys.ty {
                    KvQuant::Q8_0 => unsafe { q8_0_keys::<1>(rows, lanes) },
                    KvQuant::Q4_0 => unsafe { q4_0_keys::<1>(rows, lanes) },
                };
                i += 1;
            }
        }
        // SAFETY: the caller's CPU has AVX2.
        let t = unsafe { transpose8(r) };
        for (l, t) in t.iter().enumerate().take(n) {
            // `k0 + 8 <= KEYS`: `k0` is a multiple of 8 below `count <= KEYS`, a multiple of 8.
            let o = &mut out[l * KEYS + k0..l * KEYS + k0 + 8];
            // SAFETY: `o` holds 8 floats.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *t) };
        }
        k0 += 8;
    }
}

/// Most queries [`scores_pairs`] takes: four lanes a key, two keys a register.
#[cfg(target_arch = "x86_64")]
const PAIR_QUERIES: usize = 4;

/// [`scores_lanes_avx2`] for up to 4 queries (most GQA groups of dense models: 2 to 4 query heads
/// per KV head): a register's lower half holds the queries' lanes for key `k`, its upper half
/// for key `k + 4`, so no lane is idle past the queries and a pair of keys costs about what one
/// key costs 8 lanes. Each key's 4-byte groups come from one load of its block per pair
/// (`vperm2i128` and `vpshufd` put key `k`'s group in the lower lanes, key `k + 4`'s in the
/// upper). The integer sums and the f32 chain of every (query, key) are those of
/// [`scores_lanes_avx2`], lane for lane, so the same bits. Eight keys at a time give four
/// registers `[k | k + 4]`, `k < 4`, whose 4 × 4 transpose per half is each query's run of 8
/// scores in key order.
///
/// # Safety
/// As [`scores_lanes_avx2`], with `n <= PAIR_QUERIES` and the queries' lanes 4..8 a copy of
/// lanes 0..4.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_pairs(
    keys: &KeyRows,
    lanes: &[LaneBlock],
    n: usize,
    out: &mut [f32],
    ahead: &[Ahead],
) {
    use std::arch::x86_64::*;
    let at = |k: usize| {
        // SAFETY: row `k < count` lies within `keys.data` (checked by the caller).
        unsafe { keys.data.as_ptr().add(k * keys.stride) }
    };
    let mut k0 = 0;
    while k0 < keys.count {
        let mut r = [_mm256_setzero_ps(); 4];
        for i in (0..4).step_by(2) {
            if k0 + i >= keys.count {
                break;
            }
            for h in ahead {
                for k in [k0 + i, k0 + i + 4, k0 + i + 1, k0 + i + 5] {
                    h.prefetch(k);
                }
            }
            // A missing key reads the pair's first (or the block's first) again; its lanes are
            // cleared below.
            let row = |k: usize| at(if k < keys.count { k } else { k0 });
            let rows = [
                (row(k0 + i), row(k0 + i + 4)),
                (row(k0 + i + 1), row(k0 + i + 5)),
            ];
            // SAFETY: the rows hold `nb` blocks of the type; the caller's CPU has AVX2, FMA and
            // F16C; the queries' lanes are set up for pairs.
            [r[i], r[i + 1]] = match keys.ty {
                KvQuant::Q8_0 => unsafe { q8_0_pairs::<2>(rows, lanes) },
                KvQuant::Q4_0 => unsafe { q4_0_pairs::<2>(rows, lanes) },
            };
        }
        for (i, r) in r.iter_mut().enumerate() {
            match (k0 + i < keys.count, k0 + i + 4 < keys.count) {
                (false, _) => *r = _mm256_setzero_ps(),
                (true, false) => *r = _mm256_permute2f128_ps::<0x80>(*r, *r),
                (true, true) => {}
            }
        }
        // Per half, the 4 × 4 transpose: query `l` gets keys `k0..k0 + 4` in its lower half and
        // `k0 + 4..k0 + 8` in its upper one.
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t = [
            _mm256_shuffle_ps::<0x44>(t0, t2),
            _mm256_shuffle_ps::<0xEE>(t0, t2),
            _mm256_shuffle_ps::<0x44>(t1, t3),
            _mm256_shuffle_ps::<0xEE>(t1, t3),
        ];
        for (l, t) in t.iter().enumerate().take(n) {
            // `k0 + 8 <= KEYS`, as in `scores_lanes_avx2`.
            let o = &mut out[l * KEYS + k0..l * KEYS + k0 + 8];
            // SAFETY: `o` holds 8 floats.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *t) };
        }
        k0 += 8;
    }
}

/// The f16 scales of two keys' blocks as lanes `[a; 4] ++ [b; 4]` (F16C's widening, exact).
///
/// # Safety
/// The CPU has AVX2 and F16C; `a` and `b` point at blocks' 2-byte scales.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pair_scales(a: *const u8, b: *const u8) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        let (a, b) = (
            read_unaligned(a.cast::<u16>()),
            read_unaligned(b.cast::<u16>()),
        );
        let h = _mm_cvtsi32_si128((a as u32 | (b as u32) << 16) as i32);
        let h = _mm_unpacklo_epi16(h, h);
        _mm256_cvtph_ps(_mm_unpacklo_epi32(h, h))
    }
}

/// [`q8_0_keys`] for `R` pairs of keys `(k, k + 4)` in the lanes of [`scores_pairs`]: the same
/// operations per lane, the group of the lane's key broadcast over its half.
///
/// # Safety
/// As [`q8_0_keys`]; the queries' lanes are set up for pairs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q8_0_pairs<const R: usize>(
    rows: [(*const u8, *const u8); R],
    lanes: &[LaneBlock],
) -> [std::arch::x86_64::__m256; R] {
    use std::arch::x86_64::*;
    // SAFETY (all below): the caller's contract.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, l) in lanes.iter().enumerate() {
            let blk: [(*const u8, *const u8); R] =
                std::array::from_fn(|r| (rows[r].0.add(b * Q8_BYTES), rows[r].1.add(b * Q8_BYTES)));
            // Per pair: groups 0..4 of both keys, and groups 4..8.
            let halves: [[__m256i; 2]; R] = std::array::from_fn(|r| {
                let x = _mm256_loadu_si256(blk[r].0.add(2).cast());
                let y = _mm256_loadu_si256(blk[r].1.add(2).cast());
                [
                    _mm256_permute2x128_si256::<0x20>(x, y),
                    _mm256_permute2x128_si256::<0x31>(x, y),
                ]
            });
            let mut is = [_mm256_setzero_si256(); R];
            for j in 0..8 {
                let (s, a) = (l.qs[j], l.qa[j]);
                for r in 0..R {
                    let kb = group_of_halves(halves[r][j / 4], j);
                    is[r] = _mm256_add_epi32(is[r], q8_group(kb, s, a));
                }
            }
            for r in 0..R {
                let dk = pair_scales(blk[r].0, blk[r].1);
                acc[r] = chain_step(dk, is[r], l.dq, acc[r]);
            }
        }
        acc
    }
}

/// [`q4_0_keys`] for `R` pairs of keys `(k, k + 4)` in the lanes of [`scores_pairs`]: the same
/// operations per lane, the group of the lane's key broadcast over its half.
///
/// # Safety
/// As [`q4_0_keys`]; the queries' lanes are set up for pairs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q4_0_pairs<const R: usize>(
    rows: [(*const u8, *const u8); R],
    lanes: &[LaneBlock],
) -> [std::arch::x86_64::__m256; R] {
    use std::arch::x86_64::*;
    // SAFETY (all below): the caller's contract.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, l) in lanes.iter().enumerate() {
            let blk: [(*const u8, *const u8); R] =
                std::array::from_fn(|r| (rows[r].0.add(b * Q4_BYTES), rows[r].1.add(b * Q4_BYTES)));
            // Per pair: both keys' 16 bytes of nibbles.
            let x: [__m256i; R] = std::array::from_fn(|r| {
                _mm256_loadu2_m128i(blk[r].1.add(2).cast(), blk[r].0.add(2).cast())
            });
            let mut p16 = [_mm256_setzero_si256(); R];
            for g in 0..4 {
                let (lo_q, hi_q) = (l.qs[g], l.qs[4 + g]);
                for r in 0..R {
                    let kb = group_of_halves(x[r], g);
                    p16[r] = _mm256_add_epi16(p16[r], q4_group(kb, lo_q, hi_q));
                }
            }
            for r in 0..R {
                let is = _mm256_sub_epi32(_mm256_madd_epi16(p16[r], ones), l.q8);
                let dk = pair_scales(blk[r].0, blk[r].1);
                acc[r] = chain_step(dk, is, l.dq, acc[r]);
            }
        }
        acc
    }
}

/// The 4-byte group `g % 4` of each 128-bit half of `x`, broadcast over its half.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn group_of_halves(x: std::arch::x86_64::__m256i, g: usize) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    match g % 4 {
        0 => _mm256_shuffle_epi32::<0x00>(x),
        1 => _mm256_shuffle_epi32::<0x55>(x),
        2 => _mm256_shuffle_epi32::<0xAA>(x),
        _ => _mm256_shuffle_epi32::<0xFF>(x),
    }
}

/// A Q8_0 key's 4-byte group `kb` (in every lane) against the queries' group `s` (and its
/// absolute values `a`): per lane the i32 sum of the four products, `|q| * sign(k, q)` pairwise.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q8_group(
    kb: std::arch::x86_64::__m256i,
    s: std::arch::x86_64::__m256i,
    a: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let p = _mm256_maddubs_epi16(a, _mm256_sign_epi8(kb, s));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// A Q4_0 key's 4-byte group `kb` (in every lane; elements `4g..` in the low nibbles, `16 + 4g..`
/// in the high ones) against the queries' groups `g` and `4 + g`: per lane the i16 pair sums of
/// the eight products (at most 15 × 127 each, no overflow within a block).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q4_group(
    kb: std::arch::x86_64::__m256i,
    lo_q: std::arch::x86_64::__m256i,
    hi_q: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let nib = _mm256_set1_epi8(0x0f);
    let lo = _mm256_and_si256(kb, nib);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(kb), nib);
    _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, lo_q),
        _mm256_maddubs_epi16(hi, hi_q),
    )
}

/// Rows to bring into L2 while a kernel works on others: `bytes` bytes of each row of `rows`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ahead<'a> {
    pub rows: KeyRows<'a>,
    pub bytes: usize,
}

impl Ahead<'_> {
    /// Prefetches row `k`'s lines into L2 (nothing past the last row or the data).
    #[inline(always)]
    fn prefetch(&self, k: usize) {
        if k >= self.rows.count {
            return;
        }
        let from = k * self.rows.stride;
        let end = (from + self.bytes).min(self.rows.data.len());
        if let Some(row) = self.rows.data.get(from..end) {
            hearth_quant::prefetch_l2(row);
        }
    }
}

/// Bytes of a Q8_0 block.
#[cfg(target_arch = "x86_64")]
const Q8_BYTES: usize = std::mem::size_of::<BlockQ8_0>();

/// One block's step of the 8 lanes' f32 chains: `acc = fma(dk * dq, isum, acc)`, `dk` the lanes'
/// key scales ([`key_scale`], [`pair_scales`]), `dq` the queries'. Every kernel of quantized keys
/// runs this step, so their chains are the same bits.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn chain_step(
    dk: std::arch::x86_64::__m256,
    isum: std::arch::x86_64::__m256i,
    dq: std::arch::x86_64::__m256,
    acc: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_fmadd_ps(_mm256_mul_ps(dk, dq), _mm256_cvtepi32_ps(isum), acc)
}

/// The f16 scale at the start of a key's block `blk` in every lane (F16C's widening, exact as
/// `f16::to_f32`).
///
/// # Safety
/// The CPU has AVX2 and F16C; `blk` points at a block's 2-byte scale.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn key_scale(blk: *const u8) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        let dk = read_unaligned(blk.cast::<u16>());
        _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dk as i32)))
    }
}

/// Bytes of a Q4_0 block.
#[cfg(target_arch = "x86_64")]
const Q4_BYTES: usize = std::mem::size_of::<BlockQ4_0>();

/// [`q8_0_keys`] for Q4_0 keys: group `g < 4` of a block's 16 bytes holds elements `4g..4g + 4`
/// in its low nibbles and `16 + 4g..` in its high ones, each the unsigned operand against the
/// queries' group `g` or `4 + g` (products of at most 15 × 127, so a block's pair sums add up in
/// i16 without overflow), less `q8` (8 times the queries' sums) for the offset of 8.
///
/// # Safety
/// As [`q8_0_keys`], with Q4_0 blocks.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q4_0_keys<const R: usize>(
    rows: [*const u8; R],
    lanes: &[LaneBlock],
) -> [std::arch::x86_64::__m256; R] {
    use std::arch::x86_64::*;
    // SAFETY (all below): the caller's contract.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, l) in lanes.iter().enumerate() {
            let blk: [*const u8; R] = std::array::from_fn(|r| rows[r].add(b * Q4_BYTES));
            let mut p16 = [_mm256_setzero_si256(); R];
            for g in 0..4 {
                let (lo_q, hi_q) = (l.qs[g], l.qs[4 + g]);
                for r in 0..R {
                    let kb = _mm256_set1_epi32(read_unaligned(blk[r].add(2 + 4 * g).cast::<i32>()));
                    p16[r] = _mm256_add_epi16(p16[r], q4_group(kb, lo_q, hi_q));
                }
            }
            for r in 0..R {
                let is = _mm256_sub_epi32(_mm256_madd_epi16(p16[r], ones), l.q8);
                acc[r] = chain_step(key_scale(blk[r]), is, l.dq, acc[r]);
            }
        }
        acc
    }
}

/// The 8 lanes' scores of `R` keys (rows of `nb` Q8_0 blocks at `rows`) for
/// [`scores_lanes_avx2`]: per block the 8 integer sums, then the f32 chain; the queries' groups are
/// loaded once for the `R` keys.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; each row holds `nb <= MAX_HEAD_DIM / QK` blocks.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q8_0_keys<const R: usize>(
    rows: [*const u8; R],
    lanes: &[LaneBlock],
) -> [std::arch::x86_64::__m256; R] {
    use std::arch::x86_64::*;
    // SAFETY (all below): the caller's contract.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, l) in lanes.iter().enumerate() {
            let blk: [*const u8; R] = std::array::from_fn(|r| rows[r].add(b * Q8_BYTES));
            let mut is = [_mm256_setzero_si256(); R];
            for j in 0..8 {
                let (s, a) = (l.qs[j], l.qa[j]);
                for r in 0..R {
                    let kb = _mm256_set1_epi32(read_unaligned(blk[r].add(2 + 4 * j).cast::<i32>()));
                    is[r] = _mm256_add_epi32(is[r], q8_group(kb, s, a));
                }
            }
            for r in 0..R {
                acc[r] = chain_step(key_scale(blk[r]), is[r], l.dq, acc[r]);
            }
        }
        acc
    }
}

/// The 8 × 8 transpose: lane `i` of output `j` is lane `j` of input `i`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // t0 = (r0[0] r1[0] r0[1] r1[1] | r0[4] r1[4] r0[5] r1[5]), t1 the same for lanes 2, 3 / 6, 7.
    let s: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (
            t[4 * (i / 4) + (i % 4) / 2],
            t[4 * (i / 4) + 2 + (i % 4) / 2],
        );
        if i % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    // s0 = (r0[0] r1[0] r2[0] r3[0] | r0[4] ..), s1 = lane 1 / 5, s2 = lane 2 / 6, s3 = lane 3 / 7;
    // s4..s7 the same for rows 4..7.
    std::array::from_fn(|j| {
        let (a, b) = (s[j % 4], s[4 + j % 4]);
        if j < 4 {
            _mm256_permute2f128_ps::<0x20>(a, b)
        } else {
            _mm256_permute2f128_ps::<0x31>(a, b)
        }
    })
}

/// One score, the scalar twin of the SIMD kernels: per block the exact integer sum, then
/// `acc = fma(dk * dq, isum, acc)` in block order.
fn score_scalar(ty: KvQuant, k: &[u8], q: &[BlockQ8_0]) -> f32 {
    let dq = |b: &BlockQ8_0| f16::from_le_bytes(b.d).to_f32();
    let mut acc = 0f32;
    match ty {
        KvQuant::Q8_0 => {
            let k: &[BlockQ8_0] = cast_blocks(k).expect("whole blocks");
            for (k, q) in k.iter().zip(q) {
                let isum: i32 =
                    k.qs.iter()
                        .zip(&q.qs)
                        .map(|(&a, &b)| a as i32 * b as i32)
                        .sum();
                acc = (dq(k) * dq(q)).mul_add(isum as f32, acc);
            }
        }
        KvQuant::Q4_0 => {
            let k: &[BlockQ4_0] = cast_blocks(k).expect("whole blocks");
            for (k, q) in k.iter().zip(q) {
                let mut isum = 0i32;
                for j in 0..QK / 2 {
                    isum += ((k.qs[j] & 0x0f) as i32 - 8) * q.qs[j] as i32;
                    isum += ((k.qs[j] >> 4) as i32 - 8) * q.qs[j + QK / 2] as i32;
                }
                let dk = f16::from_le_bytes(k.d).to_f32();
                acc = (dk * dq(q)).mul_add(isum as f32, acc);
            }
        }
    }
    acc
}

// ---------------------------------------------------------------------------------------------
// Values.

/// Cached V rows of one KV head in one block, laid out as [`KeyRows`].
pub(crate) type ValueRows<'a> = KeyRows<'a>;

/// The block's V rows as f32: `out[k * hdv..(k + 1) * hdv]` for `k < vals.count` (`out`:
/// `[count, hdv]`). Exact (`q * d`, one rounding), so every level writes the same bits.
pub(crate) fn values(level: Level, hdv: usize, vals: &ValueRows, out: &mut [f32]) {
    let row = vals.ty.row_bytes(hdv);
    assert!(hdv.is_multiple_of(QK) && out.len() >= vals.count * hdv);
    assert!(vals.count == 0 || vals.data.len() >= (vals.count - 1) * vals.stride + row);
    for k in 0..vals.count {
        let src = &vals.data[k * vals.stride..k * vals.stride + row];
        let dst = &mut out[k * hdv..(k + 1) * hdv];
        #[cfg(target_arch = "x86_64")]
        if level >= Level::Avx2 {
            // SAFETY: the level is at most what the CPU supports; lengths checked above.
            unsafe {
                match (level, vals.ty) {
                    (Level::Avx512, KvQuant::Q8_0) => values_q8_0_avx512(src, dst),
                    (Level::Avx512, KvQuant::Q4_0) => values_q4_0_avx512(src, dst),
                    (_, KvQuant::Q8_0) => values_q8_0_avx2(src, dst),
                    (_, KvQuant::Q4_0) => values_q4_0_avx2(src, dst),
                }
            }
            continue;
        }
        let _ = level;
        values_scalar(vals.ty, src, dst);
    }
}

/// One row, the scalar twin: `hearth_quant`'s dequantizers (bit-exact with ggml's `to_float`).
fn values_scalar(ty: KvQuant, src: &[u8], dst: &mut [f32]) {
    match ty {
        KvQuant::Q8_0 => hearth_quant::dequantize_row_q8_0(cast_blocks(src).expect("blocks"), dst),
        KvQuant::Q4_0 => hearth_quant::dequantize_row_q4_0(cast_blocks(src).expect("blocks"), dst),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_q8_0_avx2(src: &[u8], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let blocks: &[BlockQ8_0] = cast_blocks(src).expect("blocks");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = _mm256_set1_ps(f16::from_le_bytes(b.d).to_f32());
        for c in 0..4 {
            let q = _mm_loadl_epi64(b.qs[8 * c..].as_ptr().cast());
            let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            _mm256_storeu_ps(y[8 * c..].as_mut_ptr(), _mm256_mul_ps(f, d));
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_q4_0_avx2(src: &[u8], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let blocks: &[BlockQ4_0] = cast_blocks(src).expect("blocks");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = _mm256_set1_ps(f16::from_le_bytes(b.d).to_f32());
        let eight = _mm256_set1_epi32(8);
        let nib = _mm256_set1_epi32(0x0f);
        for c in 0..2 {
            // Bytes 8c..8c + 8: elements 8c.. (low nibbles) and 16 + 8c.. (high nibbles).
            let u = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.qs[8 * c..].as_ptr().cast()));
            let lo = _mm256_sub_epi32(_mm256_and_si256(u, nib), eight);
            let hi = _mm256_sub_epi32(_mm256_srli_epi32::<4>(u), eight);
            _mm256_storeu_ps(
                y[8 * c..].as_mut_ptr(),
                _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d),
            );
            _mm256_storeu_ps(
                y[16 + 8 * c..].as_mut_ptr(),
                _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d),
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn values_q8_0_avx512(src: &[u8], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let blocks: &[BlockQ8_0] = cast_blocks(src).expect("blocks");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = _mm512_set1_ps(f16::from_le_bytes(b.d).to_f32());
        for c in 0..2 {
            let q = _mm_loadu_si128(b.qs[16 * c..].as_ptr().cast());
            let f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
            _mm512_storeu_ps(y[16 * c..].as_mut_ptr(), _mm512_mul_ps(f, d));
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn values_q4_0_avx512(src: &[u8], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let blocks: &[BlockQ4_0] = cast_blocks(src).expect("blocks");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = _mm512_set1_ps(f16::from_le_bytes(b.d).to_f32());
        let u = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.qs.as_ptr().cast()));
        let eight = _mm512_set1_epi32(8);
        let lo = _mm512_sub_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x0f)), eight);
        let hi = _mm512_sub_epi32(_mm512_srli_epi32::<4>(u), eight);
        _mm512_storeu_ps(y.as_mut_ptr(), _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
        _mm512_storeu_ps(
            y[16..].as_mut_ptr(),
            _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d),
        );
    }
}

#[cfg(test)]
mod tests;
