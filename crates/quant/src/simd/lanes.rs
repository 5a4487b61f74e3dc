//! AVX-512 register-blocked kernels: 16 weight rows in the 16 lanes of a 512-bit register.
//!
//! A block of 16 weight rows is unpacked once per chunk of K (loaded row by row and transposed in
//! registers, so row `r` sits in lane `r`) into 8-bit quants laid out dword by dword: register `k` holds quants `4k..4k + 4` of every row.
//! Each activation dword is then broadcast to all lanes and `vpdpbusd` adds the 16 rows' partial
//! sums at once; up to 8 tokens share every loaded weight register and every token shares the
//! unpacking. Per block the f32 work is one convert, one multiply and one FMA for 16 outputs, instead
//! of the same three per output in the one-row tiles (see `avx2.rs`).
//!
//! Batch invariance: an output element lives in one lane, and its value is the f32 chain
//! `acc = fma(dx * dy, isum_b, acc)` over blocks `b` in order (plus, for formats with a minimum, a
//! second chain added at the end), where `isum_b` is an exact integer. The same IEEE operations run
//! in every lane whatever the number of weight rows, the lane, the number of tokens or their
//! grouping, so a single dot (one row, one token) equals the element of any larger product bit for
//! bit. Rows past the end of a ragged block repeat the last row and are not stored.
//!
//! Integer forms (all exact in i32):
//! - Q4_1 / Q5_1 × Q8_1: unsigned quants × signed activations (`vpdpbusd`), `mx * sy` in its own chain;
//! - Q4_0 / Q5_0 / Q8_0 / IQ4_NL × Q8_0: signed quants; the activation is biased to `a + 128` (an
//!   unsigned byte) and `128 * sum(q)`, known when the weights are unpacked, is subtracted;
//! - Q4_K / Q5_K × Q8_K: per 32-element sub-block `vpdpbusd` then `vpmulld` by the 6-bit scale; the
//!   minimums through the activation's 16-element sums (`vpdpwssd`), in a second chain;
//! - Q6_K × Q8_K: 6-bit quants `q + 32` as unsigned bytes, per 16 elements times the signed scale,
//!   minus `32 * sum(scale * bsum)`.
//!
//! Rows interleaved in groups (`crate::interleave`: Q4_K four at a time, the legacy formats
//! eight) are loaded from their groups (`Fmt::load_groups`, `q4_k_grouped`, `q4_1_grouped` and
//! the like) into the same unpacked registers as the file's rows. A legacy group block already
//! holds each dword of its 8 rows side by side: two groups' 32-byte loads make a lane register,
//! with no transpose.
//!
//! One token (decode) through a legacy format skips the store of the unpacked chunk: each block is
//! unpacked and multiplied in registers, the signed formats with the weights biased to `q + 128`
//! against the signed activation and `-128 * sum(y)` (prepared once per call) as the correction.
//! The integers are the same, so are the results, bit for bit.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::mem::size_of;
use std::ptr::read_unaligned;

use super::Rows;
use crate::iq4::KVALUES_IQ4NL;

/// Weight rows per register (one per 32-bit lane).
pub(super) const LANES: usize = 16;

/// Most activation rows (tokens) one call of [`run`] takes; callers pass longer lists in parts.
pub(super) const PASS: usize = 64;

/// A weight format unpacked for lanes, paired with its activation format.
trait Fmt {
    /// Bytes of one weight block and of one activation block.
    const WB: usize;
    const AB: usize;
    /// Blocks unpacked at a time.
    const CHUNK: usize;
    /// `CHUNK` blocks of 16 rows, unpacked.
    type P;
    /// What a token needs per chunk besides its raw blocks (converted scales, biased quants).
    type Q;
    /// Unpacks `cn` blocks from the transposed chunk.
    unsafe fn pack(src: &TChunk, cn: usize, p: &mut Self::P);
    /// Prepares `cn` activation blocks starting at `a`.
    unsafe fn prep(a: *const u8, cn: usize, q: &mut Self::Q);
    /// Block `b` of the chunk against `T` tokens (`a[t]` points at the token's block `b`).
    unsafe fn step<const T: usize>(
        p: &Self::P,
        b: usize,
        a: &[*const u8; T],
        q: &[&Self::Q; T],
        acc: &mut [__m512; T],
        accm: &mut [__m512; T],
    );
    /// The output from the two chains.
    unsafe fn finish(acc: __m512, accm: __m512) -> __m512;
    /// Blocks `c0..c0 + cn` of the 16 `rows` (the weight buffer ends at `end`), loaded,
    /// transposed and unpacked into `p`: by default through the transposed chunk `tc`.
    #[inline(always)]
    unsafe fn load_pack(
        tc: &mut TChunk,
        rows: &[*const u8; LANES],
        end: *const u8,
        c0: usize,
        cn: usize,
        p: &mut Self::P,
    ) {
        tc.load(rows, end, c0 * Self::WB, cn * Self::WB);
        Self::pack(tc, cn, p);
    }
    /// Blocks `c0..c0 + cn` of the 16 rows of interleaved groups (`crate::interleave`; group
    /// `g` holds rows `GROUP_ROWS · g..GROUP_ROWS · (g + 1)` and starts at `groups[g]`) unpacked
    /// into `p`, the same registers as [`Fmt::load_pack`] makes of the same rows in the file's
    /// layout. Only formats with [`Fmt::GROUPED`].
    #[inline(always)]
    unsafe fn load_groups(_groups: &[*const u8; 4], _c0: usize, _cn: usize, _p: &mut Self::P) {
        unreachable!("a format without a grouped loader")
    }
    /// Whether [`Fmt::load_groups`] exists.
    const GROUPED: bool = false;
    /// Rows per interleaved group (`crate::interleave::group_rows`): 16 lanes are
    /// `16 / GROUP_ROWS` groups.
    const GROUP_ROWS: usize = crate::interleave::GROUP_ROWS;
    /// Whether the one-token path below exists: each block unpacked and used in registers, with
    /// no store of the unpacked chunk (decode reads every weight once, for one token).
    const ONE: bool = false;
    /// Prepares all `nb` blocks of one token's activation at `a` into `q` (at most
    /// [`ONE_MAX_BLOCKS`] blocks, 8 bytes each).
    unsafe fn prep_one(_a: *const u8, _nb: usize, _q: *mut u8) {}
    /// Blocks `c0..c0 + cn` of the transposed chunk against one token (`a`, `q` as for
    /// `prep_one`), the same operations per output as `pack` then `step`.
    unsafe fn one_token(
        _src: &TChunk,
        _cn: usize,
        _c0: usize,
        _a: *const u8,
        _q: *const u8,
        _acc: &mut __m512,
        _accm: &mut __m512,
    ) {
    }
}

/// Most blocks of one activation row the one-token path prepares (the scratch it has).
const ONE_MAX_BLOCKS: usize = Q_ZMM * 64 / 8;

/// Most dwords of one chunk of one row (Q8_0: 8 blocks of 34 bytes).
const MAX_DW: usize = 80;

/// A chunk of 16 rows, transposed: `d[k]` lane `r` is dword `k` (bytes `4k..4k + 4`) of row `r`.
/// Loading the rows and transposing them in registers is several times faster than `vpgatherdd`
/// (measured: gathers held decode to ~3 GB/s).
struct TChunk {
    d: [__m512i; MAX_DW],
}

impl TChunk {
    /// The 4 bytes at `off` (even) of every row.
    #[inline(always)]
    unsafe fn dw(&self, off: usize) -> __m512i {
        let i = off / 4;
        if off % 4 == 0 {
            self.d[i]
        } else {
            // Upper half of dword i and lower half of dword i + 1, word by word.
            let sel = _mm512_set_epi16(
                62, 31, 60, 29, 58, 27, 56, 25, 54, 23, 52, 21, 50, 19, 48, 17, 46, 15, 44, 13, 42,
                11, 40, 9, 38, 7, 36, 5, 34, 3, 32, 1,
            );
            _mm512_permutex2var_epi16(self.d[i], sel, self.d[i + 1])
        }
    }

    /// Loads `len` bytes at `off` of each row `rows[l]` and transposes them.
    #[inline(always)]
    unsafe fn load(&mut self, rows: &[*const u8; LANES], end: *const u8, off: usize, len: usize) {
        debug_assert!(len <= 4 * MAX_DW);
        let mut done = 0;
        while done < len {
            let left = len - done;
            let i = done / 4;
            if left <= 16 {
                self.d[i..i + 4].copy_from_slice(&load_t4(rows, end, off + done, left));
                break;
            }
            self.d[i..i + 16].copy_from_slice(&load_t16(rows, end, off + done, left));
            done += 64;
        }
    }
}

