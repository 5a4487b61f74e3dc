//! The 256-element formats on 8 lanes: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS, one super-block
//! per chunk.
//!
//! Each super-block unpacks into 64 registers of 8-bit quants (register `k` holds elements
//! `4k..4k + 4` of every row) and per-lane integer scales. Per token and super-block:
//! - `tot = Σ_g sc_g · Σ_{k in g} q_k · y_k` over the scale groups (32 elements for Q4_K, Q5_K and
//!   IQ4_XS, 16 for the others), exact in i32: products of small quants are added as i16 first
//!   (as many as cannot overflow), then `vpmaddwd` / `vpdpwssd` applies the scale;
//! - the minimums (Q2_K, Q4_K, Q5_K) through the activation's sums of 16 or 32 elements:
//!   `ms = Σ_g m_g · bsum_g`; the offset of Q3_K's and Q6_K's stored quants the same way, folded
//!   into `tot`;
//! - the f32 chain `acc = fma(d·dy, tot, acc)` (and `accm = fma(dmin·dy, ms, accm)`, output
//!   `acc - accm`), that of `lanes.rs` for Q4_K, Q5_K and Q6_K, so every SIMD set agrees.

use std::arch::x86_64::*;

use super::{bcast, bcast_f, halves_f32, low_f32, nib_hi, nib_lo, run, Dp, Fmt, TChunk, LANES};
use crate::iq4::KVALUES_IQ4NL;

/// Q8_K: `d` (f32) at 0, 256 quants at 4, 16 i16 sums of 16 quants at 260.
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

/// An unpacked super-block of 8 rows: 64 registers of quants, per-group scales as i16 pairs
/// `[s, s]` (or, for IQ4_XS on VNNI, i32), the minimum (or offset) multipliers as i16 pairs of
/// consecutive groups, and the two f32 scales.
pub(crate) struct KP {
    q: [__m256i; 64],
    sc: [__m256i; 16],
    mn: [__m256i; 8],
    d: __m256,
    dmin: __m256,
}

impl KP {
    /// A super-block of zeros, to be packed into.
    pub(super) fn zeroed() -> Self {
        // SAFETY: registers and f32 vectors, valid for any bit pattern.
        unsafe { std::mem::zeroed() }
    }
}

/// `tot[t] += Σ_g sc[g] · Σ_{k < K} q[K g + k] · y_t[K g + k]` over the `64 / K` groups of `K`
/// registers, `G` products added as i16 before each `vpmaddwd` (`G` divides `K`).
#[inline(always)]
unsafe fn scaled<D: Dp, const T: usize, const K: usize, const G: usize>(
    p: &KP,
    a: &[*const u8; T],
    tot: &mut [__m256i; T],
) {
    for g in 0..64 / K {
        for part in 0..K / G {
            let mut x = [_mm256_setzero_si256(); T];
            for i in 0..G {
                let k = K * g + G * part + i;
                let w = p.q[k];
                for t in 0..T {
                    let m = _mm256_maddubs_epi16(w, bcast(a[t].add(Q8K_QS + 4 * k)));
                    x[t] = if i == 0 { m } else { _mm256_add_epi16(x[t], m) };
                }
            }
            for t in 0..T {
                tot[t] = D::madd_acc(tot[t], x[t], p.sc[g]);
            }
        }
    }
}

/// [`scaled`] over two super-blocks of 8 rows at once (`p[0]`, `p[1]`: 16 rows): each activation
/// broadcast meets both, each quant register the `T` tokens, so a product costs `(2 + T) / 2T`
/// register loads instead of `1 + 1 / T` (Zen 3 loads two 256-bit registers a cycle and runs two
/// `vpmaddubsw`). The same exact i16 and i32 sums per (row, token) as [`scaled`].
#[inline(always)]
pub(super) unsafe fn scaled_wide<D: Dp, const T: usize, const K: usize, const G: usize>(
    p: [&KP; 2],
    a: &[*const u8; T],
    tot: &mut [[__m256i; T]; 2],
) {
    for g in 0..64 / K {
        for part in 0..K / G {
            let k0 = K * g + G * part;
            let mut x = [[_mm256_setzero_si256(); T]; 2];
            for t in 0..T {
                let y = bcast(a[t].add(Q8K_QS + 4 * k0));
                for h in 0..2 {
                    x[h][t] = _mm256_maddubs_epi16(p[h].q[k0], y);
                }
            }
            // A loop LLVM does not unroll: unrolled, it computes the sums (rows, token) by
            // (rows, token), each with its own broadcasts and the quants reloaded, the loads this
            // order exists to save. Here the sums stay in registers from one `k` to the next.
            let gn = std::hint::black_box(G);
            for i in 1..gn {
                let k = k0 + i;
                for t in 0..T {
                    let y = bcast(a[t].add(Q8K_QS + 4 * k));
                    for h in 0..2 {
                        x[h][t] = _mm256_add_epi16(x[h][t], _mm256_maddubs_epi16(p[h].q[k], y));
                    }
                }
            }
            for h in 0..2 {
                for t in 0..T {
                    tot[h][t] = D::madd_acc(tot[h][t], x[h][t], p[h].sc[g]);
                }
            }
        }
    }
}

