//! Q4_K and Q6_K rows interleaved four at a time (`crate::interleave`) against Q8_K activations,
//! with AVX2.
//!
//! Per group super-block and sub-block `j` of 32 elements: two 32-byte loads hold 8 quants of each
//! of the four rows (`[r0 | r1 ‖ r2 | r3]`, 8 bytes each), their two nibbles make four registers,
//! and each meets a register holding the matching 8 activation bytes four times over (laid out once
//! per call). The four `vpmaddubsw` results add up in i16 (exact: 16 products of at most 15 · 128
//! per word), one `vpmaddwd` multiplies them by the four rows' scale `j` (spread by one in-lane
//! `vpshufb`) and adds pairs into i32: lanes `[r0 r0 r1 r1 ‖ r2 r2 r3 r3]`. Per super-block the lanes
//! give each row its exact `Σ sc·q·y`, and a `vpmaddwd` of the minimums by the activation's sums of
//! 32 its `Σ m·bsum`; the four rows' f32 chains, `acc = fma(d·dy, isum, acc)` and the minimums'
//! `accm`, run in the four lanes of a 128-bit register: each lane the same operations in the same
//! order as the one-row kernels and the scalar oracle, so the results are the same bits.
//!
//! Q6_K goes the same way per 32 elements: two 32-byte loads of low nibbles and one of top bits make
//! four registers of six-bit quants, the two `vpmaddubsw` of each 16-element sub-block add up in i16
//! (8 products of at most 63 · 128 per word) and one `vpmaddwd` takes the four rows' scales; the
//! quants' `- 32` comes out per super-block as `32 · Σ scale · (sum of 16 activations)`, a
//! `vpmaddwd` per four sub-blocks, and the f32 chain `acc = fma(d·dy, isum, acc)` again runs in
//! four lanes.
//!
//! One or two tokens (decode, a pair of sequences) go through these kernels, each unpacked weight
//! register serving both. More tokens (prefill, batched decode) go through the 8-lane kernels of
//! `kquants.rs`, which unpack 8 rows once for up to 64 tokens: loaders at the end of this file build
//! their transposed chunk of the file's bytes straight from two groups, in registers (see there).
//! Q4_K unpacks 16 rows (four groups) at a time there, each activation broadcast meeting both
//! halves (`kquants::scaled_wide`).

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::kquants::{KQuant, K, KP, Q4K, Q6K};
use super::{
    act_ptrs, prefetch_share, regions, steps, store, wide_chains, Dp, Fmt, TChunk, LANES, MAX_DW,
};
use crate::block::cast_blocks;
use crate::interleave::{GROUP_ROWS, Q4_K_GROUP_BLOCK, Q6_K_GROUP_BLOCK, Q6_K_GROUP_QUANTS};
use crate::k_quants::BlockQ8K;
use crate::simd::{Rows, PASS};

/// Bytes ahead of the group super-block being read that the kernel prefetches into L1. Reading a
/// 32768 × 2048 matrix from memory on Zen 1, one thread: 1152 / 2048 / 4096 / 8192 bytes ahead gave
/// 9.5 / 9.4 / 9.7 / 9.5 GB/s.
const AHEAD: usize = 2048;

/// Bytes ahead that the kernel also prefetches into L2, so that more lines are on their way from
/// memory than L1's fill buffers hold. The 12-layer Qwen3-MoE's decode (`hearth bench -p 0 -n 64`,
/// 2 threads, an Intel Xeon, three alternating rounds each, t/s): L1 only at 4096 bytes 33.3 /
/// 34.1 / 33.2; with L2 at 8192 (L1 at 2048) 35.7 / 36.3 / 36.8, at 12288 (L1 at 1024) 36.2 /
/// 36.2 / 35.7, at 20480 (L1 at 2048) 35.0 / 36.3 / 35.6. The AVX2 path: 35.1 / 35.2 / 32.6
/// against 37.5 / 36.5 / 36.0.
const AHEAD_L2: usize = 8192;

/// Tokens whose activations one pass over the weights serves. Each unpacked weight register then
/// serves four; 2 or 8 tokens were slower (prefill of 64 tokens, 768 × 2048, Zen 1: 20.8 / 23.1
/// G multiply-adds/s against 23.6). Callers now pass at most two tokens (`vec_dot_matrix_interleaved_at`).
const TOKENS: usize = 4;

/// The activation of one token as the kernels read it: for each super-block, 32 registers (8 bytes
/// of quants four times over, bytes `8t..8t + 8` in register `t`), then the sums of 32 quants in
/// both halves of one register (Q4_K's minimums), then four registers of the sums of 16 (Q6_K's
/// `- 32`: sums `4G..4G + 4` four times over in register `33 + G`); and `d` per super-block.
struct Expanded {
    /// `[tokens][nb][REGS]`.
    regs: Vec<__m256i>,
    /// `[tokens][nb]`.
    d: Vec<f32>,
}

