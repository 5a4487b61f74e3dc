//! AVX2 + FMA + F16C kernels, after llama.cpp's `ggml-cpu/arch/x86/quants.c` (rewritten, not copied).
//!
//! Every kernel is a tile: one weight row (`x`, blocks) against `N` activation rows (`a`). A weight
//! block is unpacked once into registers and multiplied with block `i` of each activation row; every
//! activation row has its own accumulators, updated in the same order for any `N`, so the result of
//! row `j` does not depend on `N` (see the module docs of `simd`).
//!
//! The integer core is abstracted by [`Idot`] so that the AVX-512 level can reuse the legacy-format
//! kernels with VNNI's `vpdpbusd` instead of `vpmaddubsw` + `vpmaddwd`.

use std::arch::x86_64::*;

use super::Rows;
use crate::block::{cast_blocks, Block};
use crate::iq4::{BlockIQ4NL, BlockIQ4XS, KVALUES_IQ4NL};
use crate::k_quants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};

pub(super) fn blocks<B: Block>(src: &[u8]) -> &[B] {
    cast_blocks(src).expect("row lengths checked by the dispatcher")
}

/// The 8-bit integer dot core: 32 bytes times 32 bytes to 8 i32 lanes, lane `k` summing the
/// products of bytes `4k..4k + 4`.
pub(super) trait Idot {
    /// `x` unsigned (0..=255), `y` signed; the pair sums must fit i16 for the AVX2 form, which holds
    /// for every caller (at most 2 * 255 * 127 only arises when `x <= 128`).
    unsafe fn dot_u8(x: __m256i, y: __m256i) -> __m256i;

    /// `x` and `y` signed, `y` in -127..=127: the sign of `x` is moved onto `y`.
    #[inline(always)]
    unsafe fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
        Self::dot_u8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
    }
}

/// `vpmaddubsw` then `vpmaddwd` with ones (AVX2).
pub(super) struct Madd;

impl Idot for Madd {
    #[inline(always)]
    unsafe fn dot_u8(x: __m256i, y: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
    }
}

/// Horizontal sum of 8 f32 lanes in a fixed order.
#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Horizontal sum of 4 f32 lanes in a fixed order.
#[inline(always)]
pub(super) unsafe fn hsum_ps128(s: __m128) -> f32 {
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// A little-endian f16 to f32 with F16C (exact, as `block::f16_to_f32`, without `half`'s run-time
/// feature check on every call).
#[inline(always)]
pub(super) unsafe fn f16c(b: [u8; 2]) -> f32 {
    // Broadcast rather than `_mm_cvtsi32_si128`: LLVM lowers the latter to a `vpinsrw` into
    // whatever register is free, often an accumulator, which chains every block's conversion to
    // the previous block's FMA.
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(b))))
}

/// A little-endian f16 widened into all 8 lanes.
#[inline(always)]
unsafe fn f16x8(b: [u8; 2]) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(b)))
}

#[inline(always)]
unsafe fn load256(p: &[u8]) -> __m256i {
    debug_assert!(p.len() >= 32);
    _mm256_loadu_si256(p.as_ptr().cast())
}

#[inline(always)]
unsafe fn load256i(p: &[i8]) -> __m256i {
    debug_assert!(p.len() >= 32);
    _mm256_loadu_si256(p.as_ptr().cast())
}

/// 16 bytes of nibbles to 32 bytes: low nibbles (elements 0..16) then high nibbles (16..32).
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    let q = _mm_loadu_si128(qs.as_ptr().cast());
    let v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// Byte `k` is 0xFF where bit `k` of `qh` is set (`bytes_from_bits_32`).
#[inline(always)]
unsafe fn bytes_from_bits(qh: [u8; 4]) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let b = _mm256_shuffle_epi8(_mm256_set1_epi32(i32::from_le_bytes(qh)), shuf);
    let b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64));
    _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1))
}

/// The 16 i16 lanes `[sc[2p]; 8] ++ [sc[2p + 1]; 8]` from 16 signed bytes of scales.
#[inline(always)]
unsafe fn scale_pair(sc: __m128i, p: usize) -> __m256i {
    let lo = (2 * p) as i64 * 0x0101_0101_0101_0101;
    let hi = (2 * p + 1) as i64 * 0x0101_0101_0101_0101;
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, _mm_set_epi64x(hi, lo)))
}