/// `v[t] = Σ_{p < N} mn[p] · (i16 pair p of the token's sums at `off`)` as i32.
#[inline(always)]
unsafe fn pair_sums<D: Dp, const T: usize, const N: usize>(
    mn: &[__m256i; 8],
    a: &[*const u8; T],
    off: usize,
) -> [__m256i; T] {
    let mut v = [_mm256_setzero_si256(); T];
    for (pr, m) in mn.iter().enumerate().take(N) {
        for t in 0..T {
            v[t] = D::madd_acc(v[t], *m, bcast(a[t].add(off + 4 * pr)));
        }
    }
    v
}

/// The i16 pair `[b, b]` for each byte `b` of `v` at byte `i` (`SIGNED`: sign-extended).
#[inline(always)]
unsafe fn byte_pair<const SIGNED: bool>(v: __m256i, i: usize) -> __m256i {
    let c = _mm_cvtsi32_si128(24 - 8 * i as i32);
    let s = if SIGNED {
        _mm256_srai_epi32(_mm256_sll_epi32(v, c), 24)
    } else {
        _mm256_srli_epi32(_mm256_sll_epi32(v, c), 24)
    };
    _mm256_or_si256(
        _mm256_and_si256(s, _mm256_set1_epi32(0xffff)),
        _mm256_slli_epi32(s, 16),
    )
}

/// i16 pairs of consecutive bytes of `v`: `[b0, b1]` and `[b2, b3]` (unsigned bytes).
#[inline(always)]
unsafe fn byte_pairs(v: __m256i) -> (__m256i, __m256i) {
    let even = _mm256_set1_epi32(0x00ff_00ff);
    let low = _mm256_set1_epi32(0xffff);
    let e = _mm256_and_si256(v, even); // (b0, b2)
    let o = _mm256_and_si256(_mm256_srli_epi32(v, 8), even); // (b1, b3)
    (
        _mm256_or_si256(_mm256_and_si256(e, low), _mm256_slli_epi32(o, 16)),
        _mm256_or_si256(_mm256_srli_epi32(e, 16), _mm256_andnot_si256(low, o)),
    )
}

/// i16 pairs of consecutive signed bytes of `v`: `[b0, b1]` and `[b2, b3]`.
#[inline(always)]
unsafe fn byte_pairs_signed(v: __m256i) -> (__m256i, __m256i) {
    let lo16 = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8); // (b0, b2) as i16
    let hi16 = _mm256_srai_epi16(v, 8); // (b1, b3)
    let low = _mm256_set1_epi32(0xffff);
    (
        _mm256_or_si256(_mm256_and_si256(lo16, low), _mm256_slli_epi32(hi16, 16)),
        _mm256_or_si256(_mm256_srli_epi32(lo16, 16), _mm256_andnot_si256(low, hi16)),
    )
}

/// Where the dwords of one super-block of 8 rows come from (lane `r`: row `r`).
pub(crate) trait Src {
    /// The dwords at byte offsets `off`, `off + 4`, `off + 8`, `off + 12` (`off` a multiple of 4).
    unsafe fn dw4(&self, off: usize) -> [__m256i; 4];
    /// The 8 dwords from byte offset `off` (a multiple of 4).
    unsafe fn dw8(&self, off: usize) -> [__m256i; 8];
}

// Loops, not `std::array::from_fn`: its closure does not inherit the kernel's target features,
// and was compiled as an out-of-line function calling the intrinsics of `TChunk::dw`.
impl Src for TChunk {
    #[inline(always)]
    unsafe fn dw4(&self, off: usize) -> [__m256i; 4] {
        let mut d = [_mm256_setzero_si256(); 4];
        for (k, d) in d.iter_mut().enumerate() {
            *d = self.dw(off + 4 * k);
        }
        d
    }
    #[inline(always)]
    unsafe fn dw8(&self, off: usize) -> [__m256i; 8] {
        let mut d = [_mm256_setzero_si256(); 8];
        for (k, d) in d.iter_mut().enumerate() {
            *d = self.dw(off + 4 * k);
        }
        d
    }
}

/// The 8 rows themselves at byte offset `off`, transposed in registers by 16- and 32-byte loads:
/// one token through a format whose blocks are whole such loads needs no [`TChunk`] (its stores
/// and reloads were a fifth of the instructions of a Q4_K decode call).
pub(crate) struct Direct<'a> {
    rows: &'a [*const u8; LANES],
    off: usize,
}

impl Src for Direct<'_> {
    #[inline(always)]
    unsafe fn dw4(&self, off: usize) -> [__m256i; 4] {
        super::load_t4(self.rows, self.off + off)
    }
    #[inline(always)]
    unsafe fn dw8(&self, off: usize) -> [__m256i; 8] {
        super::load_t8(self.rows, self.off + off)
    }
}