/// Registers per super-block in [`Expanded::regs`].
const REGS: usize = 37;

thread_local! {
    /// Grown once per thread: the hot path does not allocate.
    static SCRATCH: RefCell<Expanded> = const {
        RefCell::new(Expanded { regs: Vec::new(), d: Vec::new() })
    };
}

/// Lays out `a` (one token, `nb` super-blocks) into `regs` and `d`.
#[inline(always)]
unsafe fn expand(a: &[BlockQ8K], regs: &mut [__m256i], d: &mut [f32]) {
    for ((y, r), d) in a.iter().zip(regs.chunks_exact_mut(REGS)).zip(d) {
        for (t, reg) in r[..32].iter_mut().enumerate() {
            let v = std::ptr::read_unaligned(y.qs[8 * t..].as_ptr().cast::<i64>());
            *reg = _mm256_set1_epi64x(v);
        }
        let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        let s = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
        r[32] = _mm256_broadcastsi128_si256(s);
        for (g, reg) in r[33..].iter_mut().enumerate() {
            let v = std::ptr::read_unaligned(y.bsums[8 * g..].as_ptr().cast::<i64>());
            *reg = _mm256_set1_epi64x(v);
        }
        *d = y.d();
    }
}

/// The scales (values 0..32) and minimums (32..64) of a group super-block, one byte each, in the
/// layout's order.
#[inline(always)]
unsafe fn scales_mins(blk: *const u8) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(0x03);
    let lo = _mm256_loadu_si256(blk.add(16).cast());
    let h = _mm_loadu_si128(blk.add(48).cast());
    // Bits 0..1 and 4..5 of each byte: values k and 32 + k in the low half, 16 + k and 48 + k
    // (bits 2..3 and 6..7, shifted down) in the high one.
    let hx = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(h), _mm_srli_epi16::<2>(h));
    let sc = _mm256_or_si256(
        _mm256_and_si256(lo, m4),
        _mm256_slli_epi16::<4>(_mm256_and_si256(hx, m3)),
    );
    let mn = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16::<4>(lo), m4),
        _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(hx), m3)),
    );
    (sc, mn)
}

/// Sub-block `j` of the group super-block at `blk` against `T` tokens' activations (`ys[t]`, the
/// super-block's [`REGS`] registers): adds each row's products times its scale to `sumi[t]`.
#[inline(always)]
unsafe fn sub_block<const T: usize>(
    blk: *const u8,
    j: usize,
    sc: __m256i,
    pick: __m256i,
    ys: &[*const __m256i; T],
    sumi: &mut [__m256i; T],
) {
    let m4 = _mm256_set1_epi8(0x0f);
    // The 576 bytes ahead, one line per 64 bytes (9 lines over the 8 sub-blocks), into L1 and,
    // further on, into L2.
    let ahead = blk.wrapping_add(AHEAD + 64 * j);
    let far = blk.wrapping_add(AHEAD_L2 + 64 * j);
    _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
    _mm_prefetch::<_MM_HINT_T1>(far.cast());
    if j == 7 {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
        _mm_prefetch::<_MM_HINT_T1>(far.wrapping_add(64).cast());
    }
    let w0 = _mm256_loadu_si256(blk.add(64 + 64 * j).cast());
    let w1 = _mm256_loadu_si256(blk.add(96 + 64 * j).cast());
    let q = [
        _mm256_and_si256(w0, m4),
        _mm256_and_si256(_mm256_srli_epi16::<4>(w0), m4),
        _mm256_and_si256(w1, m4),
        _mm256_and_si256(_mm256_srli_epi16::<4>(w1), m4),
    ];
    let s = _mm256_shuffle_epi8(sc, pick);
    for t in 0..T {
        let y = ys[t].add(4 * j);
        let p = _mm256_add_epi16(
            _mm256_add_epi16(
                _mm256_maddubs_epi16(q[0], *y),
                _mm256_maddubs_epi16(q[1], *y.add(1)),
            ),
            _mm256_add_epi16(
                _mm256_maddubs_epi16(q[2], *y.add(2)),
                _mm256_maddubs_epi16(q[3], *y.add(3)),
            ),
        );
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, s));
    }
}

/// The four rows' results of group `g` for each of `T` tokens (`v[t]`, in row order) into `out`.
#[inline(always)]
unsafe fn store_group<const T: usize>(
    v: &[__m128; T],
    g: usize,
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    for (t, v) in v.iter().enumerate() {
        let mut r = [0f32; GROUP_ROWS];
        _mm_storeu_ps(r.as_mut_ptr(), *v);
        for (i, x) in r.into_iter().enumerate() {
            out[t * tok_stride + (GROUP_ROWS * g + i) * row_stride] = x;
        }
    }
}

