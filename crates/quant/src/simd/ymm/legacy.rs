//! The 32-element formats on 8 lanes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL.
//!
//! Integer forms (exact in i32), per block and lane:
//! - Q4_1 / Q5_1 × Q8_1: unsigned quants × signed activations; `mx * sy` in its own chain;
//! - Q4_0 / Q5_0 × Q8_0: the unsigned quants `q` (the format stores `q - 8` / `q - 16`) times the
//!   activations, minus `8 * sum(y)` / `16 * sum(y)` (prepared once per call);
//! - Q8_0 / IQ4_NL × Q8_0: signed quants, through `|w| * sign(y, w)`.
//!
//! The f32 chain per output is that of `lanes.rs`: `acc = fma(dx * dy, isum, acc)` per block (type
//! 1 also `accm = fma(mx, sy, accm)`, output `acc + accm`).

use std::arch::x86_64::*;
use std::ptr::read_unaligned;

use super::{bcast, halves_f32, low_f32, nib_hi, nib_lo, Dp, Fmt, TChunk};
use crate::iq4::KVALUES_IQ4NL;
use crate::simd::avx2::f16c;

/// Blocks of a legacy format unpacked at a time.
const LCHUNK: usize = 16;

/// Legacy weights for 8 rows: 8 registers of quants per block, the scale and the minimum.
pub(crate) struct LegacyP {
    q: [[__m256i; 8]; LCHUNK],
    d: [__m256; LCHUNK],
    m: [__m256; LCHUNK],
}

/// How the quants of a format enter the integer sum.
#[derive(PartialEq, Eq)]
pub(crate) enum Kind {
    /// Unsigned quants with a minimum (Q8_1 activations).
    Type1,
    /// Unsigned quants stored with an offset (`OFFSET`) subtracted.
    Offset,
    /// Signed 8-bit quants.
    Signed,
}

/// How a legacy weight block unpacks from the transposed chunk at byte offset `o`: its 32 quants as
/// 8 dwords (element order `4k..4k + 4` for `k < 4`, `16 + 4(k - 4)..` after), its scale and
/// (type 1) minimum.
pub(crate) trait Legacy {
    const WB: usize;
    const KIND: Kind;
    /// The offset of [`Kind::Offset`] quants.
    const OFFSET: i32 = 0;
    /// How many products of two quants add up in i16 without overflow (`vpmaddubsw` pairs of
    /// 4-bit quants: 8, of 5-bit quants: 4).
    const G: usize = 1;
    unsafe fn unpack(src: &TChunk, o: usize, q: &mut [__m256i; 8]) -> (__m256, __m256);
}

pub(crate) struct Q4_0;
pub(crate) struct Q4_1;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q8_0;
pub(crate) struct Iq4Nl;

/// Bits `4k..4k + 4` of each lane of `qh` moved to bit 4 of bytes `0..4`.
#[inline(always)]
unsafe fn qh_bits(qh: __m256i, k: usize) -> __m256i {
    // Byte i of a lane takes byte (4k + i) / 8 = k / 2 of the lane's qh and tests bit (4k + i) % 8.
    let by = (k / 2) as i8;
    let sel = _mm256_setr_epi8(
        by,
        by,
        by,
        by,
        4 + by,
        4 + by,
        4 + by,
        4 + by,
        8 + by,
        8 + by,
        8 + by,
        8 + by,
        12 + by,
        12 + by,
        12 + by,
        12 + by,
        by,
        by,
        by,
        by,
        4 + by,
        4 + by,
        4 + by,
        4 + by,
        8 + by,
        8 + by,
        8 + by,
        8 + by,
        12 + by,
        12 + by,
        12 + by,
        12 + by,
    );
    let sh = 4 * (k % 2) as u32;
    let bit = _mm256_set1_epi32((0x0804_0201u32 << sh) as i32);
    let b = _mm256_and_si256(_mm256_shuffle_epi8(qh, sel), bit);
    _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10))
}

/// Q4_0 / IQ4_NL nibbles of the block at `o` (quants at `o + qs`).
#[inline(always)]
unsafe fn nibbles(src: &TChunk, o: usize, q: &mut [__m256i; 8]) {
    for k in 0..4 {
        let g = src.dw(o + 4 * k);
        q[k] = nib_lo(g);
        q[k + 4] = nib_hi(g);
    }
}

/// Q5_0 / Q5_1: nibbles at `o + 4` with the fifth bits of the `qh` dword at `o`.
#[inline(always)]
unsafe fn nibbles5(src: &TChunk, o: usize, q: &mut [__m256i; 8]) {
    let qh = src.dw(o);
    nibbles(src, o + 4, q);
    for k in 0..4 {
        q[k] = _mm256_or_si256(q[k], qh_bits(qh, k));
        q[k + 4] = _mm256_or_si256(q[k + 4], qh_bits(qh, k + 4));
    }
}

