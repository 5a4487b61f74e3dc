//! F32, F16 and BF16 rows (against activations of the same type), the same code at every SIMD
//! instruction set.
//!
//! The f32 chain per output element: eight partial sums, lane `l` taking elements `8s + l` in order
//! of `s` (`acc = fma(w, a, acc)`), reduced by [`hsum_ps`]'s fixed tree, then the `n % 8` tail
//! elements added one by one (`s = s + w * a`, unfused). Register blocking (8 rows for one token,
//! 2 rows x 4 tokens for several) only changes how many such chains run side by side.

use std::arch::x86_64::*;

use super::LANES;
use crate::simd::avx2::hsum_ps;
use crate::simd::Rows;

/// Blocks of [`LANES`] rows ahead whose lines a one-token call prefetches into L2 (see [`put`]).
/// A 0.6B dense Qwen3 in F16 (`hearth synth qwen3-dense-0.6b --quant f16`), `hearth bench -p 0 -n
/// 32`, 2 threads, the Intel Xeon, three alternating rounds, t/s: none 15.0 / 14.1 / 15.2; one
/// block on 17.2 / 17.3 / 17.4; two 17.5 / 17.2 / 16.7; three 16.9 / 17.5 / 17.2 (roofline ~23).
const FAR_BLOCKS: usize = 2;

/// How a float format loads 8 elements as f32 and reads one.
pub(crate) trait FloatRow {
    /// Bytes per element.
    const SIZE: usize;
    /// 8 elements from `p` (at least `8 * SIZE` readable bytes).
    unsafe fn load8(p: *const u8) -> __m256;
    /// The element at `p`.
    unsafe fn one(p: *const u8) -> f32;
}

pub(crate) struct F32Row;
pub(crate) struct F16Row;
pub(crate) struct Bf16Row;

impl FloatRow for F32Row {
    const SIZE: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p.cast())
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        p.cast::<f32>().read_unaligned()
    }
}

impl FloatRow for F16Row {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        crate::simd::avx2::f16c([*p, *p.add(1)])
    }
}

impl FloatRow for Bf16Row {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        crate::float::bf16_to_f32(p.cast::<u16>().read_unaligned())
    }
}

/// Rows `w` against tokens `a`, `n` elements each: `out[r][t]`. With `far` non-zero, each row's
/// line `far` bytes on is prefetched into L2 as the row's reads reach a new line.
#[inline(always)]
unsafe fn block<F: FloatRow, const R: usize, const T: usize>(
    n: usize,
    w: &[*const u8; R],
    a: &[*const u8; T],
    far: usize,
) -> [[f32; T]; R] {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for s in 0..n / 8 {
        let off = 8 * s * F::SIZE;
        if far != 0 && off % 64 == 0 {
            for p in w {
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off + far).cast());
            }
        }
        let mut y = [_mm256_setzero_ps(); T];
        for t in 0..T {
            y[t] = F::load8(a[t].add(off));
        }
        for r in 0..R {
            let x = F::load8(w[r].add(off));
            for t in 0..T {
                acc[r][t] = _mm256_fmadd_ps(x, y[t], acc[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            let mut s = hsum_ps(acc[r][t]);
            for e in n / 8 * 8..n {
                let o = e * F::SIZE;
                s += F::one(w[r].add(o)) * F::one(a[t].add(o));
            }
            out[r][t] = s;
        }
    }
    out
}

/// `R` rows from `i` against `T` tokens from `j`, written to `out`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn put<F: FloatRow, const R: usize, const T: usize>(
    n: usize,
    w: &Rows,
    i: usize,
    acts: &[&[u8]],
    j: usize,
    out: &mut [f32],
    ts: usize,
    rs: usize,
) {
    let mut wr = [std::ptr::null::<u8>(); R];
    for (r, p) in wr.iter_mut().enumerate() {
        *p = w.data.as_ptr().add((i + r) * w.stride);
    }
    let mut ar = [std::ptr::null::<u8>(); T];
    for (t, p) in ar.iter_mut().enumerate() {
        *p = acts[j + t].as_ptr();
    }
    // One token streams the weights from memory: the rows `FAR_BLOCKS` blocks on (which in a
    // matrix of contiguous rows follow in memory) are asked for into L2 as these are read.
    let far = if T == 1 && R == LANES {
        FAR_BLOCKS * LANES * w.stride
    } else {
        0
    };
    let o = block::<F, R, T>(n, &wr, &ar, far);
    for r in 0..R {
        for t in 0..T {
            out[(j + t) * ts + (i + r) * rs] = o[r][t];
        }
    }
}

/// Every row of `w` against `acts` (see `crate::traits::MatrixFn`).
#[inline(always)]
unsafe fn matrix<F: FloatRow>(
    n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    ts: usize,
    rs: usize,
) {
    debug_assert!(acts.iter().all(|a| a.len() == n * F::SIZE));
    if acts.len() == 1 {
        // One token: 8 rows side by side keep 8 independent FMA chains in flight.
        let mut i = 0;
        while i + LANES <= w.count {
            put::<F, LANES, 1>(n, w, i, acts, 0, out, ts, rs);
            i += LANES;
        }
        for i in i..w.count {
            put::<F, 1, 1>(n, w, i, acts, 0, out, ts, rs);
        }
        return;
    }
    let mut i = 0;
    while i < w.count {
        let two = i + 2 <= w.count;
        let mut j = 0;
        while j < acts.len() {
            match (two, acts.len() - j) {
                (true, 1) => put::<F, 2, 1>(n, w, i, acts, j, out, ts, rs),
                (true, 2) => put::<F, 2, 2>(n, w, i, acts, j, out, ts, rs),
                (true, 3) => put::<F, 2, 3>(n, w, i, acts, j, out, ts, rs),
                (true, _) => put::<F, 2, 4>(n, w, i, acts, j, out, ts, rs),
                (false, 1) => put::<F, 1, 1>(n, w, i, acts, j, out, ts, rs),
                (false, 2) => put::<F, 1, 2>(n, w, i, acts, j, out, ts, rs),
                (false, 3) => put::<F, 1, 3>(n, w, i, acts, j, out, ts, rs),
                (false, _) => put::<F, 1, 4>(n, w, i, acts, j, out, ts, rs),
            }
            j += 4;
        }
        i += if two { 2 } else { 1 };
    }
}

macro_rules! float_entry {
    ($name:ident, $F:ty) => {
        /// The kernel of one float type at every SIMD level (see `crate::traits::MatrixFn`).
        ///
        /// # Safety
        /// As `crate::traits::MatrixFn`, with AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name(
            n: usize,
            w: &Rows,
            acts: &[&[u8]],
            out: &mut [f32],
            ts: usize,
            rs: usize,
        ) {
            matrix::<$F>(n, w, acts, out, ts, rs)
        }
    };
}

float_entry!(f32s, F32Row);
float_entry!(f16s, F16Row);
float_entry!(bf16s, Bf16Row);