/// `T` tokens through the Q4_K groups of `w`: for each group and token the four rows' results.
///
/// # Safety
/// AVX2, FMA and F16C; `x` holds `T` tokens' expanded activations, `w` and `out` as [`q4_k`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_pass<const T: usize>(
    nb: usize,
    w: &Rows,
    x: &Expanded,
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    // The activations' registers are read through pointers below.
    assert!(x.regs.len() >= T * nb * REGS && x.d.len() >= T * nb);
    // `pick[j]`: scale j of row 0 (byte j) in words 0..3 of the low half and of row 1 (byte 8 + j)
    // in words 4..7; the same shuffle picks rows 2 and 3 in the high half. Zero high bytes.
    let mut pick = [_mm256_setzero_si256(); 8];
    for (j, p) in pick.iter_mut().enumerate() {
        let (a, b) = ((j as i16) | (-128i16 << 8), (8 + j as i16) | (-128i16 << 8));
        *p = _mm256_setr_epi16(a, a, a, a, b, b, b, b, a, a, a, a, b, b, b, b);
    }
    let groups = w.count / GROUP_ROWS;
    let base = w.data.as_ptr();
    for g in 0..groups {
        let gb = base.add(g * nb * Q4_K_GROUP_BLOCK);
        let mut acc = [_mm_setzero_ps(); T];
        let mut accm = [_mm_setzero_ps(); T];
        // Unpacked one super-block ahead: the compiler otherwise hoists the products above the
        // unpacking and spills them.
        let mut next = scales_mins(gb);
        for b in 0..nb {
            let blk = gb.add(b * Q4_K_GROUP_BLOCK);
            let (sc, mn) = next;
            if b + 1 < nb {
                next = scales_mins(blk.add(Q4_K_GROUP_BLOCK));
            }
            let mut ys = [std::ptr::null::<__m256i>(); T];
            for (t, y) in ys.iter_mut().enumerate() {
                *y = x.regs.as_ptr().add((t * nb + b) * REGS);
            }
            let mut sumi = [_mm256_setzero_si256(); T];
            // Unrolled by hand: as a loop the compiler kept it rolled, with its counter and
            // the picks' loads.
            for j in [0, 1, 2, 3, 4, 5, 6, 7] {
                sub_block(blk, j, sc, pick[j], &ys, &mut sumi);
                // A fence for the compiler only (it reads memory, so no load moves across it):
                // without it all 32 sub-blocks' products were hoisted together and spilled,
                // 11.2 GB/s against 12.1 (768 × 2048, in cache) on Zen 1.
                std::arch::asm!("/* {0} */", inout(ymm_reg) sumi[0], options(nostack, preserves_flags));
            }
            // Minimums: rows 0, 1 from the low half, 2, 3 from the high one, times the sums of 32.
            let m01 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(mn));
            let m23 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(mn));
            let d4 = _mm_cvtph_ps(_mm_loadl_epi64(blk.cast()));
            let dm4 = _mm_cvtph_ps(_mm_loadl_epi64(blk.add(8).cast()));
            for t in 0..T {
                let bsums = *ys[t].add(32);
                // `[r0 r0 r2 r2 ‖ r1 r1 r3 r3]`, then `[r0, r2, r1, r3]`, then in row order.
                let m =
                    _mm256_hadd_epi32(_mm256_madd_epi16(m01, bsums), _mm256_madd_epi16(m23, bsums));
                let m = _mm_hadd_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
                let msum = _mm_shuffle_epi32::<0b11_01_10_00>(m);
                // `[r0 r0 r1 r1 ‖ r2 r2 r3 r3]` to row order.
                let isum = _mm_hadd_epi32(
                    _mm256_castsi256_si128(sumi[t]),
                    _mm256_extracti128_si256::<1>(sumi[t]),
                );
                let dy = _mm_set1_ps(x.d[t * nb + b]);
                acc[t] = _mm_fmadd_ps(_mm_mul_ps(d4, dy), _mm_cvtepi32_ps(isum), acc[t]);
                accm[t] = _mm_fmadd_ps(_mm_mul_ps(dm4, dy), _mm_cvtepi32_ps(msum), accm[t]);
            }
        }
        for t in 0..T {
            acc[t] = _mm_sub_ps(acc[t], accm[t]);
        }
        store_group(&acc, g, out, tok_stride, row_stride);
    }
}