/// Dwords `0..16` of the 64 bytes at `at` of each row, transposed (`r[k]` lane `l` is dword `k` of
/// row `l`). Whole 64-byte loads where they stay below `end` (the end of the weight buffer; rows
/// are usually back to back); masked loads, several times slower on some CPUs, only at the very
/// end, where just `left` bytes are read.
#[inline(always)]
unsafe fn load_t16(
    rows: &[*const u8; LANES],
    end: *const u8,
    at: usize,
    left: usize,
) -> [__m512i; 16] {
    let mask: u64 = if left >= 64 { !0 } else { (1u64 << left) - 1 };
    let mut r = [_mm512_setzero_si512(); 16];
    for (l, v) in r.iter_mut().enumerate() {
        let p = rows[l].add(at);
        *v = if left >= 64 || (end as usize).saturating_sub(p as usize) >= 64 {
            _mm512_loadu_si512(p.cast())
        } else {
            _mm512_maskz_loadu_epi8(mask, p.cast())
        };
    }
    transpose16(&mut r);
    r
}

/// Dwords `0..4` of the `left <= 16` bytes at `at` of each row, transposed: 16-byte loads, four
/// rows to a register, and a 4 x 4 transpose inside each 128-bit lane, a quarter of the shuffles
/// of [`load_t16`] (Q4_K's last 16 bytes). No closures here: they would not inherit the target
/// features, and every intrinsic in them would become a call.
#[inline(always)]
unsafe fn load_t4(
    rows: &[*const u8; LANES],
    end: *const u8,
    at: usize,
    left: usize,
) -> [__m512i; 4] {
    debug_assert!(left <= 16);
    let mut part = [_mm_setzero_si128(); LANES];
    for (l, v) in part.iter_mut().enumerate() {
        let p = rows[l].add(at);
        *v = if (end as usize).saturating_sub(p as usize) >= 16 {
            _mm_loadu_si128(p.cast())
        } else {
            _mm_maskz_loadu_epi8((1u16 << left) - 1, p.cast())
        };
    }
    // z[i], 128-bit lane c: row i + 4c.
    let mut z = [_mm512_setzero_si512(); 4];
    for (i, v) in z.iter_mut().enumerate() {
        let x = _mm512_castsi128_si512(part[i]);
        let x = _mm512_inserti32x4::<1>(x, part[i + 4]);
        let x = _mm512_inserti32x4::<2>(x, part[i + 8]);
        *v = _mm512_inserti32x4::<3>(x, part[i + 12]);
    }
    let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// In-register transpose of 16 × 16 dwords: afterwards `r[k]` lane `l` is dword `k` of input `l`.
#[inline(always)]
pub(super) unsafe fn transpose16(r: &mut [__m512i; 16]) {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c], 128-bit lane L: rows 4g..4g + 4 of dword 4L + c.
    let mut u = [_mm512_setzero_si512(); 16];
    for g in 0..4 {
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for c in 0..4 {
        let x0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u[c], u[4 + c]);
        let x1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u[c], u[4 + c]);
        let y0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u[8 + c], u[12 + c]);
        let y1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u[8 + c], u[12 + c]);
        r[c] = _mm512_shuffle_i32x4::<0b10_00_10_00>(x0, y0);
        r[4 + c] = _mm512_shuffle_i32x4::<0b11_01_11_01>(x0, y0);
        r[8 + c] = _mm512_shuffle_i32x4::<0b10_00_10_00>(x1, y1);
        r[12 + c] = _mm512_shuffle_i32x4::<0b11_01_11_01>(x1, y1);
    }
}

#[inline(always)]
unsafe fn bcast(p: *const u8) -> __m512i {
    _mm512_set1_epi32(read_unaligned(p.cast::<i32>()))
}

#[inline(always)]
unsafe fn bcast_f(p: *const f32) -> __m512 {
    _mm512_set1_ps(read_unaligned(p))
}

