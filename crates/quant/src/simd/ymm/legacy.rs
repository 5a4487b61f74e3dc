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
//!
//! One token (decode) through Q4_0, Q4_1, Q8_0 or IQ4_NL rows streams them ([`L::window`]): 16
//! bytes of each of the 8 rows at a time, transposed in registers, each 4-byte window multiplied
//! as it arrives by the activation quants laid out to meet it. Nothing is stored and reloaded, and
//! the blocks of 18 and 34 bytes that do not start on a dword need no realigning; the windows of a
//! block give its integer sum as the unpacked block does, so the results are the same bits.

use std::arch::x86_64::*;
use std::ptr::read_unaligned;

use super::{bcast, halves_f32, load_t4, low_f32, nib_hi, nib_lo, run, Dp, Fmt, TChunk, LANES};
use crate::iq4::KVALUES_IQ4NL;
use crate::simd::avx2::f16c;
use crate::simd::PASS;

/// Blocks of a legacy format unpacked at a time.
pub(super) const LCHUNK: usize = 16;

/// Legacy weights for 8 rows: 8 registers of quants per block, the scale and the minimum.
pub(crate) struct LegacyP {
    pub(super) q: [[__m256i; 8]; LCHUNK],
    pub(super) d: [__m256; LCHUNK],
    pub(super) m: [__m256; LCHUNK],
}

/// Where a block's quants are read, 4 bytes of each of 8 rows at a time: the transposed chunk, or
/// a group block of the interleaved layout (`crate::interleave`).
pub(crate) trait DwSrc {
    /// The 4 bytes at byte offset `off` (even) of every row.
    unsafe fn dw(&self, off: usize) -> __m256i;
}

impl DwSrc for TChunk {
    #[inline(always)]
    unsafe fn dw(&self, off: usize) -> __m256i {
        TChunk::dw(self, off)
    }
}

/// The dwords after the header of an interleaved group block: dword `k` of rows 0..7 at `32k`.
pub(crate) struct GroupDw(pub(super) *const u8);

impl DwSrc for GroupDw {
    #[inline(always)]
    unsafe fn dw(&self, off: usize) -> __m256i {
        debug_assert_eq!(off % 4, 0);
        _mm256_loadu_si256(self.0.add(8 * off).cast())
    }
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

/// How a legacy weight block unpacks, from the transposed chunk at byte offset `o` or from an
/// interleaved group block: its 32 quants as 8 dwords (element order `4k..4k + 4` for `k < 4`,
/// `16 + 4(k - 4)..` after), its scale and (type 1) minimum.
pub(crate) trait Legacy {
    const WB: usize;
    const KIND: Kind;
    /// Bytes of the block's header: `d` (2), and `m` for type 1 (4).
    const HB: usize = if matches!(Self::KIND, Kind::Type1) {
        4
    } else {
        2
    };
    /// The offset of [`Kind::Offset`] quants.
    const OFFSET: i32 = 0;
    /// How many products of two quants add up in i16 without overflow (`vpmaddubsw` pairs of
    /// 4-bit quants: 8, of 5-bit quants: 4).
    const G: usize = 1;
    /// Quants per byte in the one-token stream ([`L::period`]): 2 (nibbles) or 1 (bytes); 0 where
    /// the format has none (Q5_0 / Q5_1: their fifth bits lie apart from their nibbles).
    const STREAM_Q: usize = 0;
    /// The quants of the block whose bytes after the header start at `o` of `src`.
    unsafe fn quants<S: DwSrc>(src: &S, o: usize, q: &mut [__m256i; 8]);
    /// The block at `o` of the transposed chunk: quants, scale and (type 1) minimum.
    #[inline(always)]
    unsafe fn unpack(src: &TChunk, o: usize, q: &mut [__m256i; 8]) -> (__m256, __m256) {
        Self::quants(src, o + Self::HB, q);
        if Self::HB == 4 {
            halves_f32(src.dw(o))
        } else {
            (low_f32(src.dw(o)), _mm256_setzero_ps())
        }
    }
    /// The block of 8 rows at `g`, a group block of the interleaved layout (`crate::interleave`):
    /// the same registers as [`Legacy::unpack`] of the same rows' blocks in the file's layout.
    #[inline(always)]
    unsafe fn unpack_group(g: *const u8, q: &mut [__m256i; 8]) -> (__m256, __m256) {
        Self::quants(&GroupDw(g.add(8 * Self::HB)), 0, q);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(g.cast()));
        if Self::HB == 4 {
            (d, Self::group_mins(g))
        } else {
            (d, _mm256_setzero_ps())
        }
    }
    /// The minimums of a type-1 group block at `g` (after its 8 scales).
    #[inline(always)]
    unsafe fn group_mins(g: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(g.add(2 * LANES).cast()))
    }
    /// The one-token stream's quants of a window of 4 bytes per row: the low nibbles' values (or
    /// the bytes) and the high nibbles' values (unused for bytes).
    #[inline(always)]
    unsafe fn window_quants(w: __m256i) -> (__m256i, __m256i) {
        (nib_lo(w), nib_hi(w))
    }
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