impl Legacy for Q4_0 {
    const WB: usize = 18;
    const KIND: Kind = Kind::Offset;
    const OFFSET: i32 = 8;
    const G: usize = 8;
    #[inline(always)]
    unsafe fn unpack(src: &TChunk, o: usize, q: &mut [__m256i; 8]) -> (__m256, __m256) {
        nibbles(src, o + 2, q);
        (low_f32(src.dw(o)), _mm256_setzero_ps())
    }
}

impl Legacy for Q4_1 {
    const WB: usize = 20;
    const KIND: Kind = Kind::Type1;
    const G: usize = 8;
    #[inline(always)]
    unsafe fn unpack(src: &TChunk, o: usize, q: &mut [__m256i; 8]) -> (__m256, __m256) {
        nibbles(src, o + 4, q);
        halves_f32(src.dw(o))
    }
}

impl Legacy for Q5_0 {
    const WB: usize = 22;
    const KIND: Kind = Kind::Offset;
    const OFFSET: i32 = 16;
    const G: usize = 4;
    #[inline(always)]
    unsafe fn unpack(src: &TChunk, o: usize, q: &mut [__m256i; 8]) -> (__m256, __m256) {
        nibbles5(src, o + 2, q);
        (low_f32(src.dw(o)), _mm256_setzero_ps())
    }
}

impl Legacy for Q5_1 {
    const WB: usize = 24;
    const KIND: Kind = Kind::Type1;
    const G: usize = 4;
    #[inline(always)]
    unsafe fn unpack(src: &TChunk, o: usize, q: &mut [__m256i; 8]) -> (__m256, __m256) {
        nibbles5(src, o + 4, q);
        halves_f32(src.dw(o))
    }
}

impl Legacy for Q8_0 {
    const WB: usize = 34;
    const KIND: Kind = Kind::Signed;
    #[inline(always)]
    unsafe fn unpack(src: &TChunk, o: usize, q: &mut [__m256i; 8]) -> (__m256, __m256) {
        for (k, qk) in q.iter_mut().enumerate() {
            *qk = src.dw(o + 2 + 4 * k);
        }
        (low_f32(src.dw(o)), _mm256_setzero_ps())
    }
}

impl Legacy for Iq4Nl {
    const WB: usize = 18;
    const KIND: Kind = Kind::Signed;
    #[inline(always)]
    unsafe fn unpack(src: &TChunk, o: usize, q: &mut [__m256i; 8]) -> (__m256, __m256) {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        nibbles(src, o + 2, q);
        for qk in q.iter_mut() {
            *qk = _mm256_shuffle_epi8(table, *qk);
        }
        (low_f32(src.dw(o)), _mm256_setzero_ps())
    }
}

/// A token's activation block, prepared: its scale as f32 and the type's second value (the
/// Q8_1 `s` as f32 bits, or `-OFFSET * sum(y)` for offset quants).
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct LegacyQ {
    d: f32,
    x: u32,
}

/// A legacy format on 8 lanes.
pub(crate) struct L<W>(std::marker::PhantomData<W>);

impl<W: Legacy> L<W> {
    /// Byte offset of the quants in an activation block.
    const QS: usize = if matches!(W::KIND, Kind::Type1) { 4 } else { 2 };