/// Elements `32c..32c + 32` of the Q6_K group super-block at `blk` against `T` tokens' activations
/// (`ys[t]`): adds each row's products times its scales to `sumi[t]` (sub-blocks `2c`, `2c + 1`).
#[inline(always)]
unsafe fn q6_k_chunk<const T: usize>(
    blk: *const u8,
    c: usize,
    sc: &[__m256i; 4],
    pick: &[__m256i; 4],
    ys: &[*const __m256i; T],
    sumi: &mut [__m256i; T],
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    // 840 bytes a super-block: two lines per 96-byte chunk keep well ahead, into L1 and L2, and
    // the last chunk a third (offset 800). Without it, as 840 is 8 past a multiple of 64, five
    // super-blocks in eight left one line near their end unasked for: a load from memory.
    let ahead = blk.wrapping_add(AHEAD + 96 * c);
    let far = blk.wrapping_add(AHEAD_L2 + 96 * c);
    _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
    _mm_prefetch::<_MM_HINT_T1>(far.cast());
    _mm_prefetch::<_MM_HINT_T1>(far.wrapping_add(64).cast());
    if c == 7 {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(128).cast());
        _mm_prefetch::<_MM_HINT_T1>(far.wrapping_add(128).cast());
    }
    let p = blk.add(Q6_K_GROUP_QUANTS + 96 * c);
    let w0 = _mm256_loadu_si256(p.cast());
    let w1 = _mm256_loadu_si256(p.add(32).cast());
    let h = _mm256_loadu_si256(p.add(64).cast());
    // Top bits 2i..2i + 1 of each byte to bits 4..5 (16-bit shifts: what crosses a byte is masked).
    let q = [
        _mm256_or_si256(
            _mm256_and_si256(w0, m4),
            _mm256_and_si256(_mm256_slli_epi16::<4>(h), m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(w0), m4),
            _mm256_and_si256(_mm256_slli_epi16::<2>(h), m30),
        ),
        _mm256_or_si256(_mm256_and_si256(w1, m4), _mm256_and_si256(h, m30)),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(w1), m4),
            _mm256_and_si256(_mm256_srli_epi16::<2>(h), m30),
        ),
    ];
    let (ja, jb) = (2 * c, 2 * c + 1);
    let sa = _mm256_shuffle_epi8(sc[ja / 4], pick[ja % 4]);
    let sb = _mm256_shuffle_epi8(sc[jb / 4], pick[jb % 4]);
    for t in 0..T {
        let y = ys[t].add(4 * c);
        let pa = _mm256_add_epi16(
            _mm256_maddubs_epi16(q[0], *y),
            _mm256_maddubs_epi16(q[1], *y.add(1)),
        );
        let pb = _mm256_add_epi16(
            _mm256_maddubs_epi16(q[2], *y.add(2)),
            _mm256_maddubs_epi16(q[3], *y.add(3)),
        );
        sumi[t] = _mm256_add_epi32(
            sumi[t],
            _mm256_add_epi32(_mm256_madd_epi16(pa, sa), _mm256_madd_epi16(pb, sb)),
        );
    }
}

/// `T` tokens through the Q6_K groups of `w`: for each group and token the four rows' results.
///
/// # Safety
/// AVX2, FMA and F16C; `x` holds `T` tokens' expanded activations, `w` and `out` as [`q6_k`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_pass<const T: usize>(
    nb: usize,
    w: &Rows,
    x: &Expanded,
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    assert!(x.regs.len() >= T * nb * REGS && x.d.len() >= T * nb);
    // `pick[i]`: in each 128-bit half, word i of the first row (words 0..3) and of the second
    // (words 4..7), each four times: a register of scales `4G + i`, in the layout's order.
    let mut pick = [_mm256_setzero_si256(); 4];
    for (i, p) in pick.iter_mut().enumerate() {
        let (a, b) = (2 * i as i16, 8 + 2 * i as i16);
        let (a, b) = (a | ((a + 1) << 8), b | ((b + 1) << 8));
        *p = _mm256_setr_epi16(a, a, a, a, b, b, b, b, a, a, a, a, b, b, b, b);
    }
    let groups = w.count / GROUP_ROWS;
    let base = w.data.as_ptr();
    for g in 0..groups {
        let gb = base.add(g * nb * Q6_K_GROUP_BLOCK);
        let mut acc = [_mm_setzero_ps(); T];
        for b in 0..nb {
            let blk = gb.add(b * Q6_K_GROUP_BLOCK);
            // Scales of sub-blocks 4G..4G + 4: rows 0, 1 in the low half, 2, 3 in the high one.
            let mut sc = [_mm256_setzero_si256(); 4];
            for (k, s) in sc.iter_mut().enumerate() {
                *s = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(8 + 16 * k).cast()));
            }
            let mut ys = [std::ptr::null::<__m256i>(); T];
            for (t, y) in ys.iter_mut().enumerate() {
                *y = x.regs.as_ptr().add((t * nb + b) * REGS);
            }
            let mut sumi = [_mm256_setzero_si256(); T];
            for c in [0, 1, 2, 3, 4, 5, 6, 7] {
                q6_k_chunk(blk, c, &sc, &pick, &ys, &mut sumi);
                // As in `q4_k_pass`: keeps the chunks' products from being hoisted and spilled.
                std::arch::asm!("/* {0} */", inout(ymm_reg) sumi[0], options(nostack, preserves_flags));
            }
            let d4 = _mm_cvtph_ps(_mm_loadl_epi64(blk.cast()));
            for t in 0..T {
                // `Σ scale · sum of 16`, lanes `[r0 r0 r1 r1 ‖ r2 r2 r3 r3]` like `sumi`.
                let mut corr = _mm256_setzero_si256();
                for (g, s) in sc.iter().enumerate() {
                    corr = _mm256_add_epi32(corr, _mm256_madd_epi16(*s, *ys[t].add(33 + g)));
                }
                let v = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32::<5>(corr));
                let isum =
                    _mm_hadd_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
                let dy = _mm_set1_ps(x.d[t * nb + b]);
                acc[t] = _mm_fmadd_ps(_mm_mul_ps(d4, dy), _mm_cvtepi32_ps(isum), acc[t]);
            }
        }
        store_group(&acc, g, out, tok_stride, row_stride);
    }
}