/// Q4_0 / Q4_1 / IQ4_NL: the 32 nibbles in the 16 bytes at `o`.
#[inline(always)]
unsafe fn nibbles<S: DwSrc>(src: &S, o: usize, q: &mut [__m256i; 8]) {
    for k in 0..4 {
        let g = src.dw(o + 4 * k);
        q[k] = nib_lo(g);
        q[k + 4] = nib_hi(g);
    }
}

/// Q5_0 / Q5_1: nibbles at `o + 4` with the fifth bits of the `qh` dword at `o`.
#[inline(always)]
unsafe fn nibbles5<S: DwSrc>(src: &S, o: usize, q: &mut [__m256i; 8]) {
    let qh = src.dw(o);
    nibbles(src, o + 4, q);
    for k in 0..4 {
        q[k] = _mm256_or_si256(q[k], qh_bits(qh, k));
        q[k + 4] = _mm256_or_si256(q[k + 4], qh_bits(qh, k + 4));
    }
}

impl Legacy for Q4_0 {
    const STREAM_Q: usize = 2;
    const WB: usize = 18;
    const KIND: Kind = Kind::Offset;
    const OFFSET: i32 = 8;
    const G: usize = 8;
    #[inline(always)]
    unsafe fn quants<S: DwSrc>(src: &S, o: usize, q: &mut [__m256i; 8]) {
        nibbles(src, o, q);
    }
}

impl Legacy for Q4_1 {
    const STREAM_Q: usize = 2;
    const WB: usize = 20;
    const KIND: Kind = Kind::Type1;
    const G: usize = 8;
    #[inline(always)]
    unsafe fn quants<S: DwSrc>(src: &S, o: usize, q: &mut [__m256i; 8]) {
        nibbles(src, o, q);
    }
}

impl Legacy for Q5_0 {
    const WB: usize = 22;
    const KIND: Kind = Kind::Offset;
    const OFFSET: i32 = 16;
    const G: usize = 4;
    #[inline(always)]
    unsafe fn quants<S: DwSrc>(src: &S, o: usize, q: &mut [__m256i; 8]) {
        nibbles5(src, o, q);
    }
}

impl Legacy for Q5_1 {
    const WB: usize = 24;
    const KIND: Kind = Kind::Type1;
    const G: usize = 4;
    #[inline(always)]
    unsafe fn quants<S: DwSrc>(src: &S, o: usize, q: &mut [__m256i; 8]) {
        nibbles5(src, o, q);
    }
}

impl Legacy for Q8_0 {
    const STREAM_Q: usize = 1;
    #[inline(always)]
    unsafe fn window_quants(w: __m256i) -> (__m256i, __m256i) {
        (w, w)
    }
    const WB: usize = 34;
    const KIND: Kind = Kind::Signed;
    #[inline(always)]
    unsafe fn quants<S: DwSrc>(src: &S, o: usize, q: &mut [__m256i; 8]) {
        for (k, qk) in q.iter_mut().enumerate() {
            *qk = src.dw(o + 4 * k);
        }
    }
}