    /// One block (quants `w`, scale `dx`, minimum `mx` of 8 rows) against `T` tokens (`a[t]`,
    /// `q[t]`: the token's block).
    #[inline(always)]
    unsafe fn block<D: Dp, const T: usize>(
        w: &[__m256i; 8],
        dx: __m256,
        mx: __m256,
        a: &[*const u8; T],
        q: &[*const LegacyQ; T],
        acc: &mut [__m256; T],
        accm: &mut [__m256; T],
    ) {
        // Two accumulators per token keep enough independent products in flight for few tokens
        // (exact integers, any order).
        let mut is = [[_mm256_setzero_si256(); T]; 2];
        let qs = Self::QS;
        if W::KIND == Kind::Signed {
            for k in 0..8 {
                let aw = _mm256_sign_epi8(w[k], w[k]);
                for t in 0..T {
                    let y = bcast(a[t].add(qs + 4 * k));
                    is[k % 2][t] = D::dp(is[k % 2][t], aw, _mm256_sign_epi8(y, w[k]));
                }
            }
        } else if D::VNNI {
            for k in 0..8 {
                for t in 0..T {
                    is[k % 2][t] = D::dp(is[k % 2][t], w[k], bcast(a[t].add(qs + 4 * k)));
                }
            }
        } else {
            // Products of small quants add up in i16 (`G` of them), then one `vpmaddwd`.
            let ones = _mm256_set1_epi16(1);
            let mut x = [_mm256_setzero_si256(); T];
            for k in 0..8 {
                for t in 0..T {
                    let m = _mm256_maddubs_epi16(w[k], bcast(a[t].add(qs + 4 * k)));
                    x[t] = if k % W::G == 0 {
                        m
                    } else {
                        _mm256_add_epi16(x[t], m)
                    };
                }
                if k % W::G == W::G - 1 {
                    for t in 0..T {
                        is[0][t] = D::madd_acc(is[0][t], x[t], ones);
                    }
                }
            }
        }
        for t in 0..T {
            let qt = read_unaligned(q[t]);
            let mut s = _mm256_add_epi32(is[0][t], is[1][t]);
            if W::KIND == Kind::Offset {
                s = _mm256_add_epi32(s, _mm256_set1_epi32(qt.x as i32));
            }
            let d = _mm256_mul_ps(dx, _mm256_set1_ps(qt.d));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t]);
            if W::KIND == Kind::Type1 {
                accm[t] = _mm256_fmadd_ps(mx, _mm256_set1_ps(f32::from_bits(qt.x)), accm[t]);
            }
        }
    }
}

impl<W: Legacy> Fmt for L<W> {
    const BS: usize = 32;
    const WB: usize = W::WB;
    const AB: usize = if matches!(W::KIND, Kind::Type1) {
        36
    } else {
        34
    };
    const CHUNK: usize = LCHUNK;
    type P = LegacyP;
    type Q = LegacyQ;

    #[inline(always)]
    unsafe fn pack<D: Dp>(src: &TChunk, cn: usize, p: &mut LegacyP) {
        for b in 0..cn {
            let (d, m) = W::unpack(src, b * W::WB, &mut p.q[b]);
            p.d[b] = d;
            p.m[b] = m;
        }
    }

    #[inline(always)]
    unsafe fn prep(a: *const u8, q: &mut LegacyQ) {
        q.d = f16c([*a, *a.add(1)]);
        q.x = match W::KIND {
            Kind::Type1 => f16c([*a.add(2), *a.add(3)]).to_bits(),
            Kind::Offset => {
                // sum(y) from the sum of the biased bytes `y + 128`.
                let y = _mm256_loadu_si256(a.add(2).cast());
                let s = _mm256_sad_epu8(
                    _mm256_xor_si256(y, _mm256_set1_epi8(0x80u8 as i8)),
                    _mm256_setzero_si256(),
                );
                let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                let sum = _mm_cvtsi128_si64(_mm_add_epi64(s, _mm_unpackhi_epi64(s, s))) - 32 * 128;
                (-W::OFFSET * sum as i32) as u32
            }
            Kind::Signed => 0,
        };
    }

    #[inline(always)]
    unsafe fn step<D: Dp, const T: usize>(
        p: &LegacyP,
        b: usize,
        a: &[*const u8; T],
        q: &[*const LegacyQ; T],
        acc: &mut [__m256; T],
        accm: &mut [__m256; T],
    ) {
        Self::block::<D, T>(&p.q[b], p.d[b], p.m[b], a, q, acc, accm)
    }

    #[inline(always)]
    unsafe fn one_token<D: Dp>(
        src: &TChunk,
        cn: usize,
        _p: &mut LegacyP,
        a: *const u8,
        q: *const LegacyQ,
        acc: &mut __m256,
        accm: &mut __m256,
    ) {
        let (mut ac, mut am) = ([*acc], [*accm]);
        for b in 0..cn {
            let mut w = [_mm256_setzero_si256(); 8];
            let (d, m) = W::unpack(src, b * W::WB, &mut w);
            let ab = [a.add(b * Self::AB)];
            Self::block::<D, 1>(&w, d, m, &ab, &[q.add(b)], &mut ac, &mut am);
        }
        (*acc, *accm) = (ac[0], am[0]);
    }

    #[inline(always)]
    unsafe fn finish(acc: __m256, accm: __m256) -> __m256 {
        if W::KIND == Kind::Type1 {
            _mm256_add_ps(acc, accm)
        } else {
            acc
        }
    }
}

super::entries!(L<Q4_0>, q4_0, q4_0_vnni);
super::entries!(L<Q4_1>, q4_1, q4_1_vnni);
super::entries!(L<Q5_0>, q5_0, q5_0_vnni);
super::entries!(L<Q5_1>, q5_1, q5_1_vnni);
super::entries!(L<Q8_0>, q8_0, q8_0_vnni);
super::entries!(L<Iq4Nl>, iq4_nl, iq4_nl_vnni);