/// The f16 in the low (`HI = false`) or high half of each lane, as f32.
#[inline(always)]
unsafe fn half_f32<const HI: bool>(v: __m512i) -> __m512 {
    let v = if HI { _mm512_srli_epi32(v, 16) } else { v };
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

#[inline(always)]
unsafe fn nib_lo(v: __m512i) -> __m512i {
    _mm512_and_si512(v, _mm512_set1_epi8(0x0f))
}

#[inline(always)]
unsafe fn nib_hi(v: __m512i) -> __m512i {
    _mm512_and_si512(_mm512_srli_epi32(v, 4), _mm512_set1_epi8(0x0f))
}

/// Bits `4k..4k + 4` of each lane of `qh`, moved to bit 4 of bytes 0..4.
#[inline(always)]
unsafe fn qh_bits(qh: __m512i, k: u32) -> __m512i {
    let h = _mm512_and_si512(
        _mm512_srl_epi32(qh, _mm_cvtsi32_si128(4 * k as i32)),
        _mm512_set1_epi32(0xf),
    );
    // Bit j of h lands at bit 8j (the other copies fall outside the mask, with no carries).
    let s = _mm512_and_si512(
        _mm512_mullo_epi32(h, _mm512_set1_epi32(0x0020_4081)),
        _mm512_set1_epi32(0x0101_0101),
    );
    _mm512_slli_epi32(s, 4)
}

/// Independent `vpdpbusd` accumulators per token for a group of `t` tokens: at least 4 chains in
/// flight (its latency over its throughput).
#[inline(always)]
const fn chains(t: usize) -> usize {
    if t >= 4 {
        1
    } else if t == 1 {
        4
    } else {
        2
    }
}

/// Token `t`'s sum over the first `c` chains (integers: exact whatever the split).
#[inline(always)]
unsafe fn sum_chains<const T: usize>(isum: &[[__m512i; T]; 4], c: usize, t: usize) -> __m512i {
    let mut s = isum[0][t];
    for ch in isum.iter().take(c).skip(1) {
        s = _mm512_add_epi32(s, ch[t]);
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Legacy 32-element formats.

/// Blocks of a legacy format unpacked at a time.
const LCHUNK: usize = 8;

/// Legacy weights: 8 registers of quants per block plus the scale and a second per-row value
/// (the minimum for type 1, `-128 * sum(q)` for type 0).
struct LegacyP {
    q: [[__m512i; 8]; LCHUNK],
    d: [__m512; LCHUNK],
    m: [__m512; LCHUNK],
}

/// How a legacy weight block unpacks: its 32 quants as 8 dwords (unsigned for type 1, signed for
/// type 0), its scale and (type 1) minimum, from block `b` of a chunk of 16 rows (`src`: the
/// transposed chunk of the file's rows, or two interleaved groups).
trait Legacy {
    const WB: usize;
    /// Blocks per chunk (at most [`LCHUNK`]): chosen so a chunk nearly fills whole 64-byte loads.
    const CHUNK: usize;
    /// Type 1 (with a minimum, paired with Q8_1).
    const TYPE1: bool;
    unsafe fn unpack<S: LegacySrc>(src: &S, b: usize, q: &mut [__m512i; 8]) -> (__m512, __m512);
}

/// Bytes of a legacy block's header: `d`, and `m` for type 1 (f16 each).
const fn legacy_head<W: Legacy>() -> usize {
    if W::TYPE1 {
        4
    } else {
        2
    }
}

/// Where the 16 rows of a legacy chunk come from, lane `r` holding row `r`.
trait LegacySrc {
    /// Block `b`'s scale and (type 1) minimum, as f32 (zero for type 0).
    unsafe fn dm<W: Legacy>(&self, b: usize) -> (__m512, __m512);
    /// Dword `k` after block `b`'s header.
    unsafe fn body<W: Legacy>(&self, b: usize, k: usize) -> __m512i;
}

impl LegacySrc for TChunk {
    #[inline(always)]
    unsafe fn dm<W: Legacy>(&self, b: usize) -> (__m512, __m512) {
        let v = self.dw(b * W::WB);
        let m = if W::TYPE1 {
            half_f32::<true>(v)
        } else {
            _mm512_setzero_ps()
        };
        (half_f32::<false>(v), m)
    }

    #[inline(always)]
    unsafe fn body<W: Legacy>(&self, b: usize, k: usize) -> __m512i {
        self.dw(b * W::WB + legacy_head::<W>() + 4 * k)
    }
}

/// Two interleaved groups of 8 rows (`crate::interleave`), at the chunk's first group block: group
/// block `b` holds the 8 rows' `d` (then `m`) side by side, then each dword after the header 8
/// rows at a time, so a lane register is two 32-byte loads with no transpose.
struct LegacyGroups([*const u8; 2]);

impl LegacyGroups {
    /// The 16 bytes at `off` of block `b` of both groups, group 0's in the low half.
    #[inline(always)]
    unsafe fn halves<W: Legacy>(&self, b: usize, off: usize) -> __m256i {
        let o = b * LEGACY_GROUP * W::WB + off;
        let lo = _mm256_castsi128_si256(_mm_loadu_si128(self.0[0].add(o).cast()));
        _mm256_inserti128_si256::<1>(lo, _mm_loadu_si128(self.0[1].add(o).cast()))
    }
}

impl LegacySrc for LegacyGroups {
    #[inline(always)]
    unsafe fn dm<W: Legacy>(&self, b: usize) -> (__m512, __m512) {
        let d = _mm512_cvtph_ps(self.halves::<W>(b, 0));
        let m = if W::TYPE1 {
            _mm512_cvtph_ps(self.halves::<W>(b, 2 * LEGACY_GROUP))
        } else {
            _mm512_setzero_ps()
        };
        (d, m)
    }

    #[inline(always)]
    unsafe fn body<W: Legacy>(&self, b: usize, k: usize) -> __m512i {
        let o = b * LEGACY_GROUP * W::WB + LEGACY_GROUP * (legacy_head::<W>() + 4 * k);
        let lo = _mm512_castsi256_si512(_mm256_loadu_si256(self.0[0].add(o).cast()));
        _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(self.0[1].add(o).cast()))
    }
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;
struct Iq4Nl;

impl Legacy for Q4_0 {
    const WB: usize = 18;
    const CHUNK: usize = 7;
    const TYPE1: bool = false;
    #[inline(always)]
    unsafe fn unpack<S: LegacySrc>(src: &S, b: usize, q: &mut [__m512i; 8]) -> (__m512, __m512) {
        let eight = _mm512_set1_epi8(8);
        for k in 0..4 {
            let g = src.body::<Self>(b, k);
            q[k] = _mm512_sub_epi8(nib_lo(g), eight);
            q[k + 4] = _mm512_sub_epi8(nib_hi(g), eight);
        }
        src.dm::<Self>(b)
    }
}

impl Legacy for Q4_1 {
    const WB: usize = 20;
    const CHUNK: usize = 6;
    const TYPE1: bool = true;
    #[inline(always)]
    unsafe fn unpack<S: LegacySrc>(src: &S, b: usize, q: &mut [__m512i; 8]) -> (__m512, __m512) {
        for k in 0..4 {
            let g = src.body::<Self>(b, k);
            q[k] = nib_lo(g);
            q[k + 4] = nib_hi(g);
        }
        src.dm::<Self>(b)
    }
}

impl Legacy for Q5_0 {
    const WB: usize = 22;
    const CHUNK: usize = 8;
    const TYPE1: bool = false;
    #[inline(always)]
    unsafe fn unpack<S: LegacySrc>(src: &S, b: usize, q: &mut [__m512i; 8]) -> (__m512, __m512) {
        let qh = src.body::<Self>(b, 0);
        let sixteen = _mm512_set1_epi8(16);
        for k in 0..4 {
            let g = src.body::<Self>(b, 1 + k);
            let lo = _mm512_or_si512(nib_lo(g), qh_bits(qh, k as u32));
            let hi = _mm512_or_si512(nib_hi(g), qh_bits(qh, k as u32 + 4));
            q[k] = _mm512_sub_epi8(lo, sixteen);
            q[k + 4] = _mm512_sub_epi8(hi, sixteen);
        }
        src.dm::<Self>(b)
    }
}

impl Legacy for Q5_1 {
    const WB: usize = 24;
    const CHUNK: usize = 8;
    const TYPE1: bool = true;
    #[inline(always)]
    unsafe fn unpack<S: LegacySrc>(src: &S, b: usize, q: &mut [__m512i; 8]) -> (__m512, __m512) {
        let qh = src.body::<Self>(b, 0);
        for k in 0..4 {
            let g = src.body::<Self>(b, 1 + k);
            q[k] = _mm512_or_si512(nib_lo(g), qh_bits(qh, k as u32));
            q[k + 4] = _mm512_or_si512(nib_hi(g), qh_bits(qh, k as u32 + 4));
        }
        src.dm::<Self>(b)
    }
}

impl Legacy for Q8_0 {
    const WB: usize = 34;
    const CHUNK: usize = 7;
    const TYPE1: bool = false;
    #[inline(always)]
    unsafe fn unpack<S: LegacySrc>(src: &S, b: usize, q: &mut [__m512i; 8]) -> (__m512, __m512) {
        for (k, qk) in q.iter_mut().enumerate() {
            *qk = src.body::<Self>(b, k);
        }
        src.dm::<Self>(b)
    }
}

impl Legacy for Iq4Nl {
    const WB: usize = 18;
    const CHUNK: usize = 7;
    const TYPE1: bool = false;
    #[inline(always)]
    unsafe fn unpack<S: LegacySrc>(src: &S, b: usize, q: &mut [__m512i; 8]) -> (__m512, __m512) {
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        for k in 0..4 {
            let g = src.body::<Self>(b, k);
            q[k] = _mm512_shuffle_epi8(table, nib_lo(g));
            q[k + 4] = _mm512_shuffle_epi8(table, nib_hi(g));
        }
        src.dm::<Self>(b)
    }
}

/// Unpacks `cn` blocks of a legacy chunk from `src` into `p`.
#[inline(always)]
unsafe fn legacy_pack<W: Legacy, S: LegacySrc>(src: &S, cn: usize, p: &mut LegacyP) {
    for b in 0..cn {
        let (d, m) = W::unpack(src, b, &mut p.q[b]);
        p.d[b] = d;
        p.m[b] = if W::TYPE1 {
            m
        } else {
            // -128 * sum(q), the correction for the biased activations, kept as i32 bits.
            let ones = _mm512_set1_epi8(1);
            let mut s = _mm512_setzero_si512();
            for k in 0..8 {
                s = _mm512_dpbusd_epi32(s, ones, p.q[b][k]);
            }
            _mm512_castsi512_ps(_mm512_sub_epi32(
                _mm512_setzero_si512(),
                _mm512_slli_epi32(s, 7),
            ))
        };
    }
}

/// A token's chunk of activation blocks, prepared: the scales as f32 (`[d, s]` per Q8_1 block, `d`
/// per Q8_0 block) and, for Q8_0, the quants biased to `a + 128`.
struct LegacyQ {
    ds: [f32; 2 * LCHUNK],
    q: [[u8; 32]; LCHUNK],
}

struct L<W>(std::marker::PhantomData<W>);

impl<W: Legacy> Fmt for L<W> {
    const WB: usize = W::WB;
    const AB: usize = if W::TYPE1 { 36 } else { 34 };
    const CHUNK: usize = W::CHUNK;
    type P = LegacyP;
    type Q = LegacyQ;

    #[inline(always)]
    unsafe fn pack(src: &TChunk, cn: usize, p: &mut LegacyP) {
        legacy_pack::<W, _>(src, cn, p)
    }

    const GROUPED: bool = true;
    const GROUP_ROWS: usize = LEGACY_GROUP;

    /// Two groups of 8 rows: each lane register is two 32-byte loads (`LegacyGroups`).
    #[inline(always)]
    unsafe fn load_groups(groups: &[*const u8; 4], c0: usize, cn: usize, p: &mut LegacyP) {
        let at = c0 * LEGACY_GROUP * W::WB;
        legacy_pack::<W, _>(&LegacyGroups([groups[0].add(at), groups[1].add(at)]), cn, p)
    }

    #[inline(always)]
    unsafe fn prep(a: *const u8, cn: usize, q: &mut LegacyQ) {
        for b in 0..cn {
            let blk = a.add(b * Self::AB);
            if W::TYPE1 {
                let v = _mm_cvtph_ps(_mm_cvtsi32_si128(read_unaligned(blk.cast::<i32>())));
                _mm_storel_epi64(q.ds.as_mut_ptr().add(2 * b).cast(), _mm_castps_si128(v));
            } else {
                q.ds[b] = super::avx2::f16c([*blk, *blk.add(1)]);
                let y = _mm256_loadu_si256(blk.add(2).cast());
                let y = _mm256_xor_si256(y, _mm256_set1_epi8(0x80u8 as i8));
                _mm256_storeu_si256(q.q[b].as_mut_ptr().cast(), y);
            }
        }
    }

    #[inline(always)]
    unsafe fn step<const T: usize>(
        p: &LegacyP,
        b: usize,
        a: &[*const u8; T],
        q: &[&LegacyQ; T],
        acc: &mut [__m512; T],
        accm: &mut [__m512; T],
    ) {
        // `vpdpbusd` has a latency of 4 and a throughput of 1: fewer than 4 tokens split each
        // block's 8 products over `chains(T)` accumulators per token (exact integers, any order).
        let c = chains(T);
        if W::TYPE1 {
            let mut isum = [[_mm512_setzero_si512(); T]; 4];
            for k in 0..8 {
                let w = p.q[b][k];
                for t in 0..T {
                    isum[k % c][t] =
                        _mm512_dpbusd_epi32(isum[k % c][t], w, bcast(a[t].add(4 + 4 * k)));
                }
            }
            for t in 0..T {
                let is = sum_chains(&isum, c, t);
                let dy = bcast_f(q[t].ds.as_ptr().add(2 * b));
                let sy = bcast_f(q[t].ds.as_ptr().add(2 * b + 1));
                let d = _mm512_mul_ps(p.d[b], dy);
                acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(is), acc[t]);
                accm[t] = _mm512_fmadd_ps(p.m[b], sy, accm[t]);
            }
        } else {
            let mut isum = [[_mm512_setzero_si512(); T]; 4];
            isum[0] = [_mm512_castps_si512(p.m[b]); T];
            for k in 0..8 {
                let w = p.q[b][k];
                for t in 0..T {
                    let y = bcast(q[t].q[b].as_ptr().add(4 * k));
                    isum[k % c][t] = _mm512_dpbusd_epi32(isum[k % c][t], y, w);
                }
            }
            for t in 0..T {
                let is = sum_chains(&isum, c, t);
                let d = _mm512_mul_ps(p.d[b], bcast_f(q[t].ds.as_ptr().add(b)));
                acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(is), acc[t]);
            }
        }
    }

    const ONE: bool = true;

    #[inline(always)]
    unsafe fn prep_one(a: *const u8, nb: usize, q: *mut u8) {
        for b in 0..nb {
            let blk = a.add(b * Self::AB);
            let dst = q.add(8 * b);
            if W::TYPE1 {
                // [d, s] as f32.
                let v = _mm_cvtph_ps(_mm_cvtsi32_si128(read_unaligned(blk.cast::<i32>())));
                _mm_storel_epi64(dst.cast(), _mm_castps_si128(v));
            } else {
                // d as f32 and -128 * sum(y): the correction for weights biased to `q + 128`.
                let y = _mm256_loadu_si256(blk.add(2).cast());
                let s = _mm256_sad_epu8(
                    _mm256_xor_si256(y, _mm256_set1_epi8(0x80u8 as i8)),
                    _mm256_setzero_si256(),
                );
                let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                let sum = _mm_cvtsi128_si64(_mm_add_epi64(s, _mm_unpackhi_epi64(s, s))) - 32 * 128;
                dst.cast::<f32>()
                    .write_unaligned(super::avx2::f16c([*blk, *blk.add(1)]));
                dst.add(4).cast::<i32>().write_unaligned(-128 * sum as i32);
            }
        }
    }

    #[inline(always)]
    unsafe fn one_token(
        src: &TChunk,
        cn: usize,
        c0: usize,
        a: *const u8,
        q: *const u8,
        acc: &mut __m512,
        accm: &mut __m512,
    ) {
        for b in 0..cn {
            let mut w = [_mm512_setzero_si512(); 8];
            let (d, m) = W::unpack(src, b, &mut w);
            let blk = a.add((c0 + b) * Self::AB);
            let pq = q.add(8 * (c0 + b));
            let mut isum = [_mm512_setzero_si512(); 4];
            if W::TYPE1 {
                for k in 0..8 {
                    isum[k % 4] = _mm512_dpbusd_epi32(isum[k % 4], w[k], bcast(blk.add(4 + 4 * k)));
                }
            } else {
                // Signed weights biased to unsigned `q + 128`, against the signed activations;
                // the bias comes back out through the prepared `-128 * sum(y)`: the same integer.
                isum[0] = _mm512_set1_epi32(read_unaligned(pq.add(4).cast::<i32>()));
                let bias = _mm512_set1_epi8(0x80u8 as i8);
                for k in 0..8 {
                    let wu = _mm512_xor_si512(w[k], bias);
                    isum[k % 4] = _mm512_dpbusd_epi32(isum[k % 4], wu, bcast(blk.add(2 + 4 * k)));
                }
            }
            let is = _mm512_add_epi32(
                _mm512_add_epi32(isum[0], isum[1]),
                _mm512_add_epi32(isum[2], isum[3]),
            );
            let dd = _mm512_mul_ps(d, bcast_f(pq.cast::<f32>()));
            *acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(is), *acc);
            if W::TYPE1 {
                *accm = _mm512_fmadd_ps(m, bcast_f(pq.add(4).cast::<f32>()), *accm);
            }
        }
    }

    #[inline(always)]
    unsafe fn finish(acc: __m512, accm: __m512) -> __m512 {
        if W::TYPE1 {
            _mm512_add_ps(acc, accm)
        } else {
            acc
        }
    }
}