impl Legacy for Iq4Nl {
    const STREAM_Q: usize = 2;
    #[inline(always)]
    unsafe fn window_quants(w: __m256i) -> (__m256i, __m256i) {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        (
            _mm256_shuffle_epi8(table, nib_lo(w)),
            _mm256_shuffle_epi8(table, nib_hi(w)),
        )
    }
    const WB: usize = 18;
    const KIND: Kind = Kind::Signed;
    #[inline(always)]
    unsafe fn quants<S: DwSrc>(src: &S, o: usize, q: &mut [__m256i; 8]) {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        nibbles(src, o, q);
        for qk in q.iter_mut() {
            *qk = _mm256_shuffle_epi8(table, *qk);
        }
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
    pub(super) unsafe fn block<D: Dp, const T: usize>(
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

impl<W: Legacy> L<W> {
    /// Whether [`L::block_wide`] serves the format: unsigned quants whose eight products add up
    /// in an i16 lane (`G == 8`: Q4_0, Q4_1), or signed ones (Q8_0, IQ4_NL).
    pub(super) const WIDE: bool = W::G == 8 || matches!(W::KIND, Kind::Signed);

    /// One block of `GA` groups of 8 rows (quants `w[g]`, scales `dx[g]`) against `T` tokens
    /// (`a[t]`, `q[t]`: the token's block) at once: each activation broadcast meets the `GA`
    /// groups' quants and each quant register the `T` tokens, so that with 2 groups and 4 tokens
    /// a product costs 0.75 loads of a register, where [`L::block`] (one group, 4 tokens) costs
    /// 1.25. Zen 3 loads two 256-bit registers a cycle and runs two
    /// `vpmaddubsw`. Each (row, token) meets the integers and the f32 chain step of
    /// [`L::block`]: the same exact sums (i16 of eight products then one `vpmaddwd`, or i32), the
    /// same rounding, so the same bits. The chain of group `g` and token `t`: `acc` at
    /// `g * PASS + t`; type 1's minimums run in [`L::min_chains`]. Only for [`L::WIDE`] formats
    /// without VNNI.
    ///
    /// # Safety
    /// As [`L::block`]; `acc` holds `(GA - 1) * PASS + T` registers.
    #[inline(always)]
    pub(super) unsafe fn block_wide<D: Dp, const GA: usize, const T: usize>(
        w: &[[__m256i; 8]; GA],
        dx: &[__m256; GA],
        a: &[*const u8; T],
        q: &[*const LegacyQ; T],
        acc: *mut __m256,
    ) {
        debug_assert!(Self::WIDE && !D::VNNI);
        let qs = Self::QS;
        // Sums of (row group, token): i16 for unsigned quants (eight products per lane), i32
        // for signed ones (`|w| * sign(y, w)`, whose pairs of products fill an i16 lane).
        let mut x = [[_mm256_setzero_si256(); T]; GA];
        if W::KIND != Kind::Signed {
            for t in 0..T {
                let y = bcast(a[t].add(qs));
                for g in 0..GA {
                    x[g][t] = _mm256_maddubs_epi16(w[g][0], y);
                }
            }
        }
        // A loop LLVM does not unroll: unrolled, it computes the sums (row group, token) by
        // (row group, token), each with its own broadcasts and the quants reloaded, the loads
        // this order exists to save. Here the sums stay in registers from one `k` to the next.
        let kn = std::hint::black_box(8);
        let k0 = if W::KIND == Kind::Signed { 0 } else { 1 };
        for k in k0..kn {
            if W::KIND == Kind::Signed {
                // `from_fn`'s closure does not inherit the kernel's target features, so each sign
                // is a call; as a plain loop, inlined, the kernel was slower (Q8_0, 8 tokens,
                // 1536 × 2048, AVX2, one thread, an Intel Xeon: 57.0 / 57.1 against 51.2 / 53.2 G
                // multiply-adds/s): LLVM then schedules the steps' loads and products worse.
                let aw: [__m256i; GA] = std::array::from_fn(|g| _mm256_sign_epi8(w[g][k], w[g][k]));
                for t in 0..T {
                    let y = bcast(a[t].add(qs + 4 * k));
                    for g in 0..GA {
                        x[g][t] = D::dp(x[g][t], aw[g], _mm256_sign_epi8(y, w[g][k]));
                    }
                }
            } else {
                for t in 0..T {
                    let y = bcast(a[t].add(qs + 4 * k));
                    for g in 0..GA {
                        x[g][t] = _mm256_add_epi16(x[g][t], _mm256_maddubs_epi16(w[g][k], y));
                    }
                }
            }
        }
        let ones = _mm256_set1_epi16(1);
        for t in 0..T {
            let qt = read_unaligned(q[t]);
            for g in 0..GA {
                let mut s = if W::KIND == Kind::Signed {
                    x[g][t]
                } else {
                    D::madd_acc(_mm256_setzero_si256(), x[g][t], ones)
                };
                if W::KIND == Kind::Offset {
                    s = _mm256_add_epi32(s, _mm256_set1_epi32(qt.x as i32));
                }
                let d = _mm256_mul_ps(dx[g], _mm256_set1_ps(qt.d));
                let c = acc.add(g * PASS + t);
                *c = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *c);
            }
        }
    }

    /// The minimums' chain of a type-1 group of 8 rows against each of `nt` tokens: `accm[t]`
    /// from zero, `fma(mx, sy, accm[t])` block by block (the block headers `gb` bytes apart from
    /// `g`, `nb` of them; `q[t * nb + b]`: token `t`'s block `b`), the chain [`L::block`] runs
    /// beside its integer sums. [`L::block_wide`] leaves it to this pass of its own, where the
    /// chains of 8 tokens stay in registers: beside the sums they went through memory, a load
    /// and a store each per (group, token, block). `prefill_min` Q4_1 (1536 × 576, one thread,
    /// Zen 3), G multiply-adds/s at 8 / 64 tokens, 4 alternating runs: 80 / 91 with the chain
    /// in the kernel, 83 / 95.5 with it here (88.6 / 106 without it at all).
    #[inline(always)]
    pub(super) unsafe fn min_chains(
        g: *const u8,
        gb: usize,
        nb: usize,
        q: *const LegacyQ,
        nt: usize,
        accm: &mut [__m256],
    ) {
        debug_assert!(W::KIND == Kind::Type1 && accm.len() >= nt);
        #[inline(always)]
        unsafe fn tokens<W: Legacy, const T: usize>(
            g: *const u8,
            gb: usize,
            nb: usize,
            q: *const LegacyQ,
            accm: &mut [__m256],
        ) {
            let mut c = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                let mx = W::group_mins(g.add(b * gb));
                for (t, c) in c.iter_mut().enumerate() {
                    let sy = f32::from_bits(read_unaligned(q.add(t * nb + b)).x);
                    *c = _mm256_fmadd_ps(mx, _mm256_set1_ps(sy), *c);
                }
            }
            accm[..T].copy_from_slice(&c);
        }
        let mut j = 0;
        while j < nt {
            let (qj, cj) = (q.add(j * nb), &mut accm[j..]);
            let n = (nt - j).min(8);
            match n {
                1 => tokens::<W, 1>(g, gb, nb, qj, cj),
                2 => tokens::<W, 2>(g, gb, nb, qj, cj),
                3 => tokens::<W, 3>(g, gb, nb, qj, cj),
                4 => tokens::<W, 4>(g, gb, nb, qj, cj),
                5 => tokens::<W, 5>(g, gb, nb, qj, cj),
                6 => tokens::<W, 6>(g, gb, nb, qj, cj),
                7 => tokens::<W, 7>(g, gb, nb, qj, cj),
                _ => tokens::<W, 8>(g, gb, nb, qj, cj),
            }
            j += n;
        }
    }
}

/// What the one-token stream carries from one window to the next: the window group last loaded,
/// the headers of the blocks seen so far in the period, the integer sums of the open block and the
/// two f32 chains.
struct Stream {
    t: [__m256i; 4],
    d: [__m256; STREAM_MAX_PERIOD],
    m: [__m256; STREAM_MAX_PERIOD],
    is: __m256i,
    x: __m256i,
    acc: __m256,
    accm: __m256,
}

/// Most blocks in a stream period (formats of 18 and 34 bytes: 8 blocks make whole 16-byte loads).
const STREAM_MAX_PERIOD: usize = 8;

impl<W: Legacy> L<W> {
    /// Blocks per period of the one-token stream: the fewest whose bytes are whole 16-byte loads.
    const PERIOD: usize = {
        let (mut a, mut b) = (W::WB, 16);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        16 / a
    };
    /// Header bytes of a weight block (scale, and minimum for type 1) before its quants.
    const H: usize = W::WB
        - match W::STREAM_Q {
            2 => 16,
            1 => 32,
            _ => 0,
        };