/// A pass of one type's kernel over `T` tokens (`[T = 1, 2, 3, 4]`).
type PassFn = unsafe fn(usize, &Rows, &Expanded, &mut [f32], usize, usize);

/// The activations expanded [`TOKENS`] at a time, each set through one of `passes`.
///
/// # Safety
/// As `crate::traits::MatrixFn`, with AVX2, FMA and F16C; `block` is the type's bytes per
/// super-block of one row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
    block: usize,
    passes: [PassFn; TOKENS],
) {
    let nb = n / 256;
    assert!(
        w.count % GROUP_ROWS == 0 && w.data.len() >= w.count * nb * block,
        "interleaved rows: {} rows",
        w.count
    );
    if nb == 0 {
        for t in 0..acts.len() {
            for i in 0..w.count {
                out[t * tok_stride + i * row_stride] = 0.0;
            }
        }
        return;
    }
    // The thread's scratch, borrowed here rather than in a closure of `with`: a closure does not
    // inherit this function's target features, and `expand`'s intrinsics were calls there.
    let scratch: *const RefCell<Expanded> = SCRATCH.with(|s| s as *const _);
    // SAFETY: the thread-local outlives this call on its own thread.
    let mut x = (*scratch).borrow_mut();
    let x = &mut *x;
    let need = TOKENS * nb;
    if x.d.len() < need {
        x.d.resize(need, 0.0);
        x.regs.resize(need * REGS, _mm256_setzero_si256());
    }
    for (c, chunk) in acts.chunks(TOKENS).enumerate() {
        for (t, a) in chunk.iter().enumerate() {
            let a: &[BlockQ8K] = cast_blocks(a).expect("one activation row");
            expand(
                &a[..nb],
                &mut x.regs[t * nb * REGS..(t + 1) * nb * REGS],
                &mut x.d[t * nb..(t + 1) * nb],
            );
        }
        let out = &mut out[c * TOKENS * tok_stride..];
        passes[chunk.len() - 1](nb, w, x, out, tok_stride, row_stride);
    }
}

/// Q4_K interleaved rows × Q8_K activations (see `crate::traits::MatrixFn`; `w.count` whole
/// groups of [`GROUP_ROWS`] rows, back to back).
///
/// # Safety
/// As `crate::traits::MatrixFn`, with AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_k(
    n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    let passes: [PassFn; TOKENS] = [
        q4_k_pass::<1>,
        q4_k_pass::<2>,
        q4_k_pass::<3>,
        q4_k_pass::<4>,
    ];
    run(
        n,
        w,
        acts,
        out,
        tok_stride,
        row_stride,
        Q4_K_GROUP_BLOCK / GROUP_ROWS,
        passes,
    );
}

/// Q6_K interleaved rows × Q8_K activations (see `crate::traits::MatrixFn`; `w.count` whole
/// groups of [`GROUP_ROWS`] rows, back to back).
///
/// # Safety
/// As `crate::traits::MatrixFn`, with AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k(
    n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    let passes: [PassFn; TOKENS] = [
        q6_k_pass::<1>,
        q6_k_pass::<2>,
        q6_k_pass::<3>,
        q6_k_pass::<4>,
    ];
    run(
        n,
        w,
        acts,
        out,
        tok_stride,
        row_stride,
        Q6_K_GROUP_BLOCK / GROUP_ROWS,
        passes,
    );
}