/// A K-quant's unpacking and its integer form.
pub(crate) trait KQuant: Sized {
    const WB: usize;
    /// Whether the format has a minimum (a second chain).
    const MIN: bool;
    /// Whether [`KQuant::one_direct`] exists (see [`Fmt::DIRECT`]).
    const DIRECT: bool = false;
    /// The scales into `p`, then [`KQuant::one`], read straight from the rows at byte `off`.
    unsafe fn one_direct<D: Dp>(
        _rows: &[*const u8; LANES],
        _off: usize,
        _p: &mut KP,
        _a: *const u8,
    ) -> [__m256i; 2] {
        // Only called where `DIRECT` is true (a constant), and every such format overrides it.
        unreachable!("one_direct of a K-quant without DIRECT")
    }
    /// The scales (`sc`, `mn`, `d`, `dmin`) of the super-block.
    unsafe fn scales(src: &TChunk, p: &mut KP);
    /// The 64 quant registers (`q[k]`: elements `4k..4k + 4` of every row), unpacked in the
    /// format's own loop order (a loop over `k` that splits `k` does not unroll).
    unsafe fn quants(src: &TChunk, q: &mut [__m256i; 64]);
    /// `(tot, ms)` of one token straight from the transposed chunk (the scales already in `p`):
    /// the integers of [`KQuant::sums`], without storing and reloading the 64 registers.
    unsafe fn one<D: Dp>(src: &TChunk, p: &KP, a: *const u8) -> [__m256i; 2];
    /// `(tot, ms)` of `T` tokens against the super-block's scales `p` and quants `q`.
    unsafe fn sums<D: Dp, const T: usize>(p: &KP, a: &[*const u8; T]) -> [[__m256i; T]; 2];
    /// Whether [`KQuant::sums_wide`] exists.
    const WIDE: bool = false;
    /// [`KQuant::sums`] of two super-blocks of 8 rows at once (see [`scaled_wide`]): the same
    /// integers for each.
    unsafe fn sums_wide<D: Dp, const T: usize>(
        _p: [&KP; 2],
        _a: &[*const u8; T],
    ) -> [[[__m256i; T]; 2]; 2] {
        // Only called where `WIDE` is true (a constant), and every such format overrides it.
        unreachable!("sums_wide of a K-quant without WIDE")
    }
}

/// A K-quant on 8 lanes.
pub(crate) struct K<W>(std::marker::PhantomData<W>);

impl<W: KQuant> Fmt for K<W> {
    const BS: usize = 256;
    const WB: usize = W::WB;
    const AB: usize = Q8K_BYTES;
    const CHUNK: usize = 1;
    type P = KP;
    type Q = ();

    #[inline(always)]
    unsafe fn pack<D: Dp>(src: &TChunk, _cn: usize, p: &mut KP) {
        W::scales(src, p);
        W::quants(src, &mut p.q);
    }

    #[inline(always)]
    unsafe fn prep(_a: *const u8, _q: &mut ()) {}

    #[inline(always)]
    unsafe fn step<D: Dp, const T: usize>(
        p: &KP,
        _b: usize,
        a: &[*const u8; T],
        _q: &[*const (); T],
        acc: &mut [__m256; T],
        accm: &mut [__m256; T],
    ) {
        Self::chain::<D, T>(p, W::sums::<D, T>(p, a), a, acc, accm)
    }

    #[inline(always)]
    unsafe fn one_token<D: Dp>(
        src: &TChunk,
        cn: usize,
        p: &mut KP,
        a: *const u8,
        _q: *const (),
        acc: &mut __m256,
        accm: &mut __m256,
    ) {
        debug_assert_eq!(cn, 1);
        W::scales(src, p);
        let [tot, ms] = W::one::<D>(src, p, a);
        let (mut ac, mut am) = ([*acc], [*accm]);
        Self::chain::<D, 1>(p, [[tot], [ms]], &[a], &mut ac, &mut am);
        (*acc, *accm) = (ac[0], am[0]);
    }

    const DIRECT: bool = W::DIRECT;

    #[inline(always)]
    unsafe fn one_token_direct<D: Dp>(
        rows: &[*const u8; LANES],
        off: usize,
        p: &mut KP,
        a: *const u8,
        acc: &mut __m256,
        accm: &mut __m256,
    ) {
        let [tot, ms] = W::one_direct::<D>(rows, off, p, a);
        let (mut ac, mut am) = ([*acc], [*accm]);
        Self::chain::<D, 1>(p, [[tot], [ms]], &[a], &mut ac, &mut am);
        (*acc, *accm) = (ac[0], am[0]);
    }

    #[inline(always)]
    unsafe fn finish(acc: __m256, accm: __m256) -> __m256 {
        if W::MIN {
            _mm256_sub_ps(acc, accm)
        } else {
            acc
        }
    }
}

impl<W: KQuant> K<W> {
    /// The f32 chain of one super-block from its integer sums.
    #[inline(always)]
    pub(super) unsafe fn chain<D: Dp, const T: usize>(
        p: &KP,
        [tot, ms]: [[__m256i; T]; 2],
        a: &[*const u8; T],
        acc: &mut [__m256; T],
        accm: &mut [__m256; T],
    ) {
        for t in 0..T {
            let dy = bcast_f(a[t].cast::<f32>());
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(p.d, dy), _mm256_cvtepi32_ps(tot[t]), acc[t]);
            if W::MIN {
                accm[t] = _mm256_fmadd_ps(
                    _mm256_mul_ps(p.dmin, dy),
                    _mm256_cvtepi32_ps(ms[t]),
                    accm[t],
                );
            }
        }
    }
}

/// One token's activation dword at quant register `k`.
#[inline(always)]
unsafe fn y1(a: *const u8, k: usize) -> __m256i {
    bcast(a.add(Q8K_QS + 4 * k))
}