// ---------------------------------------------------------------------------------------------
// Legacy 32-element formats.

/// A weight block paired with Q8_0 whose 32 values unpack to signed bytes.
pub(super) trait Type0: Block {
    /// The 32 quants as i8, in element order.
    unsafe fn unpack(&self) -> __m256i;
    /// The block scale's f16 bits.
    fn scale_bits(&self) -> [u8; 2];
}

impl Type0 for BlockQ4_0 {
    #[inline(always)]
    unsafe fn unpack(&self) -> __m256i {
        _mm256_sub_epi8(nibbles(&self.qs), _mm256_set1_epi8(8))
    }
    #[inline(always)]
    fn scale_bits(&self) -> [u8; 2] {
        self.d
    }
}

impl Type0 for BlockQ5_0 {
    #[inline(always)]
    unsafe fn unpack(&self) -> __m256i {
        // q - 16: where bit 4 is clear, `nibble | 0xF0` is `nibble - 16` as i8.
        let hi = _mm256_andnot_si256(bytes_from_bits(self.qh), _mm256_set1_epi8(0xf0u8 as i8));
        _mm256_or_si256(nibbles(&self.qs), hi)
    }
    #[inline(always)]
    fn scale_bits(&self) -> [u8; 2] {
        self.d
    }
}

impl Type0 for BlockQ8_0 {
    #[inline(always)]
    unsafe fn unpack(&self) -> __m256i {
        load256i(&self.qs)
    }
    #[inline(always)]
    fn scale_bits(&self) -> [u8; 2] {
        self.d
    }
}

impl Type0 for BlockIQ4NL {
    #[inline(always)]
    unsafe fn unpack(&self) -> __m256i {
        _mm256_shuffle_epi8(iq4_table(), nibbles(&self.qs))
    }
    #[inline(always)]
    fn scale_bits(&self) -> [u8; 2] {
        self.d
    }
}

#[inline(always)]
unsafe fn iq4_table() -> __m256i {
    let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
    _mm256_set_m128i(t, t)
}

/// Weight formats with a minimum, paired with Q8_1; values unpack to unsigned bytes.
pub(super) trait Type1: Block {
    /// The 32 quants as u8, in element order.
    unsafe fn unpack(&self) -> __m256i;
    /// Scale and minimum.
    unsafe fn dm(&self) -> (f32, f32);
}

impl Type1 for BlockQ4_1 {
    #[inline(always)]
    unsafe fn unpack(&self) -> __m256i {
        nibbles(&self.qs)
    }
    #[inline(always)]
    unsafe fn dm(&self) -> (f32, f32) {
        (f16c(self.d), f16c(self.m))
    }
}

impl Type1 for BlockQ5_1 {
    #[inline(always)]
    unsafe fn unpack(&self) -> __m256i {
        let hi = _mm256_and_si256(bytes_from_bits(self.qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles(&self.qs), hi)
    }
    #[inline(always)]
    unsafe fn dm(&self) -> (f32, f32) {
        (f16c(self.d), f16c(self.m))
    }
}

/// Type-0 formats × Q8_0: per block `acc += (dx * dy) * isum` in 8 lanes, even blocks into one
/// accumulator and odd blocks into another (two FMA chains), summed at the end.
#[inline(always)]
pub(super) unsafe fn type0_tile<D: Idot, W: Type0, const N: usize>(
    x: &[W],
    a: &[&[BlockQ8_0]; N],
    out: &mut [f32; N],
) {
    let nb = x.len();
    for r in a {
        assert_eq!(r.len(), nb);
    }
    #[inline(always)]
    unsafe fn step<D: Idot, W: Type0, const N: usize>(
        xb: &W,
        a: &[&[BlockQ8_0]; N],
        i: usize,
        acc: &mut [__m256; N],
    ) {
        let q = xb.unpack();
        let dx = f16x8(xb.scale_bits());
        for j in 0..N {
            let y = &a[j][i];
            let isum = D::dot_i8(q, load256i(&y.qs));
            let d = _mm256_mul_ps(dx, f16x8(y.d));
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[j]);
        }
    }
    let mut even = [_mm256_setzero_ps(); N];
    let mut odd = [_mm256_setzero_ps(); N];
    for p in 0..nb / 2 {
        step::<D, W, N>(&x[2 * p], a, 2 * p, &mut even);
        step::<D, W, N>(&x[2 * p + 1], a, 2 * p + 1, &mut odd);
    }
    if nb % 2 == 1 {
        step::<D, W, N>(&x[nb - 1], a, nb - 1, &mut even);
    }
    for j in 0..N {
        out[j] = hsum_ps(_mm256_add_ps(even[j], odd[j]));
    }
}