// ---------------------------------------------------------------------------------------------
// Many tokens: the 8-lane kernels of `kquants.rs` over two groups at a time.
//
// The one-row-group kernel above unpacks each weight register for at most four tokens; the 8-lane
// kernels unpack a super-block of 8 rows once for up to 64 tokens, which is what prefill wants.
// They read a transposed chunk (`TChunk`: dword `k` of the file's super-block, row `r` in lane
// `r`); the loaders below build that chunk straight from two interleaved groups (rows 0..3 from
// the first, 4..7 from the second), in registers, so the products see the very bytes of the
// file's layout and give the same bits as over the file's rows.

/// Low nibbles of every byte.
#[inline(always)]
unsafe fn nibbles() -> __m256i {
    _mm256_set1_epi8(0x0f)
}

/// Sub-blocks `e` (low nibbles) and `f` (high) of the same 8 elements of four rows, packed as the
/// file packs a pair of sub-blocks: (elements `k`, elements `8 + k`) of each row's 16.
#[inline(always)]
unsafe fn pair_nibbles(e: __m256i, f: __m256i) -> (__m256i, __m256i) {
    let m = nibbles();
    let lo = _mm256_or_si256(
        _mm256_and_si256(e, m),
        _mm256_slli_epi16::<4>(_mm256_and_si256(f, m)),
    );
    let hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16::<4>(e), m),
        _mm256_andnot_si256(m, f),
    );
    (lo, hi)
}

/// Registers holding two dwords of each of four rows (`[r0 d0, r0 d1, r1 d0, ..]`), one per group,
/// as two chunk registers: dword 0 of the eight rows and dword 1.
#[inline(always)]
unsafe fn to_lanes(a: __m256i, b: __m256i) -> (__m256i, __m256i) {
    let ord = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    let x = _mm256_permutevar8x32_epi32(a, ord);
    let y = _mm256_permutevar8x32_epi32(b, ord);
    (
        _mm256_permute2x128_si256::<0x20>(x, y),
        _mm256_permute2x128_si256::<0x31>(x, y),
    )
}

/// Four 16-byte values, rows 0..3 of group `a` and of group `b`, as one chunk register.
#[inline(always)]
unsafe fn join(a: __m128i, b: __m128i) -> __m256i {
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b)
}

/// The 32 bytes at `o` of `g`.
#[inline(always)]
unsafe fn load(g: *const u8, o: usize) -> __m256i {
    _mm256_loadu_si256(g.add(o).cast())
}

/// `d | dmin << 16` of each of a Q4_K group's four rows.
#[inline(always)]
unsafe fn d_dmin(g: *const u8) -> __m128i {
    let x = _mm_loadu_si128(g.cast());
    _mm_unpacklo_epi16(x, _mm_srli_si128::<8>(x))
}

/// Bits 4..5 of each byte at bits 6..7 (the top bits of scales 4..7 in the file's packing).
#[inline(always)]
unsafe fn top_bits(v: __m256i) -> __m256i {
    _mm256_slli_epi32::<6>(_mm256_and_si256(
        _mm256_srli_epi32::<4>(v),
        _mm256_set1_epi8(3),
    ))
}

/// Q6_K's `qh` bytes `8q..8q + 8` of four rows from the top-bit parts `h[p]` of chunks `4n + p`:
/// bits `2q..2q + 2` of each byte of `h[p]` at bits `2p` (16-bit shifts: what crosses a byte is
/// masked off).
#[inline(always)]
unsafe fn top_pairs(h: &[__m256i; 4], q: usize) -> __m256i {
    let two = _mm256_set1_epi8(3);
    let mut v = _mm256_setzero_si256();
    for (p, h) in h.iter().enumerate() {
        let x = _mm256_and_si256(_mm256_srl_epi16(*h, _mm_cvtsi32_si128(2 * q as i32)), two);
        v = _mm256_or_si256(v, _mm256_sll_epi16(x, _mm_cvtsi32_si128(2 * p as i32)));
    }
    v
}

/// A type whose interleaved group super-blocks load as the file's transposed chunk.
trait GroupLoad {
    /// Bytes of a group super-block.
    const GROUP_BLOCK: usize;
    /// The group super-blocks at `a` (rows 0..3) and `b` (rows 4..7) into `tc`, as the file's
    /// super-blocks of those 8 rows, transposed.
    unsafe fn load(tc: &mut TChunk, a: *const u8, b: *const u8);
}

impl GroupLoad for Q4K {
    const GROUP_BLOCK: usize = Q4_K_GROUP_BLOCK;

