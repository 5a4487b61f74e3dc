//! AVX2 activation quantizers (Q8_0, Q8_1, Q8_K) and f32 -> F16 conversion, bit-identical to the
//! reference quantizers for finite input.
//!
//! Blocks holding a NaN or an infinity go through the reference quantizer (vector min/max and
//! float-to-int conversion treat them differently from the scalar code), so the output is
//! bit-identical for every input.
//!
//! The one subtle step is rounding: Q8_0 / Q8_1 use C's `roundf` (half away from zero) while
//! `vroundps` only rounds half to even, so [`round_away_i32`] builds `roundf` from a biased
//! truncation. Q8_K rounds with ggml's `nearest_int` (the 1.5 * 2^23 trick), which is
//! round-half-to-even for the magnitudes involved: exactly `vroundps` to nearest.

use std::arch::x86_64::*;

use crate::block::{cast_blocks_mut, f32_to_f16, Block};
use crate::k_quants::{BlockQ8K, QK_K};
use crate::legacy::{BlockQ8_0, BlockQ8_1, QK};

fn blocks_mut<B: Block>(dst: &mut [u8]) -> &mut [B] {
    cast_blocks_mut(dst).expect("length checked by the caller")
}

/// Row entries for the type table: `src` quantized to Q8_0 / Q8_1 / Q8_K / F16 into `dst`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `dst` must be exactly the row's bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0_row(src: &[f32], dst: &mut [u8]) {
    q8_0(src, blocks_mut(dst))
}

/// See [`q8_0_row`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_1_row(src: &[f32], dst: &mut [u8]) {
    q8_1(src, blocks_mut(dst))
}

/// See [`q8_0_row`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_k_row(src: &[f32], dst: &mut [u8]) {
    q8_k(src, blocks_mut(dst))
}

/// See [`q8_0_row`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_row(src: &[f32], dst: &mut [u8]) {
    f16(src, dst)
}

/// `roundf` (round half away from zero) then the conversion to i32: `y + copysign(0.5⁻, y)`
/// truncated, where `0.5⁻` is the float just below one half. The sum rounds to nearest, which
/// lands at or past the next integer exactly when `|y|`'s fraction is at least one half (a
/// fraction just below one half, such as 0.49999997, stays below it, where adding 0.5 itself
/// would round up); integers and the magnitudes where every float is an integer are unchanged.
/// Three operations where truncating and comparing the exact fraction took eight.
#[inline(always)]
unsafe fn round_away_i32(y: __m256) -> __m256i {
    let sign = _mm256_and_ps(y, _mm256_set1_ps(-0.0));
    let half = _mm256_or_ps(sign, _mm256_set1_ps(f32::from_bits(0x3eff_ffff)));
    _mm256_cvttps_epi32(_mm256_add_ps(y, half))
}

/// `x` as the two little-endian bytes of an f16 (round to nearest even): what
/// [`crate::block::f32_to_f16`] gives, without its run-time feature check per call.
#[inline(always)]
unsafe fn f16_bytes(x: f32) -> [u8; 2] {
    let h = _mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm_set_ss(x));
    (_mm_extract_epi16::<0>(h) as u16).to_le_bytes()
}

#[inline(always)]
unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Max |x| over one 32-element block.
#[inline(always)]
unsafe fn absmax32(v: &[__m256; 4]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let a = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
    let b = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
    hmax(_mm256_max_ps(a, b))
}

/// Packs 32 i32 (four vectors, element order) to 32 saturated i8 in element order.
#[inline(always)]
unsafe fn pack32(q: [__m256i; 4]) -> __m256i {
    let a = _mm256_packs_epi32(q[0], q[1]);
    let b = _mm256_packs_epi32(q[2], q[3]);
    let p = _mm256_packs_epi16(a, b);
    // The in-lane packs leave 32-bit groups in the order 0 2 4 6 1 3 5 7.
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Quantizes one 32-block with `roundf(x * id)`; returns the packed quants and their sum.
#[inline(always)]
unsafe fn q8_block(v: &[__m256; 4], id: f32) -> (__m256i, i32) {
    let idv = _mm256_set1_ps(id);
    // Written out, not `array::from_fn`: a closure does not inherit the caller's target features,
    // so its intrinsics would become out-of-line calls.
    let q: [__m256i; 4] = [
        q8_lane(v[0], idv),
        q8_lane(v[1], idv),
        q8_lane(v[2], idv),
        q8_lane(v[3], idv),
    ];
    let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    (pack32(q), hsum_epi32(sum))
}

#[inline(always)]
unsafe fn q8_lane(v: __m256, idv: __m256) -> __m256i {
    round_away_i32(_mm256_mul_ps(v, idv))
}

#[inline(always)]
unsafe fn q8k_lane(v: __m256, is: __m256, cap: __m256i) -> __m256i {
    let r =
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(is, v));
    _mm256_min_epi32(_mm256_cvtps_epi32(r), cap)
}