/// Type-1 formats × Q8_1: as type 0 plus `mx * sy` per block. The activation's `d` and `s` are
/// widened together (one `vcvtph2ps`) and multiplied by `[dx, mx]`; lane 1 of a 4-lane sum
/// collects the `mx * sy` terms. Even and odd blocks use separate accumulators.
#[inline(always)]
pub(super) unsafe fn type1_tile<D: Idot, W: Type1, const N: usize>(
    x: &[W],
    a: &[&[BlockQ8_1]; N],
    out: &mut [f32; N],
) {
    let nb = x.len();
    for r in a {
        assert_eq!(r.len(), nb);
    }
    #[inline(always)]
    unsafe fn step<D: Idot, W: Type1, const N: usize>(
        xb: &W,
        a: &[&[BlockQ8_1]; N],
        i: usize,
        acc: &mut [__m256; N],
        summs: &mut [__m128; N],
    ) {
        let q = xb.unpack();
        let (dx, mx) = xb.dm();
        let dm = _mm_setr_ps(dx, mx, 0.0, 0.0);
        for j in 0..N {
            let y = &a[j][i];
            let isum = D::dot_u8(q, load256i(&y.qs));
            let ds = i32::from_le_bytes([y.d[0], y.d[1], y.s[0], y.s[1]]);
            // [dx * dy, mx * sy, 0, 0]
            let p = _mm_mul_ps(dm, _mm_cvtph_ps(_mm_set1_epi32(ds)));
            acc[j] = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), _mm256_cvtepi32_ps(isum), acc[j]);
            summs[j] = _mm_add_ps(summs[j], p);
        }
    }
    let (mut even, mut odd) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
    let (mut ms_even, mut ms_odd) = ([_mm_setzero_ps(); N], [_mm_setzero_ps(); N]);
    for p in 0..nb / 2 {
        step::<D, W, N>(&x[2 * p], a, 2 * p, &mut even, &mut ms_even);
        step::<D, W, N>(&x[2 * p + 1], a, 2 * p + 1, &mut odd, &mut ms_odd);
    }
    if nb % 2 == 1 {
        step::<D, W, N>(&x[nb - 1], a, nb - 1, &mut even, &mut ms_even);
    }
    for j in 0..N {
        let ms = _mm_add_ps(ms_even[j], ms_odd[j]);
        let summs = _mm_cvtss_f32(_mm_movehdup_ps(ms));
        out[j] = hsum_ps(_mm256_add_ps(even[j], odd[j])) + summs;
    }
}

// ---------------------------------------------------------------------------------------------
// K-quants × Q8_K.

/// The eight 6-bit scales and mins of a Q4_K / Q5_K block (as `k_quants::scale_min_k4` for
/// j = 0..8), unpacked with 32-bit masks as ggml's `utmp` dance.
#[inline(always)]
pub(super) fn k4_scales_mins(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let (sc, mn) = k4_scales_mins64(q);
    (sc.to_le_bytes(), mn.to_le_bytes())
}

/// [`k4_scales_mins`] as two u64s of bytes (kernels move them into registers directly).
#[inline(always)]
pub(super) fn k4_scales_mins64(q: &[u8; 12]) -> (u64, u64) {
    let u0 = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
    let u1 = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
    let u2 = u32::from_le_bytes([q[8], q[9], q[10], q[11]]);
    let (m6, m4, m2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let sc_lo = u0 & m6;
    let sc_hi = (u2 & m4) | (((u0 >> 6) & m2) << 4);
    let mn_lo = u1 & m6;
    let mn_hi = ((u2 >> 4) & m4) | (((u1 >> 6) & m2) << 4);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        mn_lo as u64 | (mn_hi as u64) << 32,
    )
}