// ---------------------------------------------------------------------------------------------
// K-quants × Q8_K (one super-block of 256 per chunk).

/// `tot[t] += Σ_s sc[s] * Σ_{k < K} q[K·s + k] · y_t[4(K·s + k)..]` over a super-block's scale groups
/// of `K` dwords (Q4_K / Q5_K: 8 groups of 32 quants, Q6_K: 16 groups of 16), each group's sum exact
/// in i32 and multiplied by its scale (`vpmulld`); fewer than 4 tokens keep 4 `vpdpbusd` chains in
/// flight.
#[inline(always)]
unsafe fn scaled_sums<const T: usize, const K: usize>(
    q: &[__m512i; 64],
    sc: &[__m512i],
    a: &[*const u8; T],
    tot: &mut [__m512i; T],
) {
    let c = chains(T);
    for (s, sc) in sc.iter().enumerate().take(64 / K) {
        let mut is = [[_mm512_setzero_si512(); T]; 4];
        for k in 0..K {
            let w = q[K * s + k];
            for t in 0..T {
                let y = bcast(a[t].add(Q8K_QS + 4 * (K * s + k)));
                is[k % c][t] = _mm512_dpbusd_epi32(is[k % c][t], w, y);
            }
        }
        for t in 0..T {
            let is = sum_chains(&is, c, t);
            tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(is, *sc));
        }
    }
}

/// Q8_K: `d` (f32) at 0, 256 quants at 4, 16 i16 sums of 16 quants at 260.
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;

/// Q4_K / Q5_K unpacked: 64 registers of quants (register `k` holds elements `4k..4k + 4`), the
/// eight sub-block scales as i32, the eight minimums as i16 pairs `[m[2p], m[2p + 1]]`, `d` and
/// `dmin`.
struct K45P {
    q: [__m512i; 64],
    sc: [__m512i; 8],
    /// The scales as i16 pairs `[sc, sc]` (Q4_K's 4-token step).
    sc2: [__m512i; 8],
    mn: [__m512i; 4],
    d: __m512,
    dmin: __m512,
}

/// The block scale, minimum scale, 6-bit scales and minimums of a Q4_K / Q5_K block into `p`, from
/// its first four dwords (`dd`: `d` and `dmin`; `u0..u2`: the packed scales), as
/// `avx2::k4_scales_mins` in every lane.
#[inline(always)]
unsafe fn k45_scales(p: &mut K45P, dd: __m512i, u0: __m512i, u1: __m512i, u2: __m512i) {
    let m6 = _mm512_set1_epi32(0x3f3f_3f3f);
    let m4 = _mm512_set1_epi32(0x0f0f_0f0f);
    let m2 = _mm512_set1_epi32(0x0303_0303);
    let sc_lo = _mm512_and_si512(u0, m6);
    let sc_hi = _mm512_or_si512(
        _mm512_and_si512(u2, m4),
        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m2), 4),
    );
    let mn_lo = _mm512_and_si512(u1, m6);
    let mn_hi = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m2), 4),
    );
    k45_spread(p, dd, [sc_lo, sc_hi, mn_lo, mn_hi]);
}