    /// Window `J` (bytes `4J..4J + 4` of every row from the period's start) of the one-token
    /// stream. `m` holds the period's activation windows ([`L::mirror`]): for each weight window,
    /// the activation's quants that meet it (low nibbles, then high nibbles), broadcast, and zero
    /// over header bytes, so a window that holds header bytes adds nothing for them. Every
    /// constant below folds: `J` fixes which block owns the window (the one its first byte is in,
    /// which holds all its quants: a block's header is 2 or 4 bytes, so no window holds quants of
    /// two blocks), whether a block's header starts in it, and whether it is the block's last.
    #[inline(always)]
    unsafe fn window<D: Dp, const J: usize>(
        rows: &[*const u8; LANES],
        off: usize,
        m: *const __m256i,
        q: *const LegacyQ,
        st: &mut Stream,
    ) {
        let nw = Self::PERIOD * W::WB / 4;
        if J >= nw {
            return;
        }
        if J % 4 == 0 {
            st.t = load_t4(rows, off + 4 * J);
        }
        let w = st.t[J % 4];
        let p = 4 * J;
        let b = p / W::WB;
        // A block whose header starts in this window (at byte 0 or 2 of it).
        let hb = p.div_ceil(W::WB);
        if hb < Self::PERIOD && hb * W::WB < p + 4 {
            let (lo, hi) = halves_f32(w);
            if hb * W::WB == p {
                st.d[hb] = lo;
                st.m[hb] = hi;
            } else {
                st.d[hb] = hi;
            }
        }
        // Quants of block b in this window (all but a window of only a 4-byte header).
        if p + 4 > b * W::WB + Self::H {
            let (lo, hi) = W::window_quants(w);
            let yl = *m.add(W::STREAM_Q * J);
            if W::KIND == Kind::Signed {
                st.is = D::dp(st.is, _mm256_sign_epi8(lo, lo), _mm256_sign_epi8(yl, lo));
                if W::STREAM_Q == 2 {
                    let yh = *m.add(W::STREAM_Q * J + 1);
                    st.is = D::dp(st.is, _mm256_sign_epi8(hi, hi), _mm256_sign_epi8(yh, hi));
                }
            } else {
                let yh = *m.add(W::STREAM_Q * J + 1);
                if D::VNNI {
                    st.is = D::dp(st.is, lo, yl);
                    st.is = D::dp(st.is, hi, yh);
                } else {
                    // At most 16 products of small quants per i16 lane over a block, as in
                    // `block` (each quant byte falls in one window, 8 per byte pair of a lane).
                    let m = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, yl),
                        _mm256_maddubs_epi16(hi, yh),
                    );
                    st.x = _mm256_add_epi16(st.x, m);
                }
            }
        }
        // The block's last window: its chain step, as `block` with one token.
        if (p + 4) / W::WB > b || J == nw - 1 {
            if W::KIND != Kind::Signed && !D::VNNI {
                st.is = D::madd_acc(st.is, st.x, _mm256_set1_epi16(1));
                st.x = _mm256_setzero_si256();
            }
            let qt = read_unaligned(q.add(b));
            let mut s = st.is;
            if W::KIND == Kind::Offset {
                s = _mm256_add_epi32(s, _mm256_set1_epi32(qt.x as i32));
            }
            let d = _mm256_mul_ps(st.d[b], _mm256_set1_ps(qt.d));
            st.acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), st.acc);
            if W::KIND == Kind::Type1 {
                st.accm = _mm256_fmadd_ps(st.m[b], _mm256_set1_ps(f32::from_bits(qt.x)), st.accm);
            }
            st.is = _mm256_setzero_si256();
        }
    }

    /// One period of blocks from byte `off` of the 8 rows (`m`, `q`: the period's first activation
    /// window and prepared block).
    #[inline(always)]
    unsafe fn period<D: Dp>(
        rows: &[*const u8; LANES],
        off: usize,
        m: *const __m256i,
        q: *const LegacyQ,
        st: &mut Stream,
    ) {
        macro_rules! windows {
            ($($j:literal)*) => {
                $(Self::window::<D, $j>(rows, off, m, q, st);)*
            };
        }
        const { assert!(Self::PERIOD <= STREAM_MAX_PERIOD && Self::PERIOD * W::WB <= 4 * 68) };
        windows!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29
            30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57
            58 59 60 61 62 63 64 65 66 67);
    }

    /// The activation row as the one-token stream meets it: for each 4-byte window of a weight row,
    /// the 4 activation quants that its bytes (low nibbles, then high nibbles: `STREAM_Q` vectors
    /// per window) multiply, broadcast over a register; zero where the weight bytes are a header.
    /// Laid out first as bytes in `bytes` (the activation's quants moved to where the weight
    /// block's quants lie), then broadcast a window at a time. Inlined into the kernel, so that
    /// its broadcasts are AVX2 instructions rather than out-of-line calls of the intrinsic (1.7%
    /// of SmolLM2's decode on Zen 1 was this function and those calls).
    #[inline(always)]
    unsafe fn mirror(a: *const u8, nb: usize, buf: &mut Vec<__m256i>, bytes: &mut Vec<u8>) {
        let qb = W::WB - Self::H;
        let len = nb * W::WB;
        bytes.clear();
        bytes.resize(W::STREAM_Q * len, 0);
        for b in 0..nb {
            for half in 0..W::STREAM_Q {
                let src = a.add(b * Self::AB + Self::QS + half * qb);
                let dst = bytes.as_mut_ptr().add(half * len + b * W::WB + Self::H);
                std::ptr::copy_nonoverlapping(src, dst, qb);
            }
        }
        let nw = len / 4;
        // Each element written once, into the spare capacity: zero-filling the buffer first
        // (`resize`) was a `memset` of 3-6 KB per call (~0.3% of SmolLM2's decode on Zen 1).
        buf.clear();
        buf.reserve(W::STREAM_Q * nw);
        let spare = &mut buf.spare_capacity_mut()[..W::STREAM_Q * nw];
        for (w, win) in spare.chunks_exact_mut(W::STREAM_Q).enumerate() {
            for (half, v) in win.iter_mut().enumerate() {
                v.write(bcast(bytes.as_ptr().add(half * len + 4 * w)));
            }
        }
        // SAFETY: the first `STREAM_Q * nw` elements were written just above.
        buf.set_len(W::STREAM_Q * nw);
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

    const STREAM: usize = if W::STREAM_Q == 0 { 0 } else { Self::PERIOD };

    #[inline(always)]
    unsafe fn stream_acts(a: *const u8, nb: usize, buf: &mut Vec<__m256i>, bytes: &mut Vec<u8>) {
        Self::mirror(a, nb, buf, bytes)
    }

    #[inline(always)]
    unsafe fn one_token_stream<D: Dp>(
        rows: &[*const u8; LANES],
        b0: usize,
        n: usize,
        acts: &[__m256i],
        q: *const LegacyQ,
        acc: &mut __m256,
        accm: &mut __m256,
    ) {
        let mut st = Stream {
            t: [_mm256_setzero_si256(); 4],
            d: [_mm256_setzero_ps(); STREAM_MAX_PERIOD],
            m: [_mm256_setzero_ps(); STREAM_MAX_PERIOD],
            is: _mm256_setzero_si256(),
            x: _mm256_setzero_si256(),
            acc: *acc,
            accm: *accm,
        };
        let mut b = b0;
        while b < b0 + n {
            let o = b * W::WB;
            let m = acts.as_ptr().add(W::STREAM_Q * o / 4);
            Self::period::<D>(rows, o, m, q.add(b), &mut st);
            b += Self::PERIOD;
        }
        (*acc, *accm) = (st.acc, st.accm);
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

super::entries!(run, L<Q4_0>, q4_0, q4_0_vnni, q4_0_avx512);
super::entries!(run, L<Q4_1>, q4_1, q4_1_vnni, q4_1_avx512);
super::entries!(run, L<Q5_0>, q5_0, q5_0_vnni, q5_0_avx512);
super::entries!(run, L<Q5_1>, q5_1, q5_1_vnni, q5_1_avx512);
super::entries!(run, L<Q8_0>, q8_0, q8_0_vnni, q8_0_avx512);
super::entries!(run, L<Iq4Nl>, iq4_nl, iq4_nl_vnni, iq4_nl_avx512);