/// Q4_K: per 64 elements, low nibbles × scale 2j and high nibbles × scale 2j+1; mins through bsums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_t<const N: usize>(x: &[BlockQ4K], a: &[&[BlockQ8K]; N], out: &mut [f32; N]) {
    let nb = x.len();
    for r in a {
        assert_eq!(r.len(), nb);
    }
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_m = [_mm_setzero_ps(); N];
    for i in 0..nb {
        let xb = &x[i];
        let (sc, mn) = k4_scales_mins(&xb.scales);
        let dx = f16c(xb.d);
        let dminx = f16c(xb.dmin);
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr().cast()));
        let mut sumi = [_mm256_setzero_si256(); N];
        for j in 0..N {
            let y = &a[j][i];
            let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            let prod = _mm_madd_epi16(mins, q8s);
            let dmin = _mm_set1_ps(-(dminx * y.d()));
            acc_m[j] = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(prod), acc_m[j]);
        }
        for k in 0..4 {
            let bits = load256(&xb.qs[32 * k..]);
            let ql = _mm256_and_si256(bits, m4);
            let qh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            let sl = _mm256_set1_epi16(sc[2 * k] as i16);
            let sh = _mm256_set1_epi16(sc[2 * k + 1] as i16);
            for j in 0..N {
                let y = &a[j][i];
                let pl = _mm256_maddubs_epi16(ql, load256i(&y.qs[64 * k..]));
                let ph = _mm256_maddubs_epi16(qh, load256i(&y.qs[64 * k + 32..]));
                let p = _mm256_add_epi32(_mm256_madd_epi16(pl, sl), _mm256_madd_epi16(ph, sh));
                sumi[j] = _mm256_add_epi32(sumi[j], p);
            }
        }
        for j in 0..N {
            let d = _mm256_set1_ps(dx * a[j][i].d());
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[j]), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum_ps(acc[j]) + hsum_ps128(acc_m[j]);
    }
}

/// Q5_K: Q4_K with the fifth bit of sub-block s at bit s of `qh`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_t<const N: usize>(x: &[BlockQ5K], a: &[&[BlockQ8K]; N], out: &mut [f32; N]) {
    let nb = x.len();
    for r in a {
        assert_eq!(r.len(), nb);
    }
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_m = [_mm_setzero_ps(); N];
    for i in 0..nb {
        let xb = &x[i];
        let (sc, mn) = k4_scales_mins(&xb.scales);
        let dx = f16c(xb.d);
        let dminx = f16c(xb.dmin);
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr().cast()));
        let mut sumi = [_mm256_setzero_si256(); N];
        for j in 0..N {
            let y = &a[j][i];
            let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            let prod = _mm_madd_epi16(mins, q8s);
            let dmin = _mm_set1_ps(-(dminx * y.d()));
            acc_m[j] = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(prod), acc_m[j]);
        }
        let hbits = load256(&xb.qh);
        for k in 0..4 {
            let bits = load256(&xb.qs[32 * k..]);
            // Bit 2k (2k+1) of each qh byte, moved to bit 4: `srli_epi16` leaks bits across the
            // byte boundary only above bit 0, which the mask drops.
            let hl = _mm256_and_si256(
                _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * k as i32)),
                one,
            );
            let hh = _mm256_and_si256(
                _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * k as i32 + 1)),
                one,
            );
            let ql = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(hl, 4));
            let qh = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                _mm256_slli_epi16(hh, 4),
            );
            let sl = _mm256_set1_epi16(sc[2 * k] as i16);
            let sh = _mm256_set1_epi16(sc[2 * k + 1] as i16);
            for j in 0..N {
                let y = &a[j][i];
                let pl = _mm256_maddubs_epi16(ql, load256i(&y.qs[64 * k..]));
                let ph = _mm256_maddubs_epi16(qh, load256i(&y.qs[64 * k + 32..]));
                let p = _mm256_add_epi32(_mm256_madd_epi16(pl, sl), _mm256_madd_epi16(ph, sh));
                sumi[j] = _mm256_add_epi32(sumi[j], p);
            }
        }
        for j in 0..N {
            let d = _mm256_set1_ps(dx * a[j][i].d());
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[j]), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum_ps(acc[j]) + hsum_ps128(acc_m[j]);
    }
}