/// `acc + madd(Σ maddubs(w[i], y[i]), s)`: `N` products added as i16 first.
#[inline(always)]
unsafe fn group1<D: Dp, const N: usize>(
    acc: __m256i,
    w: &[__m256i; N],
    y: &[__m256i; N],
    s: __m256i,
) -> __m256i {
    let mut x = _mm256_maddubs_epi16(w[0], y[0]);
    for i in 1..N {
        x = _mm256_add_epi16(x, _mm256_maddubs_epi16(w[i], y[i]));
    }
    D::madd_acc(acc, x, s)
}

pub(crate) struct Q2K;
pub(crate) struct Q3K;
pub(crate) struct Q4K;
pub(crate) struct Q5K;
pub(crate) struct Q6K;
pub(crate) struct Iq4Xs;

/// The scales and minimums of a Q4_K / Q5_K block from its first four dwords (`d`/`dmin` and the
/// 12 packed scale bytes), as `avx2::k4_scales_mins` in every lane.
#[inline(always)]
unsafe fn k45_scales<S: Src>(src: &S, p: &mut KP) {
    let [d, u0, u1, u2] = src.dw4(0);
    (p.d, p.dmin) = halves_f32(d);
    let m6 = _mm256_set1_epi32(0x3f3f_3f3f);
    let m4 = _mm256_set1_epi32(0x0f0f_0f0f);
    let m2 = _mm256_set1_epi32(0x0303_0303);
    let sc_lo = _mm256_and_si256(u0, m6);
    let sc_hi = _mm256_or_si256(
        _mm256_and_si256(u2, m4),
        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), m2), 4),
    );
    let mn_lo = _mm256_and_si256(u1, m6);
    let mn_hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi32(u2, 4), m4),
        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), m2), 4),
    );
    for s in 0..4 {
        p.sc[s] = byte_pair::<false>(sc_lo, s);
        p.sc[s + 4] = byte_pair::<false>(sc_hi, s);
    }
    (p.mn[0], p.mn[1]) = byte_pairs(mn_lo);
    (p.mn[2], p.mn[3]) = byte_pairs(mn_hi);
}

impl KQuant for Q4K {
    const WB: usize = 144;
    const MIN: bool = true;

    #[inline(always)]
    unsafe fn scales(src: &TChunk, p: &mut KP) {
        k45_scales(src, p);
    }

    /// `qs` (at 16) dword `t` of 64-element group `c` holds sub-block `2c` (low nibbles) and
    /// `2c + 1` (high nibbles).
    #[inline(always)]
    unsafe fn quants(src: &TChunk, q: &mut [__m256i; 64]) {
        for c in 0..4 {
            for t in 0..8 {
                let g = src.dw(16 + 32 * c + 4 * t);
                q[16 * c + t] = nib_lo(g);
                q[16 * c + 8 + t] = nib_hi(g);
            }
        }
    }

    #[inline(always)]
    unsafe fn sums<D: Dp, const T: usize>(p: &KP, a: &[*const u8; T]) -> [[__m256i; T]; 2] {
        let mut tot = [_mm256_setzero_si256(); T];
        // 8 products of 4-bit quants: at most 8 * 2 * 15 * 127 < 2^15.
        scaled::<D, T, 8, 8>(p, a, &mut tot);
        [tot, k45_mins::<D, T>(p, a)]
    }

    const WIDE: bool = true;

    #[inline(always)]
    unsafe fn sums_wide<D: Dp, const T: usize>(
        p: [&KP; 2],
        a: &[*const u8; T],
    ) -> [[[__m256i; T]; 2]; 2] {
        let mut tot = [[_mm256_setzero_si256(); T]; 2];
        scaled_wide::<D, T, 8, 8>(p, a, &mut tot);
        [
            [tot[0], k45_mins::<D, T>(p[0], a)],
            [tot[1], k45_mins::<D, T>(p[1], a)],
        ]
    }

    #[inline(always)]
    unsafe fn one<D: Dp>(src: &TChunk, p: &KP, a: *const u8) -> [__m256i; 2] {
        q4k_one::<D, TChunk>(src, p, a)
    }

    /// 144 bytes: one 16-byte load (`d`, `dmin`, scales) and four 32-byte ones (`qs`) per row.
    const DIRECT: bool = true;

    #[inline(always)]
    unsafe fn one_direct<D: Dp>(
        rows: &[*const u8; LANES],
        off: usize,
        p: &mut KP,
        a: *const u8,
    ) -> [__m256i; 2] {
        let src = Direct { rows, off };
        k45_scales(&src, p);
        q4k_one::<D, Direct>(&src, p, a)
    }
}

/// [`KQuant::one`] of Q4_K from either source.
#[inline(always)]
unsafe fn q4k_one<D: Dp, S: Src>(src: &S, p: &KP, a: *const u8) -> [__m256i; 2] {
    let mut tot = _mm256_setzero_si256();
    for c in 0..4 {
        let g = src.dw8(16 + 32 * c);
        let mut lo = [_mm256_setzero_si256(); 8];
        let mut hi = [_mm256_setzero_si256(); 8];
        let mut yl = [_mm256_setzero_si256(); 8];
        let mut yh = [_mm256_setzero_si256(); 8];
        for t in 0..8 {
            (lo[t], hi[t]) = (nib_lo(g[t]), nib_hi(g[t]));
            (yl[t], yh[t]) = (y1(a, 16 * c + t), y1(a, 16 * c + 8 + t));
        }
        tot = group1::<D, 8>(tot, &lo, &yl, p.sc[2 * c]);
        tot = group1::<D, 8>(tot, &hi, &yh, p.sc[2 * c + 1]);
    }
    [tot, k45_mins::<D, 1>(p, &[a])[0]]
}