/// `d` and `dmin` (`dd`, as the block's first dword) and the 6-bit scales and minimums, four to a
/// lane's dword (`[scales 0..4, scales 4..8, minimums 0..4, minimums 4..8]`), into `p`.
#[inline(always)]
unsafe fn k45_spread(p: &mut K45P, dd: __m512i, [sc_lo, sc_hi, mn_lo, mn_hi]: [__m512i; 4]) {
    p.d = half_f32::<false>(dd);
    p.dmin = half_f32::<true>(dd);
    let byte = _mm512_set1_epi32(0xff);
    for s in 0..4 {
        let sh = _mm_cvtsi32_si128(8 * s as i32);
        p.sc[s] = _mm512_and_si512(_mm512_srl_epi32(sc_lo, sh), byte);
        p.sc[s + 4] = _mm512_and_si512(_mm512_srl_epi32(sc_hi, sh), byte);
        for i in [s, s + 4] {
            p.sc2[i] = _mm512_or_si512(p.sc[i], _mm512_slli_epi32(p.sc[i], 16));
        }
    }
    // i16 pairs of consecutive minimums: bytes [m0, m1, m2, m3] give [m0, m1] and [m2, m3].
    let even = _mm512_set1_epi32(0x00ff_00ff);
    let low = _mm512_set1_epi32(0xffff);
    for (h, v) in [mn_lo, mn_hi].into_iter().enumerate() {
        let e = _mm512_and_si512(v, even); // (m0, m2)
        let o = _mm512_and_si512(_mm512_srli_epi32(v, 8), even); // (m1, m3)
        p.mn[2 * h] = _mm512_or_si512(_mm512_and_si512(e, low), _mm512_slli_epi32(o, 16));
        p.mn[2 * h + 1] = _mm512_or_si512(_mm512_srli_epi32(e, 16), _mm512_andnot_si512(low, o));
    }
}

/// Two groups' 32 bytes at `off` side by side.
#[inline(always)]
unsafe fn pair(a: *const u8, b: *const u8, off: usize) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_loadu_si256(a.add(off).cast())),
        _mm256_loadu_si256(b.add(off).cast()),
    )
}

/// Four groups' 16 bytes at `off`, group `i` in 128-bit lane `i`.
#[inline(always)]
unsafe fn quad(g: &[*const u8; 4], off: usize) -> __m512i {
    let mut v = _mm512_castsi128_si512(_mm_loadu_si128(g[0].add(off).cast()));
    v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(g[1].add(off).cast()));
    v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(g[2].add(off).cast()));
    _mm512_inserti32x4::<3>(v, _mm_loadu_si128(g[3].add(off).cast()))
}

/// The even dwords of `x` then of `y`, and the odd ones: two qwords per lane pair become a dword
/// in each of 16 lanes.
#[inline(always)]
unsafe fn evens_odds(x: __m512i, y: __m512i) -> (__m512i, __m512i) {
    let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    let odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    (
        _mm512_permutex2var_epi32(x, even, y),
        _mm512_permutex2var_epi32(x, odd, y),
    )
}

/// The 32 bytes at `off` of four groups of four rows, 8 bytes per row (row `r` at `8r`): bytes
/// 0..4 of row `r` of group `g` in lane `4g + r` of the first register, bytes 4..8 in the second.
#[inline(always)]
unsafe fn row_dwords(g: &[*const u8; 4], off: usize) -> (__m512i, __m512i) {
    evens_odds(pair(g[0], g[1], off), pair(g[2], g[3], off))
}

/// Quant dword `i` (0..32) of a Q4_K block: its low nibbles are elements of sub-block `2(i / 8)`,
/// its high nibbles of the next.
#[inline(always)]
unsafe fn q4k_quants(p: &mut K45P, i: usize, g: __m512i) {
    let (c, t) = (i / 8, i % 8);
    p.q[16 * c + t] = nib_lo(g);
    p.q[16 * c + 8 + t] = nib_hi(g);
}

struct K45<const Q5: bool>;

impl<const Q5: bool> Fmt for K45<Q5> {
    const WB: usize = if Q5 { 176 } else { 144 };
    const AB: usize = 292;
    const CHUNK: usize = 1;
    type P = K45P;
    type Q = __m128i;

    /// Q5_K through the transposed chunk. Q4_K straight from registers, with no store and
    /// reload of the chunk: bytes 0..64 hold `d`, `dmin`, the scales and quant dwords 0..12, bytes
    /// 64..128 quant dwords 12..28 and bytes 128..144 the last four; each goes to `p` as it is
    /// transposed.
    #[inline(always)]
    unsafe fn load_pack(
        tc: &mut TChunk,
        rows: &[*const u8; LANES],
        end: *const u8,
        c0: usize,
        cn: usize,
        p: &mut K45P,
    ) {
        if Q5 {
            tc.load(rows, end, c0 * Self::WB, cn * Self::WB);
            return Self::pack(tc, cn, p);
        }
        let off = c0 * Self::WB;
        let r = load_t16(rows, end, off, 144);
        k45_scales(p, r[0], r[1], r[2], r[3]);
        for i in 0..12 {
            q4k_quants(p, i, r[4 + i]);
        }
        let r = load_t16(rows, end, off + 64, 80);
        for i in 0..16 {
            q4k_quants(p, 12 + i, r[i]);
        }
        let r = load_t4(rows, end, off + 128, 16);
        for i in 0..4 {
            q4k_quants(p, 28 + i, r[i]);
        }
    }

    const GROUPED: bool = !Q5;

