//! One token through K-quant rows (Q4_K, Q5_K, Q6_K) with AVX2: decode, which streams each weight
//! row once, front to back, without the 8-lane kernels' transpose.
//!
//! The 8-lane kernels keep each output's f32 chain per super-block, `acc = fma(d·dy, isum, acc)`
//! (and, for the formats with minimums, `accm = fma(dmin·dy, ms, accm)`, output `acc - accm`),
//! with `isum` and `ms` exact i32 sums of the super-block. These kernels compute the same integers
//! in vector lanes and run the same chains, so their results equal those of every other kernel bit
//! for bit. Four rows go side by side: each activation load serves the four, and one transposing
//! reduction turns their four super-block sums into the four lanes of one register, where the f32
//! chains of the four rows run lane by lane (the same operations as one row's scalar chain).

use std::arch::x86_64::*;

use crate::block::{cast_blocks, Block};
use crate::k_quants::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::simd::avx2::{f16c, k4_scales_mins64};
use crate::simd::Rows;

/// Rows side by side.
const R: usize = 4;

/// A K-quant super-block as the row kernel reads it.
trait RowBlock: Block {
    /// The super-block's integer sums against `y`: the 8 lanes of the scaled quant products
    /// (summed, `isum`) and the 4 lanes of the minimum products (summed, `ms`; zero without
    /// minimums).
    unsafe fn sums(&self, y: &BlockQ8K) -> (__m256i, __m128i);
    /// `d` and `dmin` (0 without minimums).
    unsafe fn scales(&self) -> (f32, f32);
}

/// Q4_K / Q5_K: each 32-byte load of `qs` holds sub-block `2j` in its low nibbles and `2j + 1` in
/// its high ones; Q5_K's fifth bits are bits `2j`, `2j + 1` of each `qh` byte.
#[inline(always)]
unsafe fn k45_sums(
    scales: &[u8; 12],
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    y: &BlockQ8K,
) -> (__m256i, __m128i) {
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    let (sc, mn) = k4_scales_mins64(scales);
    let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
    let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
    // The 8 sums of 32 quants: pairs of the 16 sums of 16 (exact in i16: |sum| <= 4064).
    let q8s = _mm_hadd_epi16(
        _mm256_castsi256_si128(bs),
        _mm256_extracti128_si256::<1>(bs),
    );
    let ms = _mm_madd_epi16(mins, q8s);
    let hbits = qh.map(|h| _mm256_loadu_si256(h.as_ptr().cast()));
    let mut sumi = _mm256_setzero_si256();
    for j in 0..4 {
        let w = _mm256_loadu_si256(qs[32 * j..].as_ptr().cast());
        let mut lo = _mm256_and_si256(w, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
        if let Some(h) = hbits {
            let b0 = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j as i32)), one);
            let b1 = _mm256_and_si256(
                _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j as i32 + 1)),
                one,
            );
            lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(b0));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(b1));
        }
        let ylo = _mm256_loadu_si256(y.qs[64 * j..].as_ptr().cast());
        let yhi = _mm256_loadu_si256(y.qs[64 * j + 32..].as_ptr().cast());
        // Pair sums of at most 2 * 31 * 127 fit i16; the scale (< 64) then goes on in i32.
        let slo = _mm256_set1_epi16(((sc >> (16 * j)) & 0xff) as i16);
        let shi = _mm256_set1_epi16(((sc >> (16 * j + 8)) & 0xff) as i16);
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), slo));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), shi));
    }
    (sumi, ms)
}

impl RowBlock for BlockQ4K {
    #[inline(always)]
    unsafe fn sums(&self, y: &BlockQ8K) -> (__m256i, __m128i) {
        k45_sums(&self.scales, &self.qs, None, y)
    }
    #[inline(always)]
    unsafe fn scales(&self) -> (f32, f32) {
        (f16c(self.d), f16c(self.dmin))
    }
}

impl RowBlock for BlockQ5K {
    #[inline(always)]
    unsafe fn sums(&self, y: &BlockQ8K) -> (__m256i, __m128i) {
        k45_sums(&self.scales, &self.qs, Some(&self.qh), y)
    }
    #[inline(always)]
    unsafe fn scales(&self) -> (f32, f32) {
        (f16c(self.d), f16c(self.dmin))
    }
}