/// `Σ_s m_s · sum(y over sub-block s)` for Q4_K / Q5_K: the 16-element sums added in pairs.
#[inline(always)]
unsafe fn k45_mins<D: Dp, const T: usize>(p: &KP, a: &[*const u8; T]) -> [__m256i; T] {
    let mut v = [_mm256_setzero_si256(); T];
    for t in 0..T {
        let bs = _mm256_loadu_si256(a[t].add(Q8K_BSUMS).cast());
        let q8s = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
        // Dword p of q8s: the sums of sub-blocks 2p and 2p + 1.
        let q8s = _mm256_broadcastsi128_si256(q8s);
        for (pr, m) in p.mn.iter().enumerate().take(4) {
            let y = _mm256_shuffle_epi32::<0>(_mm256_srli_si256_var(q8s, pr));
            v[t] = D::madd_acc(v[t], *m, y);
        }
    }
    v
}

/// `v` shifted right by `4 i` bytes within each 128-bit lane (`i` < 4).
#[inline(always)]
unsafe fn _mm256_srli_si256_var(v: __m256i, i: usize) -> __m256i {
    match i {
        0 => v,
        1 => _mm256_srli_si256::<4>(v),
        2 => _mm256_srli_si256::<8>(v),
        _ => _mm256_srli_si256::<12>(v),
    }
}

impl KQuant for Q5K {
    const WB: usize = 176;
    const MIN: bool = true;

    #[inline(always)]
    unsafe fn scales(src: &TChunk, p: &mut KP) {
        k45_scales(src, p);
    }

    /// As Q4_K with `qs` at 48 and the fifth bit of sub-block `s` at bit `s` of the `qh` byte (at
    /// 16) of the element's position within its 32.
    #[inline(always)]
    unsafe fn quants(src: &TChunk, q: &mut [__m256i; 64]) {
        let one = _mm256_set1_epi8(1);
        for c in 0..4 {
            for t in 0..8 {
                let g = src.dw(48 + 32 * c + 4 * t);
                let h = src.dw(16 + 4 * t);
                let hl =
                    _mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * c as i32)), one);
                let hh = _mm256_and_si256(
                    _mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * c as i32 + 1)),
                    one,
                );
                q[16 * c + t] = _mm256_or_si256(nib_lo(g), _mm256_slli_epi32(hl, 4));
                q[16 * c + 8 + t] = _mm256_or_si256(nib_hi(g), _mm256_slli_epi32(hh, 4));
            }
        }
    }

    #[inline(always)]
    unsafe fn sums<D: Dp, const T: usize>(p: &KP, a: &[*const u8; T]) -> [[__m256i; T]; 2] {
        let mut tot = [_mm256_setzero_si256(); T];
        // 5-bit quants: 4 products per i16 sum (4 * 2 * 31 * 127 < 2^15).
        scaled::<D, T, 8, 4>(p, a, &mut tot);
        [tot, k45_mins::<D, T>(p, a)]
    }

    #[inline(always)]
    unsafe fn one<D: Dp>(src: &TChunk, p: &KP, a: *const u8) -> [__m256i; 2] {
        let one = _mm256_set1_epi8(1);
        let mut tot = _mm256_setzero_si256();
        for c in 0..4 {
            let mut lo = [_mm256_setzero_si256(); 8];
            let mut hi = [_mm256_setzero_si256(); 8];
            let mut yl = [_mm256_setzero_si256(); 8];
            let mut yh = [_mm256_setzero_si256(); 8];
            for t in 0..8 {
                let g = src.dw(48 + 32 * c + 4 * t);
                let h = src.dw(16 + 4 * t);
                let hl =
                    _mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * c as i32)), one);
                let hh = _mm256_and_si256(
                    _mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * c as i32 + 1)),
                    one,
                );
                lo[t] = _mm256_or_si256(nib_lo(g), _mm256_slli_epi32(hl, 4));
                hi[t] = _mm256_or_si256(nib_hi(g), _mm256_slli_epi32(hh, 4));
                (yl[t], yh[t]) = (y1(a, 16 * c + t), y1(a, 16 * c + 8 + t));
            }
            // 5-bit quants: four products per i16 sum.
            for (x, y, s) in [(&lo, &yl, 2 * c), (&hi, &yh, 2 * c + 1)] {
                let (w0, y0) = ([x[0], x[1], x[2], x[3]], [y[0], y[1], y[2], y[3]]);
                let (w1, y1) = ([x[4], x[5], x[6], x[7]], [y[4], y[5], y[6], y[7]]);
                tot = group1::<D, 4>(tot, &w0, &y0, p.sc[s]);
                tot = group1::<D, 4>(tot, &w1, &y1, p.sc[s]);
            }
        }
        [tot, k45_mins::<D, 1>(p, &[a])[0]]
    }
}

impl KQuant for Q6K {
    const WB: usize = 210;
    const MIN: bool = false;