    /// Q4_K's group super-block (`crate::interleave`): `d` and `dmin` of the four rows, the 64
    /// six-bit values split into nibbles and top bits, then per sub-block and half 8 quant bytes
    /// per row. Row `r`'s two quant dwords of a half become lanes by one `vpermt2d` each over two
    /// groups' halves; its scales and minimums are put together eight to a qword first.
    #[inline(always)]
    unsafe fn load_groups(groups: &[*const u8; 4], c0: usize, _cn: usize, p: &mut K45P) {
        use crate::interleave::Q4_K_GROUP_BLOCK;
        let g: [*const u8; 4] = std::array::from_fn(|i| groups[i].add(c0 * Q4_K_GROUP_BLOCK));
        // `d` and `dmin` (bytes 0..16 of each group: four f16 of each) into a dword per row.
        let dd = quad(&g, 0);
        let pick = _mm512_broadcast_i32x4(_mm_setr_epi8(
            0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
        ));
        let dd = _mm512_shuffle_epi8(dd, pick);
        // Scales and minimums: row `r`'s low nibbles at bytes 16 + 8r.. (scale j low, minimum j
        // high), their top bits in bytes 48 + 8(r % 2) + j, at bits 2(r / 2) (scales) and
        // 4 + 2(r / 2) (minimums). One qword per row: rows 0..8 of groups 0 and 1, then 8..16.
        let nib = _mm512_set1_epi8(0x0f);
        let two = _mm512_set1_epi8(0x03);
        let mut sm = [_mm512_setzero_si512(); 4];
        for (h, (a, b)) in [(g[0], g[1]), (g[2], g[3])].into_iter().enumerate() {
            let lo = pair(a, b, 16);
            // Bytes 48..64 of each group (qwords 0, 1 and 4, 5), qword (r % 2) for row r.
            let top = _mm512_inserti32x4::<2>(
                _mm512_castsi128_si512(_mm_loadu_si128(a.add(48).cast())),
                _mm_loadu_si128(b.add(48).cast()),
            );
            let top = _mm512_permutexvar_epi64(_mm512_set_epi64(5, 4, 5, 4, 1, 0, 1, 0), top);
            let sc_top = _mm512_srlv_epi64(top, _mm512_set_epi64(2, 2, 0, 0, 2, 2, 0, 0));
            let mn_top = _mm512_srlv_epi64(top, _mm512_set_epi64(6, 6, 4, 4, 6, 6, 4, 4));
            let sc = _mm512_or_si512(
                _mm512_and_si512(lo, nib),
                _mm512_slli_epi64(_mm512_and_si512(sc_top, two), 4),
            );
            let mn = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi64(lo, 4), nib),
                _mm512_slli_epi64(_mm512_and_si512(mn_top, two), 4),
            );
            sm[h] = sc;
            sm[2 + h] = mn;
        }
        let (sc_even, sc_odd) = evens_odds(sm[0], sm[1]);
        let (mn_even, mn_odd) = evens_odds(sm[2], sm[3]);
        k45_spread(p, dd, [sc_even, sc_odd, mn_even, mn_odd]);
        // Quants: sub-block j, half h at 64 + 64j + 32h, row r's 8 bytes at 8r: byte k holds
        // element 32j + 16h + k (low nibble) and 32j + 16h + 8 + k (high).
        for j in 0..8 {
            for h in 0..2 {
                let (a, b) = row_dwords(&g, 64 + 64 * j + 32 * h);
                let q = 8 * j + 4 * h;
                p.q[q] = nib_lo(a);
                p.q[q + 1] = nib_lo(b);
                p.q[q + 2] = nib_hi(a);
                p.q[q + 3] = nib_hi(b);
            }
        }
    }

    #[inline(always)]
    unsafe fn pack(src: &TChunk, _cn: usize, p: &mut K45P) {
        let o = 0;
        k45_scales(p, src.dw(o), src.dw(o + 4), src.dw(o + 8), src.dw(o + 12));
        let qs = if Q5 { 48 } else { 16 };
        let one = _mm512_set1_epi8(1);
        for c in 0..4 {
            for t in 0..8 {
                let g = src.dw(o + qs + 32 * c + 4 * t);
                let (mut lo, mut hi) = (nib_lo(g), nib_hi(g));
                if Q5 {
                    // Bit 2c (2c + 1) of each qh byte is the fifth bit of sub-block 2c (2c + 1).
                    let h = src.dw(o + 16 + 4 * t);
                    let hl =
                        _mm512_and_si512(_mm512_srl_epi32(h, _mm_cvtsi32_si128(2 * c as i32)), one);
                    let hh = _mm512_and_si512(
                        _mm512_srl_epi32(h, _mm_cvtsi32_si128(2 * c as i32 + 1)),
                        one,
                    );
                    lo = _mm512_or_si512(lo, _mm512_slli_epi32(hl, 4));
                    hi = _mm512_or_si512(hi, _mm512_slli_epi32(hh, 4));
                }
                p.q[16 * c + t] = lo;
                p.q[16 * c + 8 + t] = hi;
            }
        }
    }

    /// The sums of the 8 sub-blocks as i16 (`bsums` added in pairs), for the minimums.
    #[inline(always)]
    unsafe fn prep(a: *const u8, _cn: usize, q: &mut __m128i) {
        let bs = _mm256_loadu_si256(a.add(Q8K_BSUMS).cast());
        *q = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    }

    #[inline(always)]
    unsafe fn step<const T: usize>(
        p: &K45P,
        _b: usize,
        a: &[*const u8; T],
        q: &[&__m128i; T],
        acc: &mut [__m512; T],
        accm: &mut [__m512; T],
    ) {
        let mut tot = [_mm512_setzero_si512(); T];
        let mut ms = [_mm512_setzero_si512(); T];
        if T >= 4 && !Q5 {
            // Q4_K, 4 tokens: a half sub-block's sum fits an i16 (16 * 15 * 128 < 2^15), so the
            // two halves' sums go into the two i16 halves of one lane and one `vpdpwssd` with
            // `[sc, sc]` adds `sc * (first + second)`: one multiply-pipe operation per sub-block
            // instead of a `vpmulld` (two). The same exact integer as below.
            for s in 0..8 {
                let mut is = [[_mm512_setzero_si512(); T]; 2];
                for k in 0..8 {
                    let w = p.q[8 * s + k];
                    for t in 0..T {
                        let y = bcast(a[t].add(Q8K_QS + 32 * s + 4 * k));
                        is[k / 4][t] = _mm512_dpbusd_epi32(is[k / 4][t], w, y);
                    }
                }
                for t in 0..T {
                    let x = _mm512_mask_blend_epi16(
                        0xAAAA_AAAA,
                        is[1][t],
                        _mm512_slli_epi32(is[0][t], 16),
                    );
                    tot[t] = _mm512_dpwssd_epi32(tot[t], x, p.sc2[s]);
                }
            }
        } else {
            scaled_sums::<T, 8>(&p.q, &p.sc, a, &mut tot);
        }
        for (pr, mn) in p.mn.iter().enumerate() {
            for t in 0..T {
                let q8s = bcast((q[t] as *const __m128i).cast::<u8>().add(4 * pr));
                ms[t] = _mm512_dpwssd_epi32(ms[t], *mn, q8s);
            }
        }
        for t in 0..T {
            let dy = bcast_f(a[t].cast::<f32>());
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(p.d, dy), _mm512_cvtepi32_ps(tot[t]), acc[t]);
            accm[t] = _mm512_fmadd_ps(
                _mm512_mul_ps(p.dmin, dy),
                _mm512_cvtepi32_ps(ms[t]),
                accm[t],
            );
        }
    }

    #[inline(always)]
    unsafe fn finish(acc: __m512, accm: __m512) -> __m512 {
        _mm512_sub_ps(acc, accm)
    }
}

/// Q6_K unpacked: 64 registers of `q + 32` (0..63; register `k` holds elements `4k..4k + 4`), the
/// 16 signed scales as i32, the scales as i16 pairs `[sc[2p], sc[2p + 1]]`, and `d`.
struct Q6P {
    q: [__m512i; 64],
    sc: [__m512i; 16],
    scp: [__m512i; 8],
    d: __m512,
}

struct Q6K;

/// Scales `4g..4g + 4` of the 16 rows (`s4`: a dword per row, one i8 per byte) into `p`: each
/// as i32, and as i16 pairs `[sc[4g], sc[4g + 1]]`, `[sc[4g + 2], sc[4g + 3]]`.
#[inline(always)]
unsafe fn q6_scales(p: &mut Q6P, g: usize, s4: __m512i) {
    for k in 0..4 {
        let up = _mm512_sll_epi32(s4, _mm_cvtsi32_si128(24 - 8 * k as i32));
        p.sc[4 * g + k] = _mm512_srai_epi32(up, 24);
    }
    // lo16 = [sc0, sc2] (i16 lanes), hi16 = [sc1, sc3] per dword.
    let lo16 = _mm512_srai_epi16(_mm512_slli_epi16(s4, 8), 8);
    let hi16 = _mm512_srai_epi16(s4, 8);
    p.scp[2 * g] = _mm512_or_si512(
        _mm512_and_si512(lo16, _mm512_set1_epi32(0xffff)),
        _mm512_slli_epi32(hi16, 16),
    );
    p.scp[2 * g + 1] = _mm512_or_si512(
        _mm512_srli_epi32(lo16, 16),
        _mm512_andnot_si512(_mm512_set1_epi32(0xffff), hi16),
    );
}

impl Fmt for Q6K {
    const WB: usize = 210;
    const AB: usize = 292;
    const CHUNK: usize = 1;
    type P = Q6P;
    type Q = ();

    #[inline(always)]
    unsafe fn pack(src: &TChunk, _cn: usize, p: &mut Q6P) {
        let o = 0;
        // ql[128] at 0, qh[64] at 128, scales[16] at 192, d at 208 (read as the dword at 206).
        p.d = half_f32::<true>(src.dw(o + 206));
        for g in 0..4 {
            q6_scales(p, g, src.dw(o + 192 + 4 * g));
        }
        let m4 = _mm512_set1_epi8(0x0f);
        let m2 = _mm512_set1_epi8(0x03);
        for h in 0..2 {
            for t in 0..8 {
                let qh = src.dw(o + 128 + 32 * h + 4 * t);
                for half in 0..2 {
                    let ql = src.dw(o + 64 * h + 32 * half + 4 * t);
                    for nib in 0..2 {
                        let g = 2 * nib + half;
                        let lo = _mm512_and_si512(
                            _mm512_srl_epi32(ql, _mm_cvtsi32_si128(4 * nib as i32)),
                            m4,
                        );
                        let hb = _mm512_and_si512(
                            _mm512_srl_epi32(qh, _mm_cvtsi32_si128(2 * g as i32)),
                            m2,
                        );
                        p.q[32 * h + 8 * g + t] = _mm512_or_si512(lo, _mm512_slli_epi32(hb, 4));
                    }
                }
            }
        }
    }

    const GROUPED: bool = true;

