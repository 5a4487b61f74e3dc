//! One token through Q4_K, Q5_K and Q6_K rows, a row at a time (decode), with AVX2.
//!
//! The 8-lane kernels keep each output's f32 chain per super-block, `acc = fma(d·dy, isum, acc)`
//! with `isum` the exact i32 sum of the super-block. This kernel computes the same integer in vector
//! lanes (reduced once per super-block) and runs the same chain in scalar f32, so its results equal
//! theirs bit for bit, while reading one row front to back without a transpose: the 32 quants of a
//! 32-element group come from one 32-byte load, and the two 16-element scales of the group go to
//! the two 128-bit halves of one register. For Q4_K / Q5_K the same holds for the second chain,
//! `accm = fma(dmin·dy, Σ m·bsum, accm)`, and the result `acc - accm`.

use std::arch::x86_64::*;
use std::mem::size_of;

use crate::block::cast_blocks;

use super::prefetch_ahead;
use crate::k_quants::{BlockQ6K, BlockQ8K};
use crate::simd::avx2::{f16c, k4_scales_mins64, K45};
use crate::simd::Rows;

/// Leaves the shuffle-control register `$v` as it is, but hidden from LLVM, which would otherwise
/// see its constant pattern and rewrite each `vpshufb` by it (1 µop) as a shift and a broadcast
/// (2): in the Q4_K loop 15 instructions per super-block instead of 8. Only in functions with AVX.
macro_rules! opaque {
    ($v:expr) => {
        // SAFETY: an empty instruction string; the register is read and written back unchanged.
        unsafe {
            std::arch::asm!("/* {0} */", inout(ymm_reg) $v, options(pure, nomem, nostack, preserves_flags))
        }
    };
}

/// Bytes ahead of the super-block being read that [`ahead`] prefetches. Zen 1's hardware
/// prefetchers alone kept one thread reading a Q4_K / Q6_K matrix from memory at 7.2 GB/s, below
/// the kernels' 8.9 / 9.2 GB/s from cache; 512 / 1024 / 2048 / 4096 bytes ahead gave Q4_K 7.5 /
/// 8.0 / 8.2 / 7.0 and Q6_K 7.9 / 8.4 / 8.4 / 8.6 GB/s (151936 × 2048, the 30B-A3B output), and
/// nothing changed from cache.
const AHEAD: usize = 2048;

/// Bytes ahead that [`ahead`] also prefetches into L2 (as `interleaved::AHEAD_L2`). The 12-layer
/// MoE's decode from the mapped file (whose rows these kernels read), the Intel Xeon, AVX2, three
/// alternating pairs: 22.1 / 21.8 / 21.7 -> 24.4 / 25.7 / 25.8 t/s.
const AHEAD_L2: usize = 8192;

/// Prefetches the lines `AHEAD` bytes past the super-block `xb` into L1 and those `AHEAD_L2`
/// bytes past it into L2: in a matrix of contiguous rows they hold the coming super-blocks of
/// this row or the next ones. One prefetch per 64 bytes of super-block: consecutive super-blocks'
/// ranges meet, so every line is asked for.
#[inline(always)]
pub(crate) unsafe fn ahead<T>(xb: &T) {
    prefetch_ahead((xb as *const T).cast(), size_of::<T>(), AHEAD, AHEAD_L2);
}

/// Horizontal sum of 8 i32 lanes (exact).
#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// Q6_K × Q8_K for one row: `Σ_b fma(d_b · dy_b, isum_b, acc)` in block order, `isum_b` the exact
/// `Σ (q - 32) · sc · y` of super-block `b` (the `- 32` through the activation's 16-element sums).
#[inline(always)]
unsafe fn q6_k_row(x: &[BlockQ6K], a: &[BlockQ8K], split: &__m256i, pick: &[__m256i; 8]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = 0f32;
    // The previous super-block's lanes and `d·dy`, reduced and chained after this one's products
    // are issued (as in `k45_each_row`; carrying the last one over into the next row, as that
    // does, made Q6_K slower: 8.35-8.81 -> 8.12-8.42 GB/s from memory at 768 columns).
    let mut pending = None;
    for (xb, y) in x.iter().zip(a) {
        ahead(xb);
        let sc = _mm_loadu_si128(xb.scales.as_ptr().cast());
        let corr = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(sc),
            _mm256_loadu_si256(y.bsums.as_ptr().cast()),
        );
        // The even scales as i16 in the low half, the odd ones in the high half (`x * 257 >> 8`
        // sign-extends byte pairs `[x, x]`); `pick[4n + g]` then spreads scale 8n + 2g over the
        // low half and 8n + 2g + 1 over the high half with one `vpshufb`.
        let eo = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(sc), *split);
        let eo = _mm256_srai_epi16(_mm256_unpacklo_epi8(eo, eo), 8);
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let ql = [
                _mm256_loadu_si256(xb.ql[64 * n..].as_ptr().cast()),
                _mm256_loadu_si256(xb.ql[64 * n + 32..].as_ptr().cast()),
            ];
            let qh = _mm256_loadu_si256(xb.qh[32 * n..].as_ptr().cast());
            for g in 0..4 {
                // Elements 128n + 32g.. : nibbles of ql half g % 2 (low for g < 2), bits 2g of qh.
                let l = ql[g % 2];
                let lo = if g < 2 {
                    _mm256_and_si256(l, m4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16(l, 4), m4)
                };
                // Bits 2g, 2g + 1 of each qh byte moved to bits 4, 5: what a 16-bit shift
                // carries over from the neighbouring byte lands outside them.
                let hb = match g {
                    0 => _mm256_slli_epi16(qh, 4),
                    1 => _mm256_slli_epi16(qh, 2),
                    2 => qh,
                    _ => _mm256_srli_epi16(qh, 2),
                };
                let q = _mm256_or_si256(lo, _mm256_and_si256(hb, m30));
                let yq = _mm256_loadu_si256(y.qs[128 * n + 32 * g..].as_ptr().cast());
                // Scales 8n + 2g (elements 0..16 of the group) and 8n + 2g + 1 (16..32).
                let s = _mm256_shuffle_epi8(eo, pick[4 * n + g]);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q, yq), s));
            }
        }
        let lanes = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        if let Some((lanes, d)) = pending {
            acc = f32::mul_add(d, hsum_epi32(lanes) as f32, acc);
        }
        pending = Some((lanes, f16c(xb.d) * y.d()));
    }
    if let Some((lanes, d)) = pending {
        acc = f32::mul_add(d, hsum_epi32(lanes) as f32, acc);
    }
    acc
}