    /// `scales[16]` (i8) at 192, `d` at 208.
    #[inline(always)]
    unsafe fn scales(src: &TChunk, p: &mut KP) {
        p.d = low_f32(src.dw(208));
        for g in 0..4 {
            let s4 = src.dw(192 + 4 * g);
            for k in 0..4 {
                p.sc[4 * g + k] = byte_pair::<true>(s4, k);
            }
            (p.mn[2 * g], p.mn[2 * g + 1]) = byte_pairs_signed(s4);
        }
    }

    /// `ql[128]` at 0, `qh[64]` at 128; register `32h + 8g + t` holds elements `128h + 32g + 4t..`
    /// as `q + 32` (0..63): the low nibbles (`g` < 2) or high nibbles of `ql` dword
    /// `16h + 8(g % 2) + t`, bits `2g..2g + 2` of `qh` dword `8h + t` on top. The 32 comes back
    /// out through the activation's 16-element sums.
    #[inline(always)]
    unsafe fn quants(src: &TChunk, q: &mut [__m256i; 64]) {
        let m4 = _mm256_set1_epi8(0x0f);
        let m2 = _mm256_set1_epi8(0x03);
        for h in 0..2 {
            for t in 0..8 {
                let qh = src.dw(128 + 32 * h + 4 * t);
                for half in 0..2 {
                    let ql = src.dw(64 * h + 32 * half + 4 * t);
                    let lo = [_mm256_and_si256(ql, m4), nib_hi(ql)];
                    for (nib, lo) in lo.into_iter().enumerate() {
                        let g = 2 * nib + half;
                        let hb = _mm256_and_si256(
                            _mm256_srl_epi32(qh, _mm_cvtsi32_si128(2 * g as i32)),
                            m2,
                        );
                        q[32 * h + 8 * g + t] = _mm256_or_si256(lo, _mm256_slli_epi32(hb, 4));
                    }
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn sums<D: Dp, const T: usize>(p: &KP, a: &[*const u8; T]) -> [[__m256i; T]; 2] {
        let mut tot = [_mm256_setzero_si256(); T];
        // 6-bit quants: 2 products per i16 sum (2 * 2 * 63 * 127 < 2^15).
        scaled::<D, T, 4, 2>(p, a, &mut tot);
        let ms = pair_sums::<D, T, 8>(&p.mn, a, Q8K_BSUMS);
        for t in 0..T {
            tot[t] = _mm256_sub_epi32(tot[t], _mm256_slli_epi32(ms[t], 5));
        }
        [tot, [_mm256_setzero_si256(); T]]
    }

    #[inline(always)]
    unsafe fn one<D: Dp>(src: &TChunk, p: &KP, a: *const u8) -> [__m256i; 2] {
        let m4 = _mm256_set1_epi8(0x0f);
        let m2 = _mm256_set1_epi8(0x03);
        let mut tot = _mm256_setzero_si256();
        for h in 0..2 {
            for t in 0..8 {
                let qh = src.dw(128 + 32 * h + 4 * t);
                let ql = [src.dw(64 * h + 4 * t), src.dw(64 * h + 32 + 4 * t)];
                for g in 0..4 {
                    let lo = if g < 2 {
                        _mm256_and_si256(ql[g], m4)
                    } else {
                        nib_hi(ql[g - 2])
                    };
                    let hb =
                        _mm256_and_si256(_mm256_srl_epi32(qh, _mm_cvtsi32_si128(2 * g as i32)), m2);
                    let q = _mm256_or_si256(lo, _mm256_slli_epi32(hb, 4));
                    // Register 32h + 8g + t, in scale group 8h + 2g + t / 4.
                    let m = _mm256_maddubs_epi16(q, y1(a, 32 * h + 8 * g + t));
                    tot = D::madd_acc(tot, m, p.sc[8 * h + 2 * g + t / 4]);
                }
            }
        }
        let ms = pair_sums::<D, 1, 8>(&p.mn, &[a], Q8K_BSUMS)[0];
        [
            _mm256_sub_epi32(tot, _mm256_slli_epi32(ms, 5)),
            _mm256_setzero_si256(),
        ]
    }
}

impl KQuant for Q2K {
    const WB: usize = 84;
    const MIN: bool = true;

    /// `scales[16]` at 0: the scale in the low nibble, the minimum in the high one, per 16
    /// elements; `d`, `dmin` at 80.
    #[inline(always)]
    unsafe fn scales(src: &TChunk, p: &mut KP) {
        (p.d, p.dmin) = halves_f32(src.dw(80));
        let m4 = _mm256_set1_epi8(0x0f);
        for g in 0..4 {
            let s4 = src.dw(4 * g);
            let sc = _mm256_and_si256(s4, m4);
            for k in 0..4 {
                p.sc[4 * g + k] = byte_pair::<false>(sc, k);
            }
            (p.mn[2 * g], p.mn[2 * g + 1]) =
                byte_pairs(_mm256_and_si256(_mm256_srli_epi32(s4, 4), m4));
        }
    }

    /// `qs[64]` at 16: element `128n + 32j + 4t + i` is bits `2j..2j + 2` of byte `4t + i` of the
    /// 32 quant bytes of half `n`; register `32n + 8j + t`.
    #[inline(always)]
    unsafe fn quants(src: &TChunk, q: &mut [__m256i; 64]) {
        let m3 = _mm256_set1_epi8(3);
        for n in 0..2 {
            for t in 0..8 {
                let b = src.dw(16 + 32 * n + 4 * t);
                q[32 * n + t] = _mm256_and_si256(b, m3);
                q[32 * n + 8 + t] = _mm256_and_si256(_mm256_srli_epi32(b, 2), m3);
                q[32 * n + 16 + t] = _mm256_and_si256(_mm256_srli_epi32(b, 4), m3);
                q[32 * n + 24 + t] = _mm256_and_si256(_mm256_srli_epi32(b, 6), m3);
            }
        }
    }

    #[inline(always)]
    unsafe fn sums<D: Dp, const T: usize>(p: &KP, a: &[*const u8; T]) -> [[__m256i; T]; 2] {
        let mut tot = [_mm256_setzero_si256(); T];
        scaled::<D, T, 4, 4>(p, a, &mut tot);
        [tot, pair_sums::<D, T, 8>(&p.mn, a, Q8K_BSUMS)]
    }

    #[inline(always)]
    unsafe fn one<D: Dp>(src: &TChunk, p: &KP, a: *const u8) -> [__m256i; 2] {
        let mut q = [_mm256_setzero_si256(); 64];
        Self::quants(src, &mut q);
        [
            one_groups4::<D>(&q, p, a),
            pair_sums::<D, 1, 8>(&p.mn, &[a], Q8K_BSUMS)[0],
        ]
    }
}

/// `Σ_g sc[g] · Σ_{k < 4} q[4g + k] · y[4g + k]` for one token (Q2_K, Q3_K: 16-element groups of
/// quants below 8, four products per i16 sum).
#[inline(always)]
unsafe fn one_groups4<D: Dp>(q: &[__m256i; 64], p: &KP, a: *const u8) -> __m256i {
    let mut tot = _mm256_setzero_si256();
    for g in 0..16 {
        let k0 = 4 * g;
        let w = [q[k0], q[k0 + 1], q[k0 + 2], q[k0 + 3]];
        let y = [y1(a, k0), y1(a, k0 + 1), y1(a, k0 + 2), y1(a, k0 + 3)];
        tot = group1::<D, 4>(tot, &w, &y, p.sc[g]);
    }
    tot
}

impl KQuant for Q3K {
    const WB: usize = 110;
    const MIN: bool = false;

    /// 12 bytes of 6-bit scales at 96 (as `k_quants::q3k_scales`, minus 32), `d` at 108.
    #[inline(always)]
    unsafe fn scales(src: &TChunk, p: &mut KP) {
        p.d = low_f32(src.dw(108));
        let (a0, a1, tt) = (src.dw(96), src.dw(100), src.dw(104));
        let m4 = _mm256_set1_epi32(0x0f0f_0f0f);
        let m2 = _mm256_set1_epi32(0x0303_0303);
        let u = [
            _mm256_or_si256(
                _mm256_and_si256(a0, m4),
                _mm256_slli_epi32(_mm256_and_si256(tt, m2), 4),
            ),
            _mm256_or_si256(
                _mm256_and_si256(a1, m4),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(tt, 2), m2), 4),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32(a0, 4), m4),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(tt, 4), m2), 4),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32(a1, 4), m4),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(tt, 6), m2), 4),
            ),
        ];
        for (g, ug) in u.iter().enumerate() {
            let s = _mm256_sub_epi8(*ug, _mm256_set1_epi8(32));
            for k in 0..4 {
                p.sc[4 * g + k] = byte_pair::<true>(s, k);
            }
            (p.mn[2 * g], p.mn[2 * g + 1]) = byte_pairs_signed(s);
        }
    }

    /// `hmask[32]` at 0, `qs[64]` at 32: as Q2_K, plus 4 where bit `4n + j` of the `hmask` byte
    /// is set (`q + 4`, 0..7); the 4 comes back out through the activation's 16-element sums.
    #[inline(always)]
    unsafe fn quants(src: &TChunk, q: &mut [__m256i; 64]) {
        let m3 = _mm256_set1_epi8(3);
        let one = _mm256_set1_epi8(1);
        for n in 0..2 {
            for t in 0..8 {
                let b = src.dw(32 + 32 * n + 4 * t);
                let hm = src.dw(4 * t);
                for j in 0..4 {
                    let lo =
                        _mm256_and_si256(_mm256_srl_epi32(b, _mm_cvtsi32_si128(2 * j as i32)), m3);
                    let hb = _mm256_and_si256(
                        _mm256_srl_epi32(hm, _mm_cvtsi32_si128((4 * n + j) as i32)),
                        one,
                    );
                    q[32 * n + 8 * j + t] = _mm256_or_si256(lo, _mm256_slli_epi32(hb, 2));
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn sums<D: Dp, const T: usize>(p: &KP, a: &[*const u8; T]) -> [[__m256i; T]; 2] {
        let mut tot = [_mm256_setzero_si256(); T];
        scaled::<D, T, 4, 4>(p, a, &mut tot);
        let ms = pair_sums::<D, T, 8>(&p.mn, a, Q8K_BSUMS);
        for t in 0..T {
            tot[t] = _mm256_sub_epi32(tot[t], _mm256_slli_epi32(ms[t], 2));
        }
        [tot, [_mm256_setzero_si256(); T]]
    }

    #[inline(always)]
    unsafe fn one<D: Dp>(src: &TChunk, p: &KP, a: *const u8) -> [__m256i; 2] {
        let mut q = [_mm256_setzero_si256(); 64];
        Self::quants(src, &mut q);
        let tot = one_groups4::<D>(&q, p, a);
        let ms = pair_sums::<D, 1, 8>(&p.mn, &[a], Q8K_BSUMS)[0];
        [
            _mm256_sub_epi32(tot, _mm256_slli_epi32(ms, 2)),
            _mm256_setzero_si256(),
        ]
    }
}

impl KQuant for Iq4Xs {
    const WB: usize = 136;
    const MIN: bool = false;

    /// `d` at 0, `scales_h` (u16) at 2, `scales_l[4]` at 4; scales `ls - 32` per 32 elements, as
    /// i16 pairs (`sc[0..8]`) and i32 (`sc[8..16]`, for VNNI's per-sub-block product).
    #[inline(always)]
    unsafe fn scales(src: &TChunk, p: &mut KP) {
        let d0 = src.dw(0);
        p.d = low_f32(d0);
        let sh = _mm256_srli_epi32(d0, 16);
        let sl = src.dw(4);
        for ib in 0..8 {
            let lo = _mm256_and_si256(
                _mm256_srl_epi32(sl, _mm_cvtsi32_si128(4 * ib as i32)),
                _mm256_set1_epi32(0xf),
            );
            let hi = _mm256_and_si256(
                _mm256_srl_epi32(sh, _mm_cvtsi32_si128(2 * ib as i32)),
                _mm256_set1_epi32(3),
            );
            let ls = _mm256_sub_epi32(
                _mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)),
                _mm256_set1_epi32(32),
            );
            p.sc[ib] = _mm256_or_si256(
                _mm256_and_si256(ls, _mm256_set1_epi32(0xffff)),
                _mm256_slli_epi32(ls, 16),
            );
            p.sc[8 + ib] = ls;
        }
    }

    /// `qs[128]` at 8: sub-block `ib`'s 16 bytes give elements `32 ib + j` (low nibbles) and
    /// `32 ib + 16 + j` (high), each an index into the (signed) IQ4 levels.
    #[inline(always)]
    unsafe fn quants(src: &TChunk, q: &mut [__m256i; 64]) {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        for ib in 0..8 {
            for t in 0..4 {
                let g = src.dw(8 + 16 * ib + 4 * t);
                q[8 * ib + t] = _mm256_shuffle_epi8(table, nib_lo(g));
                q[8 * ib + 4 + t] = _mm256_shuffle_epi8(table, nib_hi(g));
            }
        }
    }

    #[inline(always)]
    unsafe fn sums<D: Dp, const T: usize>(p: &KP, a: &[*const u8; T]) -> [[__m256i; T]; 2] {
        [iq4xs_sums::<D, T>(&p.q, p, a), [_mm256_setzero_si256(); T]]
    }

    #[inline(always)]
    unsafe fn one<D: Dp>(src: &TChunk, p: &KP, a: *const u8) -> [__m256i; 2] {
        let mut q = [_mm256_setzero_si256(); 64];
        Self::quants(src, &mut q);
        [iq4xs_sums::<D, 1>(&q, p, &[a])[0], _mm256_setzero_si256()]
    }
}

/// IQ4_XS's `tot` for quants `q` (products as `|q| · sign(y, q)`).
#[inline(always)]
unsafe fn iq4xs_sums<D: Dp, const T: usize>(
    q: &[__m256i; 64],
    p: &KP,
    a: &[*const u8; T],
) -> [__m256i; T] {
    {
        let mut tot = [_mm256_setzero_si256(); T];
        for ib in 0..8 {
            if D::VNNI {
                let mut is = [[_mm256_setzero_si256(); T]; 2];
                for k in 0..8 {
                    let w = q[8 * ib + k];
                    let aw = _mm256_sign_epi8(w, w);
                    for t in 0..T {
                        let y = bcast(a[t].add(Q8K_QS + 32 * ib + 4 * k));
                        is[k % 2][t] = D::dp(is[k % 2][t], aw, _mm256_sign_epi8(y, w));
                    }
                }
                for t in 0..T {
                    let s = _mm256_add_epi32(is[0][t], is[1][t]);
                    tot[t] = _mm256_add_epi32(tot[t], _mm256_mullo_epi32(s, p.sc[8 + ib]));
                }
            } else {
                // |q| · sign(y, q) pairs reach 2 * 127 * 127: one `vpmaddwd` per product.
                for k in 0..8 {
                    let w = q[8 * ib + k];
                    let aw = _mm256_sign_epi8(w, w);
                    for t in 0..T {
                        let y = bcast(a[t].add(Q8K_QS + 32 * ib + 4 * k));
                        let m = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(y, w));
                        tot[t] = D::madd_acc(tot[t], m, p.sc[ib]);
                    }
                }
            }
        }
        tot
    }
}

super::entries!(run, K<Q2K>, q2_k, q2_k_vnni, q2_k_avx512);
super::entries!(run, K<Q3K>, q3_k, q3_k_vnni, q3_k_avx512);
super::entries!(run, K<Q4K>, q4_k, q4_k_vnni);
super::entries!(run, K<Q5K>, q5_k, q5_k_vnni);
super::entries!(run, K<Q6K>, q6_k, q6_k_vnni);
super::entries!(run, K<Iq4Xs>, iq4_xs, iq4_xs_vnni, iq4_xs_avx512);
