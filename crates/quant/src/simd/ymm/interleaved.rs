//! Q4_K rows interleaved four at a time (`crate::interleave`) against Q8_K activations, with AVX2.
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
//! Several tokens (prefill, batched decode) are taken up to four at a time, each unpacked weight
//! register serving all of them.

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::block::cast_blocks;
use crate::interleave::{GROUP_ROWS, Q4_K_GROUP_BLOCK};
use crate::k_quants::BlockQ8K;
use crate::simd::Rows;

/// Bytes ahead of the group super-block being read that the kernel prefetches (into L1). Reading a
/// 32768 × 2048 matrix from memory on Zen 1, one thread: 1152 / 2048 / 4096 / 8192 bytes ahead gave
/// 9.5 / 9.4 / 9.7 / 9.5 GB/s.
const AHEAD: usize = 4096;

/// Tokens whose activations one pass over the weights serves. Each unpacked weight register then
/// serves four; 2 or 8 tokens were slower (prefill of 64 tokens, 768 × 2048, Zen 1: 20.8 / 23.1
/// G multiply-adds/s against 23.6).
const TOKENS: usize = 4;

/// The activation of one token as the kernel reads it: for each super-block, 32 registers (8 bytes
/// of quants four times over, bytes `8t..8t + 8` in register `t`), then the sums of 32 quants in
/// both halves of one register; and `d` per super-block.
struct Expanded {
    /// `[tokens][nb][33]`.
    regs: Vec<__m256i>,
    /// `[tokens][nb]`.
    d: Vec<f32>,
}

/// Registers per super-block in [`Expanded::regs`].
const REGS: usize = 33;

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
    // The 576 bytes ahead, one line per 64 bytes (9 lines over the 8 sub-blocks).
    let ahead = blk.wrapping_add(AHEAD + 64 * j);
    _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
    if j == 7 {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
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

/// `T` tokens through the groups of `w`: for each group and token the four rows' results.
///
/// # Safety
/// AVX2, FMA and F16C; `x` holds `T` tokens' expanded activations, `w` and `out` as [`q4_k`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pass<const T: usize>(
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
            let mut r = [0f32; GROUP_ROWS];
            _mm_storeu_ps(r.as_mut_ptr(), _mm_sub_ps(acc[t], accm[t]));
            for (i, v) in r.into_iter().enumerate() {
                out[t * tok_stride + (GROUP_ROWS * g + i) * row_stride] = v;
            }
        }
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
    let nb = n / 256;
    assert!(
        w.count % GROUP_ROWS == 0 && w.data.len() >= w.count * nb * 144,
        "interleaved Q4_K: {} rows",
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
    SCRATCH.with(|s| {
        let mut x = s.borrow_mut();
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
            match chunk.len() {
                1 => pass::<1>(nb, w, x, out, tok_stride, row_stride),
                2 => pass::<2>(nb, w, x, out, tok_stride, row_stride),
                3 => pass::<3>(nb, w, x, out, tok_stride, row_stride),
                _ => pass::<4>(nb, w, x, out, tok_stride, row_stride),
            }
        }
    });
}