    /// Q6_K's group super-block (`crate::interleave`): `d` of the four rows, their scales a dword
    /// per row and four sub-blocks, then per 32 elements three 32-byte parts of 8 bytes per row
    /// (low nibbles of elements 0..16, of 16..32, top bits), whose two dwords per row become lanes
    /// by one `vpermt2d` each over two groups' parts, as Q4_K's quants.
    #[inline(always)]
    unsafe fn load_groups(groups: &[*const u8; 4], c0: usize, _cn: usize, p: &mut Q6P) {
        use crate::interleave::{Q6_K_GROUP_BLOCK, Q6_K_GROUP_QUANTS};
        let g: [*const u8; 4] = std::array::from_fn(|i| groups[i].add(c0 * Q6_K_GROUP_BLOCK));
        let d: [i64; 4] = std::array::from_fn(|i| read_unaligned(g[i].cast::<i64>()));
        p.d = _mm512_cvtph_ps(_mm256_setr_epi64x(d[0], d[1], d[2], d[3]));
        for k in 0..4 {
            // Scales 4k..4k + 4 of rows 0..3 at bytes 8 + 16k of each group.
            q6_scales(p, k, quad(&g, 8 + 16 * k));
        }
        let m4 = _mm512_set1_epi8(0x0f);
        let m2 = _mm512_set1_epi8(0x03);
        for c in 0..8 {
            let off = Q6_K_GROUP_QUANTS + 96 * c;
            // Part `i`, bytes 0..4 (`li`) and 4..8 (`hi`) of each row's 8.
            let (l0, h0) = row_dwords(&g, off);
            let (l1, h1) = row_dwords(&g, off + 32);
            let (l2, h2) = row_dwords(&g, off + 64);
            // Register 8c + d holds elements 32c + 4d..32c + 4d + 4: nibble `d / 2 % 2` of part
            // `d / 4`, bytes `4 (d % 2)..`; top bits at 2 (d / 2) in part 2.
            for d in 0..8 {
                let (ql, qh) = match (d / 4, d % 2) {
                    (0, 0) => (l0, l2),
                    (0, _) => (h0, h2),
                    (_, 0) => (l1, l2),
                    _ => (h1, h2),
                };
                let lo = _mm512_and_si512(
                    _mm512_srl_epi32(ql, _mm_cvtsi32_si128(4 * (d / 2 % 2) as i32)),
                    m4,
                );
                let hb = _mm512_and_si512(
                    _mm512_srl_epi32(qh, _mm_cvtsi32_si128(2 * (d / 2) as i32)),
                    m2,
                );
                p.q[8 * c + d] = _mm512_or_si512(lo, _mm512_slli_epi32(hb, 4));
            }
        }
    }

    #[inline(always)]
    unsafe fn prep(_a: *const u8, _cn: usize, _q: &mut ()) {}

    #[inline(always)]
    unsafe fn step<const T: usize>(
        p: &Q6P,
        _b: usize,
        a: &[*const u8; T],
        _q: &[&(); T],
        acc: &mut [__m512; T],
        _accm: &mut [__m512; T],
    ) {
        let mut tot = [_mm512_setzero_si512(); T];
        let mut ms = [_mm512_setzero_si512(); T];
        scaled_sums::<T, 4>(&p.q, &p.sc, a, &mut tot);
        for pr in 0..8 {
            for t in 0..T {
                ms[t] = _mm512_dpwssd_epi32(ms[t], p.scp[pr], bcast(a[t].add(Q8K_BSUMS + 4 * pr)));
            }
        }
        for t in 0..T {
            let isum = _mm512_sub_epi32(tot[t], _mm512_slli_epi32(ms[t], 5));
            let dy = bcast_f(a[t].cast::<f32>());
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(p.d, dy), _mm512_cvtepi32_ps(isum), acc[t]);
        }
    }

    #[inline(always)]
    unsafe fn finish(acc: __m512, _accm: __m512) -> __m512 {
        acc
    }
}

// ---------------------------------------------------------------------------------------------
// The driver.

/// `T` tokens from `j` through one chunk, accumulators loaded from and stored back to memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn group<F: Fmt, const T: usize>(
    p: &F::P,
    cn: usize,
    c0: usize,
    a: &[*const u8; PASS],
    q: &[F::Q],
    j: usize,
    acc: &mut [__m512; PASS],
    accm: &mut [__m512; PASS],
) {
    let mut ac = [_mm512_setzero_ps(); T];
    let mut am = [_mm512_setzero_ps(); T];
    let mut qs: [&F::Q; T] = [&q[j]; T];
    for t in 0..T {
        ac[t] = acc[j + t];
        am[t] = accm[j + t];
        qs[t] = &q[j + t];
    }
    for b in 0..cn {
        let mut ab = [std::ptr::null::<u8>(); T];
        for t in 0..T {
            ab[t] = a[j + t].add((c0 + b) * F::AB);
        }
        F::step::<T>(p, b, &ab, &qs, &mut ac, &mut am);
    }
    acc[j..j + T].copy_from_slice(&ac);
    accm[j..j + T].copy_from_slice(&am);
}

/// Every row of `w` against the `acts` (at most [`PASS`]): element (row `i`, token `j`) goes to
/// `out[j * tok_stride + i * row_stride]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn run<F: Fmt, const GROUPED: bool>(
    nb: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
    scratch: *mut __m512i,
) {
    let nt = acts.len();
    debug_assert!((1..=PASS).contains(&nt));
    let mut a = [std::ptr::null::<u8>(); PASS];
    for j in 0..nt {
        debug_assert_eq!(acts[j].len(), nb * F::AB);
        a[j] = acts[j].as_ptr();
    }
    const {
        assert!(size_of::<F::P>() <= P_ZMM * 64);
        assert!(size_of::<[F::Q; PASS]>() <= Q_ZMM * 64);
    }
    // SAFETY: the scratch is initialised memory of SCRATCH_ZMM registers, 64-byte aligned, and the
    // three regions do not overlap; every type placed there (registers, f32, u8 arrays) is valid for
    // any bit pattern.
    let p = &mut *scratch.cast::<F::P>();
    let tc = &mut *scratch.add(P_ZMM).cast::<TChunk>();
    const { assert!(!GROUPED || F::GROUPED) };
    let one = F::ONE && !GROUPED && nt == 1 && nb <= ONE_MAX_BLOCKS;
    // The tokens' prepared blocks: for every chunk at once when they fit (prepared once per
    // call, not once per 16 rows), else one chunk's at a time. A legacy chunk's preparation is
    // 320 bytes per token: a few tokens' fit (a server step of 8 sequences, SmolLM2: 8 tokens
    // of Q4_1 / Q8_0, one thread, 1536 x 576 in L2, 127.9 / 114.6 -> 136.9 / 123.3 G
    // multiply-adds/s; `hearth bench --parallel 8 -d 16` 697-731 -> 754-771 t/s), a prefill's 64
    // mostly do not. A scratch large enough for those (160 KB) gained 6-23% in `prefill_min` but
    // lost 9% of SmolLM2's pp512 in the model.
    let n_chunks = nb.div_ceil(F::CHUNK);
    let q_cap = (Q_ZMM * 64)
        .checked_div(size_of::<F::Q>())
        .unwrap_or(usize::MAX);
    let hoist = n_chunks * nt <= q_cap;
    let q = std::slice::from_raw_parts_mut(
        scratch.add(P_ZMM + T_ZMM).cast::<F::Q>(),
        if one {
            0
        } else if hoist {
            n_chunks * nt
        } else {
            nt
        },
    );
    let acc = &mut *scratch.add(P_ZMM + T_ZMM + Q_ZMM).cast::<[__m512; PASS]>();
    let accm = &mut *scratch
        .add(P_ZMM + T_ZMM + Q_ZMM + PASS)
        .cast::<[__m512; PASS]>();
    let q1 = scratch.add(P_ZMM + T_ZMM).cast::<u8>();
    if one {
        crate::simd::prefetch_first_rows(w);
        F::prep_one(a[0], nb, q1);
    }
    if hoist && !one {
        for c in 0..n_chunks {
            let (c0, cn) = (c * F::CHUNK, (nb - c * F::CHUNK).min(F::CHUNK));
            for j in 0..nt {
                F::prep(a[j].add(c0 * F::AB), cn, &mut q[c * nt + j]);
            }
        }
    }
    let mut r0 = 0;
    while r0 < w.count {
        let nr = (w.count - r0).min(LANES);
        let base = w.data.as_ptr().add(r0 * w.stride);
        let end = w.data.as_ptr().add(w.data.len());
        let mut rows = [base; LANES];
        for (l, r) in rows.iter_mut().enumerate() {
            *r = base.add(l.min(nr - 1) * w.stride);
        }
        // Interleaved: the groups' starts (`w.count` is whole groups; past a ragged end the
        // last group repeats, like the last row above).
        let groups: [*const u8; 4] = std::array::from_fn(|g| {
            let last = nr.saturating_sub(F::GROUP_ROWS);
            if g * F::GROUP_ROWS < LANES {
                base.add((F::GROUP_ROWS * g).min(last) * w.stride)
            } else {
                base
            }
        });
        for j in 0..nt {
            acc[j] = _mm512_setzero_ps();
            accm[j] = _mm512_setzero_ps();
        }
        let mut c0 = 0;
        while c0 < nb {
            let cn = (nb - c0).min(F::CHUNK);
            // The 16 rows are read a chunk at a time each, a pattern the hardware prefetchers do not
            // follow: while this block of rows is computed, prefetch (into L2) the block after
            // next, which usually follows in memory (also across calls), front to back, a share
            // per chunk. Decode streams the weights from memory and otherwise waits on the loads:
            // 1 token x 47 MB of Q4_1 went from 4.7 GB/s to ~9 (the one-row AVX2 kernel: ~11).
            //
            // Several tokens: the chunk's share is cut again, a piece per 4 tokens, so that the
            // prefetches go out among the arithmetic rather than in one burst ahead of it (8
            // tokens of SmolLM2 Q4_1 from memory, one thread: 78-83 G multiply-adds/s in one
            // burst, 84-86 in pieces; Q8_0 53 against 59; the 12-layer MoE's pp512 305 against
            // 318 t/s, 8 sequences' decode of SmolLM2 707 against 746, medians of alternating
            // runs). A group of 8 tokens sends half its pieces before it and half after.
            //
            // Tokens go 8 at a time through one group (then 4, then the rest): each unpacked
            // weight register serves twice the tokens of a group of 4, with 8 independent
            // `vpdpbusd` chains. On a Zen 5, one thread, 1536 x 576 in L2, 8 tokens: Q4_1 groups
            // 211-221 -> 230-237 G multiply-adds/s, Q8_0 196-202 -> 211-212; 64 tokens Q4_1
            // 238-240 -> 251-257; Q4_K / Q6_K (1536 x 2048) 236-240 / 214-220 -> 245-248 /
            // 224-230. `hearth bench SmolLM2 -p 0 -n 64 --parallel 8 -d 16`, 6 alternating pairs,
            // 5 faster: median 1282 -> 1320 t/s.
            let span = LANES * w.stride;
            let share = span.div_ceil(n_chunks).next_multiple_of(64);
            let from = c0 / F::CHUNK * share;
            let to = (from + share).min(span);
            let next = base.wrapping_add(2 * span);
            let piece = if one {
                share
            } else {
                share.div_ceil(nt.div_ceil(4)).next_multiple_of(64)
            };
            if one {
                prefetch_l2(next, from, to);
                tc.load(&rows, end, c0 * F::WB, cn * F::WB);
                F::one_token(tc, cn, c0, a[0], q1, &mut acc[0], &mut accm[0]);
                c0 += cn;
                continue;
            }
            if GROUPED {
                F::load_groups(&groups, c0, cn, p);
            } else {
                F::load_pack(tc, &rows, end, c0, cn, p);
            }
            let qc = if hoist {
                &q[c0 / F::CHUNK * nt..][..nt]
            } else {
                for j in 0..nt {
                    F::prep(a[j].add(c0 * F::AB), cn, &mut q[j]);
                }
                &q[..nt]
            };
            let mut j = 0;
            while j < nt {
                let t = match nt - j {
                    1..=3 => nt - j,
                    4..=7 => 4,
                    _ => 8,
                };
                let f = (from + j / 4 * piece).min(to);
                let e = (from + (j + t).div_ceil(4) * piece).min(to);
                let mid = (f + (e - f) / 2).next_multiple_of(64).min(e);
                prefetch_l2(next, f, mid);
                match t {
                    1 => group::<F, 1>(p, cn, c0, &a, qc, j, acc, accm),
                    2 => group::<F, 2>(p, cn, c0, &a, qc, j, acc, accm),
                    3 => group::<F, 3>(p, cn, c0, &a, qc, j, acc, accm),
                    4 => group::<F, 4>(p, cn, c0, &a, qc, j, acc, accm),
                    _ => group::<F, 8>(p, cn, c0, &a, qc, j, acc, accm),
                }
                prefetch_l2(next, mid, e);
                j += t;
            }
            c0 += cn;
        }
        if row_stride == 1 {
            // A token's outputs for these rows are consecutive: one (masked) store each, not 16
            // scalar stores (those were ~6% of a 32-token Q4_K call).
            let mask = if nr == LANES { !0 } else { (1u16 << nr) - 1 };
            for j in 0..nt {
                let dst = &mut out[j * tok_stride + r0..j * tok_stride + r0 + nr];
                _mm512_mask_storeu_ps(dst.as_mut_ptr(), mask, F::finish(acc[j], accm[j]));
            }
        } else {
            let mut v = [0f32; LANES];
            for j in 0..nt {
                _mm512_storeu_ps(v.as_mut_ptr(), F::finish(acc[j], accm[j]));
                for (i, x) in v[..nr].iter().enumerate() {
                    out[j * tok_stride + (r0 + i) * row_stride] = *x;
                }
            }
        }
        r0 += nr;
    }
}