/// Q6_K: unsigned 6-bit quants times activations minus `32 * sum(activations)`, per 16 a scale.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_t<const N: usize>(x: &[BlockQ6K], a: &[&[BlockQ8K]; N], out: &mut [f32; N]) {
    let nb = x.len();
    for r in a {
        assert_eq!(r.len(), nb);
    }
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(3);
    let m32 = _mm256_set1_epi8(32);
    let mut acc = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        let xb = &x[i];
        let scales = _mm_loadu_si128(xb.scales.as_ptr().cast());
        let mut sumi = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            let b1 = load256(&xb.ql[64 * h..]);
            let b2 = load256(&xb.ql[64 * h + 32..]);
            let bh = load256(&xb.qh[32 * h..]);
            for k in 0..4 {
                let lo = match k {
                    0 => _mm256_and_si256(b1, m4),
                    1 => _mm256_and_si256(b2, m4),
                    2 => _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                    _ => _mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                };
                let hb =
                    _mm256_and_si256(_mm256_srl_epi16(bh, _mm_cvtsi32_si128(2 * k as i32)), m2);
                let q = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
                let s = scale_pair(scales, 4 * h + k);
                for j in 0..N {
                    let y = load256i(&a[j][i].qs[128 * h + 32 * k..]);
                    let p =
                        _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(m32, y));
                    sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(p, s));
                }
            }
        }
        let dx = f16c(xb.d);
        for j in 0..N {
            let d = _mm256_set1_ps(dx * a[j][i].d());
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[j]), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum_ps(acc[j]);
    }
}

/// Q2_K: 2-bit quants, 4-bit scales and mins per 16; mins through bsums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_t<const N: usize>(x: &[BlockQ2K], a: &[&[BlockQ8K]; N], out: &mut [f32; N]) {
    let nb = x.len();
    for r in a {
        assert_eq!(r.len(), nb);
    }
    let m4 = _mm_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        let xb = &x[i];
        let ms = _mm_loadu_si128(xb.scales.as_ptr().cast());
        let scales = _mm_and_si128(ms, m4);
        let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(ms, 4), m4));
        let dx = f16c(xb.d);
        let dminx = f16c(xb.dmin);
        let mut sumi = [_mm256_setzero_si256(); N];
        for j in 0..N {
            let y = &a[j][i];
            let prod = _mm256_madd_epi16(mins, _mm256_loadu_si256(y.bsums.as_ptr().cast()));
            let dmin = _mm256_set1_ps(-(dminx * y.d()));
            acc[j] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc[j]);
        }
        for h in 0..2 {
            let bits = load256(&xb.qs[32 * h..]);
            for k in 0..4 {
                let q =
                    _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k as i32)), m3);
                let s = scale_pair(scales, 4 * h + k);
                for j in 0..N {
                    let y = load256i(&a[j][i].qs[128 * h + 32 * k..]);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), s);
                    sumi[j] = _mm256_add_epi32(sumi[j], p);
                }
            }
        }
        for j in 0..N {
            let d = _mm256_set1_ps(dx * a[j][i].d());
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[j]), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum_ps(acc[j]);
    }
}

/// The sixteen Q3_K scales minus 32 as i8 (as `k_quants::q3k_scales`), unpacked with 32-bit masks
/// instead of a loop: word k holds scales 4k..4k+4 (low nibbles from bytes 0..8, two high bits
/// each from bytes 8..12).
#[inline(always)]
unsafe fn q3k_scales_simd(s: &[u8; 12]) -> __m128i {
    let a0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let a1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let t = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let (m2, m4) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let u0 = (a0 & m4) | ((t & m2) << 4);
    let u1 = (a1 & m4) | (((t >> 2) & m2) << 4);
    let u2 = ((a0 >> 4) & m4) | (((t >> 4) & m2) << 4);
    let u3 = ((a1 >> 4) & m4) | (((t >> 6) & m2) << 4);
    let v = _mm_set_epi32(u3 as i32, u2 as i32, u1 as i32, u0 as i32);
    _mm_sub_epi8(v, _mm_set1_epi8(32))
}