/// Q6_K: the 32 quants of a 32-element group from one 32-byte load, the group's two 16-element
/// scales in the two 128-bit halves of one register, and the `- 32` of the stored quants through
/// the activation's 16-element sums.
impl RowBlock for BlockQ6K {
    #[inline(always)]
    unsafe fn sums(&self, y: &BlockQ8K) -> (__m256i, __m128i) {
        let m4 = _mm256_set1_epi8(0x0f);
        let m2 = _mm256_set1_epi8(0x03);
        // Dword 2g of the pair register in the low half, 2g + 1 in the high half.
        let idx = [
            _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
            _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
            _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5),
            _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7),
        ];
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(self.scales.as_ptr().cast()));
        let corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256(y.bsums.as_ptr().cast()));
        // Scale `s` as the i16 pair `[s, s]`: scales 0..8 in `pairs[0]`, 8..16 in `pairs[1]`.
        let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(sc16);
        let pairs = [_mm256_unpacklo_epi16(p, p), _mm256_unpackhi_epi16(p, p)];
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let ql = [
                _mm256_loadu_si256(self.ql[64 * n..].as_ptr().cast()),
                _mm256_loadu_si256(self.ql[64 * n + 32..].as_ptr().cast()),
            ];
            let qh = _mm256_loadu_si256(self.qh[32 * n..].as_ptr().cast());
            for g in 0..4 {
                // Elements 128n + 32g.. : nibbles of ql half g % 2 (low for g < 2), bits 2g of qh.
                let l = ql[g % 2];
                let lo = if g < 2 {
                    _mm256_and_si256(l, m4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l), m4)
                };
                let hb =
                    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g as i32)), m2);
                let q = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hb));
                let yq = _mm256_loadu_si256(y.qs[128 * n + 32 * g..].as_ptr().cast());
                // Scales 8n + 2g (elements 0..16 of the group) and 8n + 2g + 1 (16..32).
                let s = _mm256_permutevar8x32_epi32(pairs[n], idx[g]);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q, yq), s));
            }
        }
        (
            _mm256_sub_epi32(sumi, _mm256_slli_epi32::<5>(corr)),
            _mm_setzero_si128(),
        )
    }
    #[inline(always)]
    unsafe fn scales(&self) -> (f32, f32) {
        (f16c(self.d), 0.0)
    }
}

/// `[Σ a, Σ b, Σ c, Σ d]` of four registers of 8 i32 lanes (exact).
#[inline(always)]
unsafe fn reduce4(v: [__m256i; R]) -> __m128i {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// `[Σ a, Σ b, Σ c, Σ d]` of four registers of 4 i32 lanes (exact).
#[inline(always)]
unsafe fn reduce4x4(v: [__m128i; R]) -> __m128i {
    _mm_hadd_epi32(_mm_hadd_epi32(v[0], v[1]), _mm_hadd_epi32(v[2], v[3]))
}

/// Rows `rows` (`R` of them, repeats allowed) × one token: lane `r` holds row `rows[r]`'s output,
/// each lane's chains those of one row (`acc = fma(d·dy, isum, acc)` over the super-blocks in
/// order, and `accm` likewise with `dmin` and `ms`; output `acc - accm`).
#[inline(always)]
unsafe fn rows4<B: RowBlock>(x: [&[B]; R], a: &[BlockQ8K]) -> __m128 {
    let (mut acc, mut accm) = (_mm_setzero_ps(), _mm_setzero_ps());
    for (b, y) in a.iter().enumerate() {
        let s: [(__m256i, __m128i); R] = std::array::from_fn(|r| x[r][b].sums(y));
        let ds: [(f32, f32); R] = std::array::from_fn(|r| x[r][b].scales());
        let isum = reduce4(std::array::from_fn(|r| s[r].0));
        let ms = reduce4x4(std::array::from_fn(|r| s[r].1));
        let dy = _mm_set1_ps(y.d());
        let d = _mm_setr_ps(ds[0].0, ds[1].0, ds[2].0, ds[3].0);
        let dmin = _mm_setr_ps(ds[0].1, ds[1].1, ds[2].1, ds[3].1);
        acc = _mm_fmadd_ps(_mm_mul_ps(d, dy), _mm_cvtepi32_ps(isum), acc);
        accm = _mm_fmadd_ps(_mm_mul_ps(dmin, dy), _mm_cvtepi32_ps(ms), accm);
    }
    _mm_sub_ps(acc, accm)
}

/// One token through the rows of `w`, `R` at a time (the last group repeats its last row).
#[inline(always)]
unsafe fn k_rows<B: RowBlock>(n: usize, w: &Rows, acts: &[&[u8]], out: &mut [f32], stride: usize) {
    debug_assert_eq!(acts.len(), 1);
    let nb = n / 256;
    let a: &[BlockQ8K] = cast_blocks(acts[0]).expect("one activation row");
    let row =
        |i: usize| -> &[B] { cast_blocks(w.row(i, nb * size_of::<B>())).expect("one weight row") };
    for i0 in (0..w.count).step_by(R) {
        let x: [&[B]; R] = std::array::from_fn(|r| row((i0 + r).min(w.count - 1)));
        let mut o = [0f32; R];
        _mm_storeu_ps(o.as_mut_ptr(), rows4(x, a));
        for (r, &v) in o.iter().enumerate().take(w.count - i0) {
            out[(i0 + r) * stride] = v;
        }
    }
}

macro_rules! k_rows_fn {
    ($name:ident, $B:ty) => {
        /// One token through rows of one K-quant (see `crate::traits::MatrixFn`; `acts` holds one
        /// row).
        ///
        /// # Safety
        /// As `crate::traits::MatrixFn`, with AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name(
            n: usize,
            w: &Rows,
            acts: &[&[u8]],
            out: &mut [f32],
            _tok_stride: usize,
            row_stride: usize,
        ) {
            k_rows::<$B>(n, w, acts, out, row_stride)
        }
    };
}

k_rows_fn!(q4_k_rows, BlockQ4K);
k_rows_fn!(q5_k_rows, BlockQ5K);
k_rows_fn!(q6_k_rows, BlockQ6K);