/// Lanes where `|v| < inf` (false for NaN and infinities).
#[inline(always)]
unsafe fn finite_mask(v: __m256) -> __m256 {
    let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), v);
    _mm256_cmp_ps::<_CMP_LT_OQ>(abs, _mm256_set1_ps(f32::INFINITY))
}

#[inline(always)]
unsafe fn all_finite(v: &[__m256; 4]) -> bool {
    let m = _mm256_and_ps(
        _mm256_and_ps(finite_mask(v[0]), finite_mask(v[1])),
        _mm256_and_ps(finite_mask(v[2]), finite_mask(v[3])),
    );
    _mm256_movemask_ps(m) == 0xff
}

#[inline(always)]
unsafe fn load32(x: &[f32]) -> [__m256; 4] {
    assert!(x.len() >= 32);
    let p = x.as_ptr();
    [
        _mm256_loadu_ps(p),
        _mm256_loadu_ps(p.add(8)),
        _mm256_loadu_ps(p.add(16)),
        _mm256_loadu_ps(p.add(24)),
    ]
}

#[inline(always)]
unsafe fn q8_scale(v: &[__m256; 4]) -> (f32, f32) {
    let d = absmax32(v) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

#[inline(always)]
unsafe fn q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), out.len() * QK);
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let v = load32(xb);
        if !all_finite(&v) {
            crate::legacy::quantize_row_q8_0(xb, std::slice::from_mut(b));
            continue;
        }
        let (d, id) = q8_scale(&v);
        b.d = f16_bytes(d);
        let (q, _) = q8_block(&v, id);
        _mm256_storeu_si256(b.qs.as_mut_ptr().cast(), q);
    }
}

#[inline(always)]
unsafe fn q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), out.len() * QK);
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let v = load32(xb);
        if !all_finite(&v) {
            crate::legacy::quantize_row_q8_1(xb, std::slice::from_mut(b));
            continue;
        }
        let (d, id) = q8_scale(&v);
        b.d = f16_bytes(d);
        let (q, sum) = q8_block(&v, id);
        _mm256_storeu_si256(b.qs.as_mut_ptr().cast(), q);
        b.s = f16_bytes(sum as f32 * d);
    }
}

#[inline(always)]
unsafe fn q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * QK_K);
    let sign = _mm256_set1_ps(-0.0);
    for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut m = _mm256_setzero_ps();
        let mut finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        for c in 0..QK_K / 8 {
            let v = _mm256_loadu_ps(xb.as_ptr().add(8 * c));
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
            finite = _mm256_and_ps(finite, finite_mask(v));
        }
        if _mm256_movemask_ps(finite) != 0xff {
            crate::k_quantize::quantize_row_q8_k(xb, std::slice::from_mut(b));
            continue;
        }
        let amax = hmax(m);
        if amax == 0.0 {
            *b = BlockQ8K::zeroed();
            continue;
        }
        // The reference keeps the sign of the first element of largest magnitude.
        let max = *xb
            .iter()
            .find(|v| v.abs() == amax)
            .expect("amax is attained");
        let iscale = -127.0f32 / max;
        let is = _mm256_set1_ps(iscale);
        let cap = _mm256_set1_epi32(127);
        for c in 0..QK_K / 32 {
            let v = load32(&xb[32 * c..]);
            let q: [__m256i; 4] = [
                q8k_lane(v[0], is, cap),
                q8k_lane(v[1], is, cap),
                q8k_lane(v[2], is, cap),
                q8k_lane(v[3], is, cap),
            ];
            _mm256_storeu_si256(b.qs.as_mut_ptr().add(32 * c).cast(), pack32(q));
        }
        for j in 0..QK_K / 16 {
            let q = _mm_loadu_si128(b.qs.as_ptr().add(16 * j).cast());
            let s = _mm256_cvtepi8_epi32(q);
            let s2 = _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(q));
            let sum = hsum_epi32(_mm256_add_epi32(s, s2)) as i16;
            b.bsums[2 * j..2 * j + 2].copy_from_slice(&sum.to_le_bytes());
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

#[inline(always)]
unsafe fn f16(x: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), x.len() * 2);
    let steps = x.len() / 8;
    for s in 0..steps {
        let v = _mm256_loadu_ps(x.as_ptr().add(8 * s));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm_storeu_si128(dst.as_mut_ptr().add(16 * s).cast(), h);
    }
    for e in 8 * steps..x.len() {
        dst[2 * e..2 * e + 2].copy_from_slice(&f32_to_f16(x[e]));
    }
}