/// The sums of one Q4_K / Q5_K super-block (with the fifth bits for Q5_K) in vector lanes: `Σ
/// sc·q·y` over 8 i32 lanes and `Σ m·bsum` over 4, exact ([`k45_reduce`] adds them up). Each
/// 32-byte load of `qs` holds sub-block `2c` in its low nibbles and `2c + 1` in its high ones,
/// which meet activation bytes `64c..64c + 32` and `64c + 32..64c + 64` as they lie; `pick[s]`
/// spreads scale `s` (an i16 in both halves of `sc`) over every lane.
#[inline(always)]
unsafe fn k45_lanes<W: K45>(
    xb: &W,
    y: &BlockQ8K,
    q8s: __m128i,
    pick: &[__m256i; 8],
) -> (__m256i, __m128i) {
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    let (qs, qh) = (xb.qs(), xb.qh());
    let (sc, mn) = k4_scales_mins64(xb.scales12());
    let sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
    let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
    let hbits = match qh {
        Some(h) => _mm256_loadu_si256(h.as_ptr().cast()),
        None => _mm256_setzero_si256(),
    };
    let mut sumi = _mm256_setzero_si256();
    for c in 0..4 {
        let w = _mm256_loadu_si256(qs[32 * c..].as_ptr().cast());
        let mut lo = _mm256_and_si256(w, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
        if qh.is_some() {
            let (s0, s1) = (
                _mm_cvtsi32_si128(2 * c as i32),
                _mm_cvtsi32_si128(2 * c as i32 + 1),
            );
            let hl = _mm256_and_si256(_mm256_srl_epi16(hbits, s0), one);
            let hh = _mm256_and_si256(_mm256_srl_epi16(hbits, s1), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(hl, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(hh, 4));
        }
        let ylo = _mm256_loadu_si256(y.qs[64 * c..].as_ptr().cast());
        let yhi = _mm256_loadu_si256(y.qs[64 * c + 32..].as_ptr().cast());
        let plo = _mm256_madd_epi16(
            _mm256_maddubs_epi16(lo, ylo),
            _mm256_shuffle_epi8(sc, pick[2 * c]),
        );
        let phi = _mm256_madd_epi16(
            _mm256_maddubs_epi16(hi, yhi),
            _mm256_shuffle_epi8(sc, pick[2 * c + 1]),
        );
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
    }
    (sumi, _mm_madd_epi16(mins, q8s))
}

/// The exact `(Σ sc·q·y, Σ m·bsum)` of a super-block from its [`k45_lanes`].
#[inline(always)]
unsafe fn k45_reduce((sumi, ms): (__m256i, __m128i)) -> (i32, i32) {
    let v4 = _mm_add_epi32(
        _mm256_castsi256_si128(sumi),
        _mm256_extracti128_si256::<1>(sumi),
    );
    let h = _mm_hadd_epi32(v4, ms);
    let h = _mm_hadd_epi32(h, h);
    (_mm_cvtsi128_si32(h), _mm_extract_epi32::<1>(h))
}

/// The shuffles that spread i16 word `s` of a 128-bit half over the half (the scale picks of
/// `k45_lanes` and `q6_k_row`).
#[inline(always)]
unsafe fn word_picks() -> [__m256i; 8] {
    let mut pick = [_mm256_setzero_si256(); 8];
    for (s, p) in pick.iter_mut().enumerate() {
        *p = _mm256_set1_epi16((2 * s as i16) | ((2 * s as i16 + 1) << 8));
    }
    pick
}

/// A super-block of [`k45_each_row`] waiting for its chain step: its lanes, `d·dy`, `dmin·dy`,
/// and its row if it is the row's last.
type K45Pending = ((__m256i, __m128i), f32, f32, Option<usize>);

/// The chain step of a [`K45Pending`] super-block on `acc` (`[acc, accm]`); if it ends its row,
/// the row's result goes to `out` and the chains restart from zero.
#[inline(always)]
unsafe fn k45_step(
    (lanes, d, dmin, ends): K45Pending,
    acc: &mut [f32; 2],
    out: &mut [f32],
    row_stride: usize,
) {
    let (si, mi) = k45_reduce(lanes);
    acc[0] = f32::mul_add(d, si as f32, acc[0]);
    acc[1] = f32::mul_add(dmin, mi as f32, acc[1]);
    if let Some(r) = ends {
        out[r * row_stride] = acc[0] - acc[1];
        *acc = [0.0; 2];
    }
}

/// Q4_K / Q5_K × Q8_K for the rows of `w` (`nb` super-blocks each; row `i`'s result to
/// `out[i * row_stride]`): per row, the integers and both f32 chains of the 8-lane kernel.
///
/// Each super-block's reduction and chain step come after the next super-block's products in
/// program order, the next row's first one after a row's last. The reduction is a chain of some
/// 30 cycles of latency behind the super-block's last `vpmaddwd`; right after it, the loop waited
/// on it (a Zen 1 profile put 29% of the loop's samples on the chain's FMA and the prefetches and
/// counter after it). One super-block later its inputs are ready. Each row's chain steps run in
/// the same order from zero, so the results are the same bits.
#[inline(always)]
unsafe fn k45_each_row<W: K45>(
    w: &Rows,
    nb: usize,
    a: &[BlockQ8K],
    q8s: &[__m128i],
    pick: &[__m256i; 8],
    out: &mut [f32],
    row_stride: usize,
) {
    // The super-blocks the zip below visits: each row's last of them ends its chain.
    let nb = nb.min(a.len()).min(q8s.len());
    let mut acc = [0f32; 2];
    let mut pending = None;
    for i in 0..w.count {
        if nb == 0 {
            out[i * row_stride] = 0.0;
            continue;
        }
        let x: &[W] = cast_blocks(w.row(i, nb * size_of::<W>())).expect("one weight row");
        for (j, ((xb, y), &q8s)) in x.iter().zip(a).zip(q8s).enumerate() {
            ahead(xb);
            let lanes = k45_lanes(xb, y, q8s, pick);
            if let Some(p) = pending {
                k45_step(p, &mut acc, out, row_stride);
            }
            let (dx, dminx) = xb.d_dmin();
            let dy = y.d();
            pending = Some((lanes, dx * dy, dminx * dy, (j + 1 == nb).then_some(i)));
        }
    }
    if let Some(p) = pending {
        k45_step(p, &mut acc, out, row_stride);
    }
}

/// Super-blocks per row whose activation sums [`k45_rows`] keeps on the stack (16384 columns).
const SUMS_MAX: usize = 64;

/// One token through Q4_K or Q5_K rows (see `crate::traits::MatrixFn`; `acts` holds one row).
///
/// # Safety
/// As `crate::traits::MatrixFn`, with AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn k45_rows<W: K45>(
    n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    _tok_stride: usize,
    row_stride: usize,
) {
    debug_assert_eq!(acts.len(), 1);
    let nb = n / 256;
    let a: &[BlockQ8K] = cast_blocks(acts[0]).expect("one activation row");
    let mut pick = word_picks();
    pick.iter_mut().for_each(|p| opaque!(*p));
    // The activation's sums of 32 quants, which meet the minimums: made once per call (a
    // `vphaddw` per row and super-block before).
    let mut sums = [_mm_setzero_si128(); SUMS_MAX];
    let mut heap = Vec::new();
    let q8s: &mut [__m128i] = if nb <= SUMS_MAX {
        &mut sums[..nb]
    } else {
        heap.resize(nb, _mm_setzero_si128());
        &mut heap
    };
    for (s, y) in q8s.iter_mut().zip(a) {
        let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        *s = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
    }
    k45_each_row::<W>(w, nb, a, q8s, &pick, out, row_stride);
}

/// One token through Q6_K rows (see `crate::traits::MatrixFn`; `acts` holds one row).
///
/// # Safety
/// As `crate::traits::MatrixFn`, with AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k_rows(
    n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    _tok_stride: usize,
    row_stride: usize,
) {
    debug_assert_eq!(acts.len(), 1);
    let nb = n / 256;
    let a: &[BlockQ8K] = cast_blocks(acts[0]).expect("one activation row");
    // Bytes 0, 2, .., 14 of the scales to the low half, 1, 3, .., 15 to the high half.
    let mut split = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1, //
        1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1,
    );
    // Word `k` of each half, in every word of the half.
    let mut pick = word_picks();
    opaque!(split);
    pick.iter_mut().for_each(|p| opaque!(*p));
    for i in 0..w.count {
        let x: &[BlockQ6K] = cast_blocks(w.row(i, nb * 210)).expect("one weight row");
        out[i * row_stride] = q6_k_row(x, a, &split, &pick);
    }
}