/// Q3_K: 3-bit quants as `(low2 | hbit << 2) - 4`, 6-bit signed scales per 16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_t<const N: usize>(x: &[BlockQ3K], a: &[&[BlockQ8K]; N], out: &mut [f32; N]) {
    let nb = x.len();
    for r in a {
        assert_eq!(r.len(), nb);
    }
    let m3 = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi8(1);
    let four = _mm256_set1_epi8(4);
    let mut acc = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        let xb = &x[i];
        let scales = q3k_scales_simd(&xb.scales);
        let hmask = load256(&xb.hmask);
        let mut sumi = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            let bits = load256(&xb.qs[32 * h..]);
            for k in 0..4 {
                let lo =
                    _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k as i32)), m3);
                let hb = _mm256_and_si256(
                    _mm256_srl_epi16(hmask, _mm_cvtsi32_si128((4 * h + k) as i32)),
                    one,
                );
                let q = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2));
                let s = scale_pair(scales, 4 * h + k);
                for j in 0..N {
                    let y = load256i(&a[j][i].qs[128 * h + 32 * k..]);
                    let p =
                        _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(four, y));
                    sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(p, s));
                }
            }
        }
        let dx = f16c(xb.d);
        for j in 0..N {
            let d = _mm256_set1_ps(dx * a[j][i].d());
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[j]), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum_ps(acc[j]);
    }
}

/// IQ4_XS: table lookup per nibble, 6-bit scales per 32 (biased by 32).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs_t<const N: usize>(x: &[BlockIQ4XS], a: &[&[BlockQ8K]; N], out: &mut [f32; N]) {
    let nb = x.len();
    for r in a {
        assert_eq!(r.len(), nb);
    }
    let table = iq4_table();
    let mut acc = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        let xb = &x[i];
        let mut sumi = [_mm256_setzero_si256(); N];
        for ib in 0..8 {
            let qs: &[u8; 16] = xb.qs[16 * ib..16 * ib + 16].try_into().expect("16 bytes");
            let q = _mm256_shuffle_epi8(table, nibbles(qs));
            let ls = _mm256_set1_epi16((xb.ls(ib) - 32) as i16);
            let qa = _mm256_sign_epi8(q, q);
            for j in 0..N {
                let y = load256i(&a[j][i].qs[32 * ib..]);
                let p = _mm256_maddubs_epi16(qa, _mm256_sign_epi8(y, q));
                sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(p, ls));
            }
        }
        let dx = f16c(xb.d);
        for j in 0..N {
            let d = _mm256_set1_ps(dx * a[j][i].d());
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[j]), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum_ps(acc[j]);
    }
}

// ---------------------------------------------------------------------------------------------
// Float rows: 32 elements per step in four 8-lane FMA chains, the tail in scalar f32.

/// How a float format loads 8 elements as f32 and reads one.
pub(super) trait FloatRow {
    /// Bytes per element.
    const SIZE: usize;
    /// 8 elements from `p` (at least `8 * SIZE` readable bytes).
    unsafe fn load8(p: *const u8) -> __m256;
    /// One element.
    fn one(b: &[u8]) -> f32;
}

pub(super) struct F32Row;
pub(super) struct F16Row;
pub(super) struct Bf16Row;