    #[inline(always)]
    unsafe fn load(tc: &mut TChunk, a: *const u8, b: *const u8) {
        // Dword 0: `d | dmin << 16`.
        tc.d[0] = join(d_dmin(a), d_dmin(b));
        // Dwords 1..3: the 12 bytes `scale_min_k4` reads (see `crate::interleave`).
        let (sa, ma) = scales_mins(a);
        let (sb, mb) = scales_mins(b);
        let (sc_lo, sc_hi) = to_lanes(sa, sb);
        let (mn_lo, mn_hi) = to_lanes(ma, mb);
        tc.d[1] = _mm256_or_si256(sc_lo, top_bits(sc_hi));
        tc.d[2] = _mm256_or_si256(mn_lo, top_bits(mn_hi));
        let m = nibbles();
        tc.d[3] = _mm256_or_si256(
            _mm256_and_si256(sc_hi, m),
            _mm256_slli_epi32::<4>(_mm256_and_si256(mn_hi, m)),
        );
        // Dwords 4 + 8p + 4h..: sub-blocks 2p and 2p + 1, half h.
        for p in 0..4 {
            for h in 0..2 {
                let (o, o1) = (64 + 128 * p + 32 * h, 128 + 128 * p + 32 * h);
                let (la, ha) = pair_nibbles(load(a, o), load(a, o1));
                let (lb, hb) = pair_nibbles(load(b, o), load(b, o1));
                let k = 4 + 8 * p + 4 * h;
                (tc.d[k], tc.d[k + 1]) = to_lanes(la, lb);
                (tc.d[k + 2], tc.d[k + 3]) = to_lanes(ha, hb);
            }
        }
    }
}

impl GroupLoad for Q6K {
    const GROUP_BLOCK: usize = Q6_K_GROUP_BLOCK;

    #[inline(always)]
    unsafe fn load(tc: &mut TChunk, a: *const u8, b: *const u8) {
        // Part i of the 96 bytes of elements 32c..
        let part = |c: usize, i: usize| Q6_K_GROUP_QUANTS + 96 * c + 32 * i;
        for n in 0..2 {
            // `ql` dwords 16n + 8p + 4i..: elements (p, ·) in the low nibbles, (p + 2, ·) high.
            for p in 0..2 {
                for i in 0..2 {
                    let (o, o2) = (part(4 * n + p, i), part(4 * n + p + 2, i));
                    let (la, ha) = pair_nibbles(load(a, o), load(a, o2));
                    let (lb, hb) = pair_nibbles(load(b, o), load(b, o2));
                    let k = 16 * n + 8 * p + 4 * i;
                    (tc.d[k], tc.d[k + 1]) = to_lanes(la, lb);
                    (tc.d[k + 2], tc.d[k + 3]) = to_lanes(ha, hb);
                }
            }
            // `qh` dwords 32 + 8n + 2q..: byte l = 8q + k holds the top bits of (p, l) at bits 2p.
            let (mut ha, mut hb) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
            for p in 0..4 {
                (ha[p], hb[p]) = (load(a, part(4 * n + p, 2)), load(b, part(4 * n + p, 2)));
            }
            for q in 0..4 {
                let k = 32 + 8 * n + 2 * q;
                (tc.d[k], tc.d[k + 1]) = to_lanes(top_pairs(&ha, q), top_pairs(&hb, q));
            }
        }
        // Dwords 48..51: the scales, 4 per row; dword 52: `d`.
        for g in 0..4 {
            let at = 8 + 16 * g;
            tc.d[48 + g] = join(
                _mm_loadu_si128(a.add(at).cast()),
                _mm_loadu_si128(b.add(at).cast()),
            );
        }
        tc.d[52] = join(
            _mm_cvtepu16_epi32(_mm_loadl_epi64(a.cast())),
            _mm_cvtepu16_epi32(_mm_loadl_epi64(b.cast())),
        );
    }
}