/// Prefetches (into L2) the lines of bytes `from..to` after `base`.
#[inline(always)]
unsafe fn prefetch_l2(base: *const u8, from: usize, to: usize) {
    let mut o = from;
    while o < to {
        // `wrapping_add`: a prefetch may point past the buffer; it is never dereferenced.
        _mm_prefetch::<_MM_HINT_T1>(base.wrapping_add(o).cast());
        o += 64;
    }
}

macro_rules! entry {
    ($name:ident, $F:ty, $bs:expr) => {
        entry!($name, $F, $bs, false, "The lanes kernel of one weight type");
    };
    ($name:ident, $F:ty, $bs:expr, $grouped:expr, $what:literal) => {
        #[doc = concat!($what, " (see `crate::traits::MatrixFn`).")]
        ///
        /// # Safety
        /// As `crate::traits::MatrixFn` (grouped rows: whole groups), with AVX-512 F/BW/VL/VNNI
        /// and AVX2/FMA/F16C.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(crate) unsafe fn $name(
            n: usize,
            w: &Rows,
            acts: &[&[u8]],
            out: &mut [f32],
            tok_stride: usize,
            row_stride: usize,
        ) {
            with_scratch(|sc| {
                run::<$F, $grouped>(n / $bs, w, acts, out, tok_stride, row_stride, sc)
            })
        }
    };
}

entry!(q4_0, L<Q4_0>, 32);
entry!(q4_1, L<Q4_1>, 32);
entry!(q5_0, L<Q5_0>, 32);
entry!(q5_1, L<Q5_1>, 32);
entry!(q8_0, L<Q8_0>, 32);
entry!(iq4_nl, L<Iq4Nl>, 32);
entry!(q4_k, K45<false>, 256);
entry!(q5_k, K45<true>, 256);
entry!(q6_k, Q6K, 256);
macro_rules! legacy_grouped {
    ($($name:ident, $W:ty;)*) => {$(
        entry!(
            $name,
            L<$W>,
            32,
            true,
            "Legacy rows interleaved eight at a time (`crate::interleave`): the lanes kernel with \
             each block of 16 rows loaded from its two groups (`Fmt::load_groups`), the same \
             registers as from the file's rows, so the same bits"
        );
    )*};
}

legacy_grouped! {
    q4_0_grouped, Q4_0;
    q4_1_grouped, Q4_1;
    q5_0_grouped, Q5_0;
    q5_1_grouped, Q5_1;
    q8_0_grouped, Q8_0;
    iq4_nl_grouped, Iq4Nl;
}
entry!(
    q6_k_grouped,
    Q6K,
    256,
    true,
    "Q6_K rows interleaved four at a time (`crate::interleave`), two tokens and more: the lanes \
     kernel with each block of 16 rows loaded from its four groups (`Fmt::load_groups`), the same \
     registers as from the file's rows, so the same bits"
);
entry!(
    q4_k_grouped,
    K45<false>,
    256,
    true,
    "Q4_K rows interleaved four at a time (`crate::interleave`), two tokens and more: the lanes \
     kernel with each block of 16 rows loaded from its four groups (`Fmt::load_groups`), the same \
     registers as from the file's rows, so the same bits"
);

/// Rows per interleaved group of a legacy format.
const LEGACY_GROUP: usize = crate::interleave::LEGACY_GROUP_ROWS;

/// Runs `f` on this thread's scratch.
#[inline(always)]
unsafe fn with_scratch(f: impl FnOnce(*mut __m512i)) {
    SCRATCH.with(|sc| {
        let mut sc = sc.borrow_mut();
        if sc.is_empty() {
            sc.resize(SCRATCH_ZMM, _mm512_setzero_si512());
        }
        f(sc.as_mut_ptr())
    })
}

/// Registers of scratch for the unpacked weights, the transposed chunk and the prepared tokens.
const P_ZMM: usize = 96;
const T_ZMM: usize = MAX_DW;
const Q_ZMM: usize = 5 * PASS;
const SCRATCH_ZMM: usize = P_ZMM + T_ZMM + Q_ZMM + 2 * PASS;

thread_local! {
    /// Per-thread scratch (~40 KB), allocated on a thread's first product and reused: zeroing it on
    /// the stack at every call cost more than a decode call's arithmetic.
    static SCRATCH: RefCell<Vec<__m512i>> = const { RefCell::new(Vec::new()) };
}