impl FloatRow for F32Row {
    const SIZE: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p.cast())
    }
    #[inline(always)]
    fn one(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl FloatRow for F16Row {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline(always)]
    fn one(b: &[u8]) -> f32 {
        crate::block::f16_to_f32([b[0], b[1]])
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
    fn one(b: &[u8]) -> f32 {
        crate::float::bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
    }
}

/// Float dot tile: `n` elements of format `R` in `w` and each of `a`.
#[inline(always)]
pub(super) unsafe fn float_tile<R: FloatRow, const N: usize>(
    n: usize,
    w: &[u8],
    a: &[&[u8]; N],
    out: &mut [f32; N],
) {
    assert_eq!(w.len(), n * R::SIZE);
    for r in a {
        assert_eq!(r.len(), n * R::SIZE);
    }
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    let steps = n / 32;
    for s in 0..steps {
        for c in 0..4 {
            let off = (32 * s + 8 * c) * R::SIZE;
            // SAFETY (reads): off + 8 * SIZE <= 32 * steps * SIZE <= w.len().
            let x = R::load8(w.as_ptr().add(off));
            for j in 0..N {
                let y = R::load8(a[j].as_ptr().add(off));
                acc[j][c] = _mm256_fmadd_ps(x, y, acc[j][c]);
            }
        }
    }
    for j in 0..N {
        let v = _mm256_add_ps(
            _mm256_add_ps(acc[j][0], acc[j][1]),
            _mm256_add_ps(acc[j][2], acc[j][3]),
        );
        let mut s = hsum_ps(v);
        for e in 32 * steps..n {
            let o = e * R::SIZE;
            s += R::one(&w[o..o + R::SIZE]) * R::one(&a[j][o..o + R::SIZE]);
        }
        out[j] = s;
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points with the features enabled, and the dispatcher.

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn type0<W: Type0, const N: usize>(x: &[W], a: &[&[BlockQ8_0]; N], out: &mut [f32; N]) {
    type0_tile::<Madd, W, N>(x, a, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn type1<W: Type1, const N: usize>(x: &[W], a: &[&[BlockQ8_1]; N], out: &mut [f32; N]) {
    type1_tile::<Madd, W, N>(x, a, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_t<const N: usize>(n: usize, w: &[u8], a: &[&[u8]; N], out: &mut [f32; N]) {
    float_tile::<F32Row, N>(n, w, a, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_t<const N: usize>(n: usize, w: &[u8], a: &[&[u8]; N], out: &mut [f32; N]) {
    float_tile::<F16Row, N>(n, w, a, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16_t<const N: usize>(n: usize, w: &[u8], a: &[&[u8]; N], out: &mut [f32; N]) {
    float_tile::<Bf16Row, N>(n, w, a, out)
}

/// A tile kernel of `N` activation rows.
type TileFn<W, A, const N: usize> = unsafe fn(&[W], &[&[A]; N], &mut [f32; N]);

/// The tile kernels of one type for 1..=4 activation rows.
type Tiles<W, A> = (
    TileFn<W, A, 1>,
    TileFn<W, A, 2>,
    TileFn<W, A, 3>,
    TileFn<W, A, 4>,
);

/// Tile kernels for 1..=4 activation rows as a matrix kernel: every weight row of `w`, the tokens
/// in tiles of at most 4; element (row `i`, token `j`) to `out[j * ts + i * rs]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tiles<W: Block, A: Block>(
    n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    ts: usize,
    rs: usize,
    k: Tiles<W, A>,
) {
    let wlen = n / W::BLOCK_SIZE * std::mem::size_of::<W>();
    for i in 0..w.count {
        let x: &[W] = blocks(w.row(i, wlen));
        for (c, a) in acts.chunks(4).enumerate() {
            let mut o = [0f32; 4];
            match a.len() {
                1 => (k.0)(x, &[blocks(a[0])], (&mut o[..1]).try_into().expect("1")),
                2 => (k.1)(
                    x,
                    &[blocks(a[0]), blocks(a[1])],
                    (&mut o[..2]).try_into().expect("2"),
                ),
                3 => (k.2)(
                    x,
                    &[blocks(a[0]), blocks(a[1]), blocks(a[2])],
                    (&mut o[..3]).try_into().expect("3"),
                ),
                _ => (k.3)(
                    x,
                    &[blocks(a[0]), blocks(a[1]), blocks(a[2]), blocks(a[3])],
                    (&mut o[..4]).try_into().expect("4"),
                ),
            }
            for (t, v) in o[..a.len()].iter().enumerate() {
                out[(4 * c + t) * ts + i * rs] = *v;
            }
        }
    }
}

/// A float tile kernel of `N` activation rows.
type FloatFn<const N: usize> = unsafe fn(usize, &[u8], &[&[u8]; N], &mut [f32; N]);

/// [`tiles`] for the float formats (`size` bytes per element).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn float_tiles(
    n: usize,
    size: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    ts: usize,
    rs: usize,
    k: (FloatFn<1>, FloatFn<2>, FloatFn<3>, FloatFn<4>),
) {
    for i in 0..w.count {
        let x = w.row(i, n * size);
        for (c, a) in acts.chunks(4).enumerate() {
            let mut o = [0f32; 4];
            match a.len() {
                1 => (k.0)(n, x, &[a[0]], (&mut o[..1]).try_into().expect("1")),
                2 => (k.1)(n, x, &[a[0], a[1]], (&mut o[..2]).try_into().expect("2")),
                3 => (k.2)(
                    n,
                    x,
                    &[a[0], a[1], a[2]],
                    (&mut o[..3]).try_into().expect("3"),
                ),
                _ => (k.3)(
                    n,
                    x,
                    &[a[0], a[1], a[2], a[3]],
                    (&mut o[..4]).try_into().expect("4"),
                ),
            }
            for (t, v) in o[..a.len()].iter().enumerate() {
                out[(4 * c + t) * ts + i * rs] = *v;
            }
        }
    }
}

/// Matrix kernels (see `crate::traits::MatrixFn`) from the tile kernels.
macro_rules! matrix_entry {
    ($name:ident, $W:ty, $A:ty, $k:ident) => {
        /// The AVX2 matrix kernel of one weight type (see `crate::traits::MatrixFn`).
        ///
        /// # Safety
        /// As `crate::traits::MatrixFn`, with AVX2, FMA and F16C.
        pub(crate) unsafe fn $name(
            n: usize,
            w: &Rows,
            acts: &[&[u8]],
            out: &mut [f32],
            ts: usize,
            rs: usize,
        ) {
            tiles::<$W, $A>(
                n,
                w,
                acts,
                out,
                ts,
                rs,
                ($k::<1>, $k::<2>, $k::<3>, $k::<4>),
            )
        }
    };
    ($name:ident, $W:ty, $A:ty, $k:ident, $gen:ty) => {
        /// The AVX2 matrix kernel of one weight type (see `crate::traits::MatrixFn`).
        ///
        /// # Safety
        /// As `crate::traits::MatrixFn`, with AVX2, FMA and F16C.
        pub(crate) unsafe fn $name(
            n: usize,
            w: &Rows,
            acts: &[&[u8]],
            out: &mut [f32],
            ts: usize,
            rs: usize,
        ) {
            tiles::<$W, $A>(
                n,
                w,
                acts,
                out,
                ts,
                rs,
                ($k::<$gen, 1>, $k::<$gen, 2>, $k::<$gen, 3>, $k::<$gen, 4>),
            )
        }
    };
}

matrix_entry!(q4_0, BlockQ4_0, BlockQ8_0, type0, BlockQ4_0);
matrix_entry!(q5_0, BlockQ5_0, BlockQ8_0, type0, BlockQ5_0);
matrix_entry!(q8_0, BlockQ8_0, BlockQ8_0, type0, BlockQ8_0);
matrix_entry!(iq4_nl, BlockIQ4NL, BlockQ8_0, type0, BlockIQ4NL);
matrix_entry!(q4_1, BlockQ4_1, BlockQ8_1, type1, BlockQ4_1);
matrix_entry!(q5_1, BlockQ5_1, BlockQ8_1, type1, BlockQ5_1);
matrix_entry!(q2_k, BlockQ2K, BlockQ8K, q2_k_t);
matrix_entry!(q3_k, BlockQ3K, BlockQ8K, q3_k_t);
matrix_entry!(q4_k, BlockQ4K, BlockQ8K, q4_k_t);
matrix_entry!(q5_k, BlockQ5K, BlockQ8K, q5_k_t);
matrix_entry!(q6_k, BlockQ6K, BlockQ8K, q6_k_t);
matrix_entry!(iq4_xs, BlockIQ4XS, BlockQ8K, iq4_xs_t);

macro_rules! float_entry {
    ($name:ident, $k:ident, $size:expr) => {
        /// The AVX2 matrix kernel of one float type (see `crate::traits::MatrixFn`).
        ///
        /// # Safety
        /// As `crate::traits::MatrixFn`, with AVX2, FMA and F16C.
        pub(crate) unsafe fn $name(
            n: usize,
            w: &Rows,
            acts: &[&[u8]],
            out: &mut [f32],
            ts: usize,
            rs: usize,
        ) {
            float_tiles(
                n,
                $size,
                w,
                acts,
                out,
                ts,
                rs,
                ($k::<1>, $k::<2>, $k::<3>, $k::<4>),
            )
        }
    };
}

float_entry!(f32s, f32_t, 4);
float_entry!(f16s, f16_t, 2);
float_entry!(bf16s, bf16_t, 2);