/// Every row of `w` (interleaved groups of `W`) against the `acts` (2..=[`PASS`] tokens), as
/// `super::run` over the file's rows, 8 rows (two groups) at a time.
#[inline(always)]
unsafe fn run_grouped<W: KQuant + GroupLoad, D: Dp>(
    n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    type F<W> = K<W>;
    let nb = n / 256;
    let nt = acts.len();
    let a = act_ptrs(acts, nb * <F<W> as Fmt>::AB);
    const { assert!(MAX_DW >= 53) };
    // SAFETY: as in `super::run`: the thread's own scratch, used by nothing else while this call
    // runs.
    let s = &mut *super::SCRATCH.with(|s| s.get());
    let (p, tc, acc, accm) = regions::<<F<W> as Fmt>::P>(&mut s.regs);
    // K-quants prepare nothing per activation block (a zero-sized `Q`).
    let q = std::ptr::NonNull::<()>::dangling().as_ptr().cast_const();
    let gbytes = nb * W::GROUP_BLOCK;
    let groups = w.count / GROUP_ROWS;
    assert!(w.data.len() >= groups * gbytes);
    let wp = w.data.as_ptr();
    let mut pair = 0;
    while pair < groups.div_ceil(2) {
        if W::WIDE && !D::VNNI && 2 * pair + 4 <= groups {
            let dst = (&mut *out, tok_stride, row_stride);
            two_pairs::<W, D>(
                wp.add(2 * pair * gbytes),
                gbytes,
                nb,
                &a,
                nt,
                tc,
                p,
                pair,
                dst,
            );
            pair += 2;
            continue;
        }
        let ga = wp.add(2 * pair * gbytes);
        let second = 2 * pair + 1 < groups;
        let gb = if second { ga.add(gbytes) } else { ga };
        let mut idx = [usize::MAX; LANES];
        for (l, i) in idx.iter_mut().enumerate() {
            if l < GROUP_ROWS || second {
                *i = LANES * pair + l;
            }
        }
        for j in 0..nt {
            acc[j] = _mm256_setzero_ps();
            accm[j] = _mm256_setzero_ps();
        }
        // The pair after next, into L2, a share per super-block (as `super::run`).
        let next = ga.wrapping_add(4 * gbytes);
        for blk in 0..nb {
            prefetch_share(next, 2 * gbytes, blk, nb);
            W::load(
                tc,
                ga.add(blk * W::GROUP_BLOCK),
                gb.add(blk * W::GROUP_BLOCK),
            );
            <F<W> as Fmt>::pack::<D>(tc, 1, p);
            steps::<F<W>, D>(p, 1, blk, nb, &a, q, nt, acc, accm);
        }
        store::<F<W>>(acc, accm, nt, &idx, out, tok_stride, row_stride);
        pair += 1;
    }
}

/// Pairs `pair` and `pair + 1` of groups (16 rows: the four groups from `g`, `gbytes` apart)
/// against the `nt` tokens: each super-block of both pairs loaded and unpacked once (into `p` and
/// a second super-block), then met by the tokens four at a time through
/// [`KQuant::sums_wide`], each token's broadcast serving both pairs. The f32 chains are
/// [`K::chain`]'s, kept in memory between super-blocks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn two_pairs<W: KQuant + GroupLoad, D: Dp>(
    g: *const u8,
    gbytes: usize,
    nb: usize,
    a: &[*const u8; PASS],
    nt: usize,
    tc: &mut TChunk,
    p: &mut KP,
    pair: usize,
    (out, tok_stride, row_stride): (&mut [f32], usize, usize),
) {
    type F<W> = K<W>;
    // SAFETY: the thread's own scratch, used by nothing else while this call runs.
    let ch = wide_chains();
    for h in 0..2 {
        ch.acc[h][..nt].fill(_mm256_setzero_ps());
        ch.accm[h][..nt].fill(_mm256_setzero_ps());
    }
    let mut p1 = KP::zeroed();
    // The four groups after these, into L2, a share per super-block (as `run_grouped`).
    let next = g.wrapping_add(4 * gbytes);
    for blk in 0..nb {
        prefetch_share(next, 4 * gbytes, blk, nb);
        let at = |i: usize| g.add(i * gbytes + blk * W::GROUP_BLOCK);
        W::load(tc, at(0), at(1));
        <F<W> as Fmt>::pack::<D>(tc, 1, p);
        W::load(tc, at(2), at(3));
        <F<W> as Fmt>::pack::<D>(tc, 1, &mut p1);
        let mut j = 0;
        while j < nt {
            macro_rules! step {
                ($t:expr) => {{
                    let ab: [*const u8; $t] =
                        std::array::from_fn(|t| a[j + t].add(blk * <F<W> as Fmt>::AB));
                    let sums = W::sums_wide::<D, $t>([&*p, &p1], &ab);
                    for (h, ph) in [&*p, &p1].into_iter().enumerate() {
                        let mut ac = [_mm256_setzero_ps(); $t];
                        let mut am = [_mm256_setzero_ps(); $t];
                        ac.copy_from_slice(&ch.acc[h][j..j + $t]);
                        am.copy_from_slice(&ch.accm[h][j..j + $t]);
                        F::<W>::chain::<D, $t>(ph, sums[h], &ab, &mut ac, &mut am);
                        ch.acc[h][j..j + $t].copy_from_slice(&ac);
                        ch.accm[h][j..j + $t].copy_from_slice(&am);
                    }
                }};
            }
            match nt - j {
                1 => step!(1),
                2 => step!(2),
                3 => step!(3),
                _ => step!(4),
            }
            j += 4;
        }
    }
    for h in 0..2 {
        let idx: [usize; LANES] = std::array::from_fn(|l| LANES * (pair + h) + l);
        store::<F<W>>(
            &ch.acc[h],
            &ch.accm[h],
            nt,
            &idx,
            out,
            tok_stride,
            row_stride,
        );
    }
}

super::entries!(run_grouped, Q4K, q4_k_many, q4_k_many_vnni);
super::entries!(run_grouped, Q6K, q6_k_many, q6_k_many_vnni);
