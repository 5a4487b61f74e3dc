//! AVX-512 kernels (F, BW, VL, VNNI).
//!
//! - Q4_K, Q5_K, Q6_K: 64 quants per 512-bit step (two 32-element sub-blocks side by side), so a
//!   super-block takes 4 steps instead of 8, with VNNI's `vpdpwssd` applying the sub-block scales
//!   and accumulating in one instruction;
//! - the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): the AVX2 kernels with VNNI's
//!   `vpdpbusd` in place of `vpmaddubsw` + `vpmaddwd` (one instruction, no i16 saturation);
//! - F32, BF16: 16 lanes per load, four FMA chains.
//!
//! Other types return `false` and run the AVX2 kernel: F16 among them, because the 512-bit
//! `vcvtph2ps` version measured slower than AVX2 here (benches/dot_min.rs: 34 vs 49 GB/s). As at every level, each kernel is a tile
//! whose per-activation reduction order does not depend on the tile size.

use std::arch::x86_64::*;

use super::avx2::{
    blocks, f16c, hsum_ps, hsum_ps128, k4_scales_mins, k4_scales_mins64, type0_tile, type1_tile,
    FloatRow, Idot, Type0, Type1,
};
use super::{OutGrid, Rows};
use crate::iq4::BlockIQ4NL;
use crate::k_quants::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use crate::GgmlType;
use std::mem::{size_of, size_of_val};

/// `vpdpbusd` (AVX-512 VNNI on 256-bit registers).
struct Vnni;

impl Idot for Vnni {
    #[inline(always)]
    unsafe fn dot_u8(x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y)
    }
}

#[inline(always)]
unsafe fn hsum512(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    hsum_ps(_mm256_add_ps(lo, hi))
}

#[inline(always)]
unsafe fn load512(p: &[u8]) -> __m512i {
    debug_assert!(p.len() >= 64);
    _mm512_loadu_si512(p.as_ptr().cast())
}

#[inline(always)]
unsafe fn load512i(p: &[i8]) -> __m512i {
    debug_assert!(p.len() >= 64);
    _mm512_loadu_si512(p.as_ptr().cast())
}

#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

#[inline(always)]
unsafe fn srl16(v: __m512i, by: u32) -> __m512i {
    _mm512_srl_epi16(v, _mm_cvtsi32_si128(by as i32))
}

// ---------------------------------------------------------------------------------------------
// Q4_K / Q5_K.

/// The parts of Q4_K and Q5_K the kernel reads.
trait K45 {
    unsafe fn d_dmin(&self) -> (f32, f32);
    fn scales12(&self) -> &[u8; 12];
    fn qs(&self) -> &[u8; 128];
    /// The fifth bits (Q5_K only).
    fn qh(&self) -> Option<&[u8; 32]>;
}

impl K45 for BlockQ4K {
    #[inline(always)]
    unsafe fn d_dmin(&self) -> (f32, f32) {
        (f16c(self.d), f16c(self.dmin))
    }
    #[inline(always)]
    fn scales12(&self) -> &[u8; 12] {
        &self.scales
    }
    #[inline(always)]
    fn qs(&self) -> &[u8; 128] {
        &self.qs
    }
    #[inline(always)]
    fn qh(&self) -> Option<&[u8; 32]> {
        None
    }
}

impl K45 for BlockQ5K {
    #[inline(always)]
    unsafe fn d_dmin(&self) -> (f32, f32) {
        (f16c(self.d), f16c(self.dmin))
    }
    #[inline(always)]
    fn scales12(&self) -> &[u8; 12] {
        &self.scales
    }
    #[inline(always)]
    fn qs(&self) -> &[u8; 128] {
        &self.qs
    }
    #[inline(always)]
    fn qh(&self) -> Option<&[u8; 32]> {
        Some(&self.qh)
    }
}

/// Q4_K / Q5_K × Q8_K: per 64 elements one 512-bit `vpmaddubsw` (sub-block 2k in the low half,
/// 2k+1 in the high half) and one `vpmaddwd` with the two scales; mins through bsums.
#[inline(always)]
unsafe fn k45_tile<W: K45, const N: usize>(x: &[W], a: &[&[BlockQ8K]; N], out: &mut [f32; N]) {
    let nb = x.len();
    for r in a {
        assert_eq!(r.len(), nb);
    }
    let mut acc = [_mm512_setzero_ps(); N];
    let mut acc_m = [_mm_setzero_ps(); N];
    for i in 0..nb {
        let xb = &x[i];
        let (sc, mn) = k4_scales_mins(xb.scales12());
        let (dx, dminx) = xb.d_dmin();
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr().cast()));
        let scales16 =
            _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr().cast())));
        for j in 0..N {
            let y = &a[j][i];
            let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            let prod = _mm_madd_epi16(mins, q8s);
            let dmin = _mm_set1_ps(-(dminx * y.d()));
            acc_m[j] = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(prod), acc_m[j]);
        }
        // A `match`, not `Option::map`: a closure would not inherit this function's target features.
        #[allow(clippy::manual_map)]
        let hbits = match xb.qh() {
            Some(h) => Some(_mm256_loadu_si256(h.as_ptr().cast())),
            None => None,
        };
        let mut sumi = [_mm512_setzero_si512(); N];
        for k in 0..4 {
            let (q, s) = k45_quants(xb, hbits, scales16, k);
            for j in 0..N {
                let y = load512i(&a[j][i].qs[64 * k..]);
                // VNNI `vpdpwssd`: the i16 pair products times the scales, added in one step.
                sumi[j] = _mm512_dpwssd_epi32(sumi[j], _mm512_maddubs_epi16(q, y), s);
            }
        }
        for j in 0..N {
            let d = _mm512_set1_ps(dx * a[j][i].d());
            acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi[j]), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum512(acc[j]) + hsum_ps128(acc_m[j]);
    }
}

/// Elements `64k..64k + 64` of a Q4_K / Q5_K super-block as unsigned quants (sub-block 2k in the
/// low half, 2k+1 in the high half) and, as i16 lanes, their two scales picked from the 8 widened
/// `scales16`.
#[inline(always)]
unsafe fn k45_quants<W: K45>(
    xb: &W,
    hbits: Option<__m256i>,
    scales16: __m512i,
    k: usize,
) -> (__m512i, __m512i) {
    let bits = _mm256_loadu_si256(xb.qs()[32 * k..].as_ptr().cast());
    let mut q = _mm512_and_si512(
        join(bits, _mm256_srli_epi16(bits, 4)),
        _mm512_set1_epi8(0x0f),
    );
    if let Some(h) = hbits {
        let one = _mm256_set1_epi8(1);
        let cnt = _mm_cvtsi32_si128(2 * k as i32);
        let cnt1 = _mm_cvtsi32_si128(2 * k as i32 + 1);
        let hl = _mm256_and_si256(_mm256_srl_epi16(h, cnt), one);
        let hh = _mm256_and_si256(_mm256_srl_epi16(h, cnt1), one);
        q = _mm512_or_si512(q, _mm512_slli_epi16(join(hl, hh), 4));
    }
    let s = _mm512_permutexvar_epi16(
        join(
            _mm256_set1_epi16(2 * k as i16),
            _mm256_set1_epi16(2 * k as i16 + 1),
        ),
        scales16,
    );
    (q, s)
}

/// Q6_K × Q8_K: two 32-element groups per 512-bit step.
/// One 64-element step of a Q6_K super-block half `h` (`b`: its 64 `ql` bytes, `hh`: its `qh` bytes
/// and the same shifted by 2): `m = 0` gives groups 0, 1 (low nibbles, qh bits 0-1 and 2-3), `m = 1`
/// groups 2, 3 (high nibbles, qh bits 4-5 and 6-7), as unsigned quants `q + 32`, with the i16 scales
/// (8 lanes each of `sc[8h + 4m + 0..4]`, from `sc2`: the 16 scales twice).
#[inline(always)]
unsafe fn q6_quants(
    b: __m512i,
    hh: __m512i,
    sc2: __m256i,
    h: usize,
    m: usize,
) -> (__m512i, __m512i) {
    let lo = _mm512_and_si512(srl16(b, 4 * m as u32), _mm512_set1_epi8(0x0f));
    let hi = _mm512_slli_epi16(
        _mm512_and_si512(srl16(hh, 4 * m as u32), _mm512_set1_epi8(3)),
        4,
    );
    let p = (8 * h + 4 * m) as i64;
    let idx = _mm256_set_epi64x(
        (p + 3) * 0x0101_0101_0101_0101,
        (p + 2) * 0x0101_0101_0101_0101,
        (p + 1) * 0x0101_0101_0101_0101,
        p * 0x0101_0101_0101_0101,
    );
    let s = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(sc2, idx));
    (_mm512_or_si512(lo, hi), s)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k<const N: usize>(x: &[BlockQ6K], a: &[&[BlockQ8K]; N], out: &mut [f32; N]) {
    let nb = x.len();
    for r in a {
        assert_eq!(r.len(), nb);
    }
    let m32 = _mm512_set1_epi8(32);
    let mut acc = [_mm512_setzero_ps(); N];
    for i in 0..nb {
        let xb = &x[i];
        let sc = _mm_loadu_si128(xb.scales.as_ptr().cast());
        let sc2 = _mm256_set_m128i(sc, sc);
        let mut sumi = [_mm512_setzero_si512(); N];
        for h in 0..2 {
            let b = load512(&xb.ql[64 * h..]);
            let bh = _mm256_loadu_si256(xb.qh[32 * h..].as_ptr().cast());
            let hh = join(bh, _mm256_srli_epi16(bh, 2));
            for m in 0..2 {
                let (q, s) = q6_quants(b, hh, sc2, h, m);
                for j in 0..N {
                    let y = load512i(&a[j][i].qs[128 * h + 64 * m..]);
                    let d =
                        _mm512_sub_epi16(_mm512_maddubs_epi16(q, y), _mm512_maddubs_epi16(m32, y));
                    sumi[j] = _mm512_dpwssd_epi32(sumi[j], d, s);
                }
            }
        }
        let dx = f16c(xb.d);
        for j in 0..N {
            let d = _mm512_set1_ps(dx * a[j][i].d());
            acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi[j]), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum512(acc[j]);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k<const N: usize>(x: &[BlockQ4K], a: &[&[BlockQ8K]; N], out: &mut [f32; N]) {
    k45_tile::<BlockQ4K, N>(x, a, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_k<const N: usize>(x: &[BlockQ5K], a: &[&[BlockQ8K]; N], out: &mut [f32; N]) {
    k45_tile::<BlockQ5K, N>(x, a, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn type0<W: Type0, const N: usize>(x: &[W], a: &[&[BlockQ8_0]; N], out: &mut [f32; N]) {
    type0_tile::<Vnni, W, N>(x, a, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn type1<W: Type1, const N: usize>(x: &[W], a: &[&[BlockQ8_1]; N], out: &mut [f32; N]) {
    type1_tile::<Vnni, W, N>(x, a, out)
}

// ---------------------------------------------------------------------------------------------
// Float rows: 64 elements per step in four 16-lane FMA chains, the tail in scalar f32.

trait FloatRow512: FloatRow {
    unsafe fn load16(p: *const u8) -> __m512;
}

impl FloatRow512 for super::avx2::F32Row {
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> __m512 {
        _mm512_loadu_ps(p.cast())
    }
}

impl FloatRow512 for super::avx2::Bf16Row {
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> __m512 {
        let v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32(v, 16))
    }
}

#[inline(always)]
unsafe fn float_tile<R: FloatRow512, const N: usize>(
    n: usize,
    w: &[u8],
    a: &[&[u8]; N],
    out: &mut [f32; N],
) {
    assert_eq!(w.len(), n * R::SIZE);
    for r in a {
        assert_eq!(r.len(), n * R::SIZE);
    }
    let mut acc = [[_mm512_setzero_ps(); 4]; N];
    let steps = n / 64;
    for s in 0..steps {
        for c in 0..4 {
            let off = (64 * s + 16 * c) * R::SIZE;
            // Reads end at (64 * steps) * SIZE <= w.len() (asserted above).
            let x = R::load16(w.as_ptr().add(off));
            for j in 0..N {
                let y = R::load16(a[j].as_ptr().add(off));
                acc[j][c] = _mm512_fmadd_ps(x, y, acc[j][c]);
            }
        }
    }
    for j in 0..N {
        let v = _mm512_add_ps(
            _mm512_add_ps(acc[j][0], acc[j][1]),
            _mm512_add_ps(acc[j][2], acc[j][3]),
        );
        let mut s = hsum512(v);
        for e in 64 * steps..n {
            let o = e * R::SIZE;
            s += R::one(&w[o..o + R::SIZE]) * R::one(&a[j][o..o + R::SIZE]);
        }
        out[j] = s;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn f32s<const N: usize>(n: usize, w: &[u8], a: &[&[u8]; N], out: &mut [f32; N]) {
    float_tile::<super::avx2::F32Row, N>(n, w, a, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn bf16s<const N: usize>(n: usize, w: &[u8], a: &[&[u8]; N], out: &mut [f32; N]) {
    float_tile::<super::avx2::Bf16Row, N>(n, w, a, out)
}

/// One matrix pass with the AVX-512 kernels (see `avx2::matrix`); false if `ty` has none.
///
/// # Safety
/// As [`tile`], for every row of `w` (each `wlen` bytes).
pub(super) unsafe fn matrix(
    ty: GgmlType,
    n: usize,
    w: &Rows,
    wlen: usize,
    acts: &[&[u8]],
    g: &mut OutGrid,
) -> bool {
    use super::avx2::{rows_loop, rows_loop_float, rows_n, rows_n_float};
    use GgmlType::*;
    match ty {
        Q4_0 => rows_n!(type0, BlockQ4_0, BlockQ8_0, w, wlen, acts, g),
        Q5_0 => rows_n!(type0, BlockQ5_0, BlockQ8_0, w, wlen, acts, g),
        Q8_0 => rows_n!(type0, BlockQ8_0, BlockQ8_0, w, wlen, acts, g),
        IQ4_NL => rows_n!(type0, BlockIQ4NL, BlockQ8_0, w, wlen, acts, g),
        Q4_1 => rows_n!(type1, BlockQ4_1, BlockQ8_1, w, wlen, acts, g),
        Q5_1 => rows_n!(type1, BlockQ5_1, BlockQ8_1, w, wlen, acts, g),
        Q4_K => rows_n!(q4_k, BlockQ4K, BlockQ8K, w, wlen, acts, g),
        Q5_K => rows_n!(q5_k, BlockQ5K, BlockQ8K, w, wlen, acts, g),
        Q6_K => rows_n!(q6_k, BlockQ6K, BlockQ8K, w, wlen, acts, g),
        F32 => rows_n_float!(f32s, n, w, wlen, acts, g),
        BF16 => rows_n_float!(bf16s, n, w, wlen, acts, g),
        _ => return false,
    }
    true
}

/// Runs the AVX-512 tile for `ty`; returns false if there is none (the caller falls back to AVX2).
///
/// # Safety
/// As `avx2::tile`, and the CPU must have AVX-512 F/BW/VL/VNNI.
pub(super) unsafe fn tile(
    ty: GgmlType,
    n: usize,
    w: &[u8],
    acts: &[&[u8]],
    out: &mut [f32],
) -> bool {
    use super::avx2::{by_n, by_n_float};
    use GgmlType::*;
    match ty {
        Q4_0 => by_n!(type0, blocks::<BlockQ4_0>(w), BlockQ8_0, acts, out),
        Q5_0 => by_n!(type0, blocks::<BlockQ5_0>(w), BlockQ8_0, acts, out),
        Q8_0 => by_n!(type0, blocks::<BlockQ8_0>(w), BlockQ8_0, acts, out),
        IQ4_NL => by_n!(type0, blocks::<BlockIQ4NL>(w), BlockQ8_0, acts, out),
        Q4_1 => by_n!(type1, blocks::<BlockQ4_1>(w), BlockQ8_1, acts, out),
        Q5_1 => by_n!(type1, blocks::<BlockQ5_1>(w), BlockQ8_1, acts, out),
        Q4_K => by_n!(q4_k, blocks(w), BlockQ8K, acts, out),
        Q5_K => by_n!(q5_k, blocks(w), BlockQ8K, acts, out),
        Q6_K => by_n!(q6_k, blocks(w), BlockQ8K, acts, out),
        F32 => by_n_float!(f32s, n, w, acts, out),
        BF16 => by_n_float!(bf16s, n, w, acts, out),
        _ => return false,
    }
    true
}

// ---------------------------------------------------------------------------------------------
// One token, K-quants: a row at a time, for decode.
//
// `lanes` keeps each output's f32 chain per super-block: `acc = fma(d·dy, Σ, acc)` (and for Q4_K /
// Q5_K `accm = fma(dmin·dy, Σmins, accm)`, result `acc - accm`), Σ being exact i32 sums over the
// super-block. These kernels compute the same i32 sums (in vector lanes, reduced per super-block;
// integers are exact in any order) and then run that same f32 chain, so their results equal the
// lanes kernel's bit for bit while reading one row at a time, front to back, which the hardware
// prefetchers follow and which needs no transpose: what decode (one token) wants.

#[inline(always)]
unsafe fn hsum_epi32(v: __m512i) -> i32 {
    _mm512_reduce_add_epi32(v)
}

#[inline(always)]
unsafe fn k45_row<W: K45>(x: &[W], a: &[BlockQ8K]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (xb, y) in x.iter().zip(a) {
        let (sc, mn) = k4_scales_mins(xb.scales12());
        let (dx, dminx) = xb.d_dmin();
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr().cast()));
        let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        let prod = _mm_madd_epi16(mins, q8s);
        let ms = _mm_extract_epi32::<0>(_mm_add_epi32(
            _mm_add_epi32(prod, _mm_srli_si128::<8>(prod)),
            _mm_srli_si128::<4>(_mm_add_epi32(prod, _mm_srli_si128::<8>(prod))),
        ));
        let scales16 =
            _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr().cast())));
        #[allow(clippy::manual_map)]
        let hbits = match xb.qh() {
            Some(h) => Some(_mm256_loadu_si256(h.as_ptr().cast())),
            None => None,
        };
        let mut sumi = _mm512_setzero_si512();
        for k in 0..4 {
            let (q, s) = k45_quants(xb, hbits, scales16, k);
            let yq = load512i(&y.qs[64 * k..]);
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q, yq), s);
        }
        let dy = y.d();
        acc = (dx * dy).mul_add(hsum_epi32(sumi) as f32, acc);
        accm = (dminx * dy).mul_add(ms as f32, accm);
    }
    acc - accm
}

/// One token's Q8_K super-block prepared for [`q4_k_row`]: the quants in the order the weights
/// unpack (two 64-byte loads of `qs`, each giving sub-blocks `4c, 4c + 2` from the low nibbles and
/// `4c + 1, 4c + 3` from the high ones), the 8 sub-block sums as i16 and `d`.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Q4KAct {
    y: [__m512i; 4],
    q8s: __m128i,
    d: f32,
}

#[inline(always)]
unsafe fn q4_k_prep(a: &[BlockQ8K], dst: &mut [Q4KAct]) {
    for (y, p) in a.iter().zip(dst.iter_mut()) {
        let q = |o: usize| _mm256_loadu_si256(y.qs[o..o + 32].as_ptr().cast());
        for c in 0..2 {
            p.y[2 * c] = join(q(128 * c), q(128 * c + 64));
            p.y[2 * c + 1] = join(q(128 * c + 32), q(128 * c + 96));
        }
        let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        p.q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        p.d = y.d();
    }
}

/// Q4_K × one prepared token: the integers and the f32 chain of `k45_row` (so of the lanes
/// kernel), with two 64-byte loads per super-block and the scales spread by in-lane shuffles.
#[inline(always)]
unsafe fn q4_k_row(x: &[BlockQ4K], a: &[Q4KAct]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    let m4 = _mm512_set1_epi8(0x0f);
    // i16 lanes 0..16 take scale `lo`, lanes 16..32 scale `hi` (bytes 2s, 2s + 1 of each lane).
    let idx = |lo: i16, hi: i16| {
        // Each i16 lane picks bytes [2s, 2s + 1] of its 128-bit lane.
        let (l, h) = (
            _mm_set1_epi16((2 * lo) | ((2 * lo + 1) << 8)),
            _mm_set1_epi16((2 * hi) | ((2 * hi + 1) << 8)),
        );
        let lh = _mm512_castsi128_si512(l);
        let lh = _mm512_inserti32x4::<1>(lh, l);
        let lh = _mm512_inserti32x4::<2>(lh, h);
        _mm512_inserti32x4::<3>(lh, h)
    };
    let ix = [idx(0, 2), idx(1, 3), idx(4, 6), idx(5, 7)];
    for (xb, y) in x.iter().zip(a) {
        let (sc, mn) = k4_scales_mins64(&xb.scales);
        let (dx, dminx) = xb.d_dmin();
        let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
        let mut sumi = _mm512_setzero_si512();
        for c in 0..2 {
            let w = load512(&xb.qs[64 * c..]);
            let lo = _mm512_and_si512(w, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
            let slo = _mm512_shuffle_epi8(sc, ix[2 * c]);
            let shi = _mm512_shuffle_epi8(sc, ix[2 * c + 1]);
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(lo, y.y[2 * c]), slo);
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(hi, y.y[2 * c + 1]), shi);
        }
        let ms = _mm_madd_epi16(mins, y.q8s);
        let v8 = _mm256_add_epi32(
            _mm512_castsi512_si256(sumi),
            _mm512_extracti64x4_epi64::<1>(sumi),
        );
        let v4 = _mm_add_epi32(_mm256_castsi256_si128(v8), _mm256_extracti128_si256(v8, 1));
        let h = _mm_hadd_epi32(v4, ms);
        let h = _mm_hadd_epi32(h, h);
        let (si, mi) = (_mm_cvtsi128_si32(h), _mm_extract_epi32::<1>(h));
        acc = (dx * y.d).mul_add(si as f32, acc);
        accm = (dminx * y.d).mul_add(mi as f32, accm);
    }
    acc - accm
}

/// Q6_K × Q8_K: the integers and the f32 chain of the lanes kernel; the `- 32` of the quants
/// comes out through the activation's 16-element sums (`32 * sum(scale * bsum)`).
#[inline(always)]
unsafe fn q6_k_row(x: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    let m4 = _mm512_set1_epi8(0x0f);
    let m2 = _mm512_set1_epi8(3);
    // 128-bit lane L of step (h, m) takes scale 8h + 4m + L, as 8 i16 lanes.
    let ix: [__m512i; 4] = std::array::from_fn(|g| {
        let b = 4 * g as i16;
        _mm512_set_epi16(
            b + 3,
            b + 3,
            b + 3,
            b + 3,
            b + 3,
            b + 3,
            b + 3,
            b + 3,
            b + 2,
            b + 2,
            b + 2,
            b + 2,
            b + 2,
            b + 2,
            b + 2,
            b + 2,
            b + 1,
            b + 1,
            b + 1,
            b + 1,
            b + 1,
            b + 1,
            b + 1,
            b + 1,
            b,
            b,
            b,
            b,
            b,
            b,
            b,
            b,
        )
    });
    for (xb, y) in x.iter().zip(a) {
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb.scales.as_ptr().cast()));
        let corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256(y.bsums.as_ptr().cast()));
        let sc = _mm512_castsi256_si512(sc16);
        let mut sumi = _mm512_setzero_si512();
        for h in 0..2 {
            let b = load512(&xb.ql[64 * h..]);
            let bh = _mm256_loadu_si256(xb.qh[32 * h..].as_ptr().cast());
            let hh = join(bh, _mm256_srli_epi16(bh, 2));
            for m in 0..2 {
                let lo = _mm512_and_si512(srl16(b, 4 * m as u32), m4);
                let hi = _mm512_slli_epi16(_mm512_and_si512(srl16(hh, 4 * m as u32), m2), 4);
                let q = _mm512_or_si512(lo, hi);
                let s = _mm512_permutexvar_epi16(ix[2 * h + m], sc);
                let yq = load512i(&y.qs[128 * h + 64 * m..]);
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q, yq), s);
            }
        }
        let v8 = _mm256_add_epi32(
            _mm512_castsi512_si256(sumi),
            _mm512_extracti64x4_epi64::<1>(sumi),
        );
        let v8 = _mm256_sub_epi32(v8, _mm256_slli_epi32(corr, 5));
        let v4 = _mm_add_epi32(_mm256_castsi256_si128(v8), _mm256_extracti128_si256(v8, 1));
        let h = _mm_hadd_epi32(v4, v4);
        let h = _mm_hadd_epi32(h, h);
        acc = (f16c(xb.d) * y.d()).mul_add(_mm_cvtsi128_si32(h) as f32, acc);
    }
    acc
}

thread_local! {
    /// Per-thread prepared activation for [`q4_k_row`], grown on first use and reused.
    static Q4K_ACT: std::cell::RefCell<Vec<Q4KAct>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_rows(w: &Rows, a: &[u8], out: &mut [f32], row_stride: usize) {
    let a: &[BlockQ8K] = blocks(a);
    let nb = a.len();
    Q4K_ACT.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < nb {
            p.resize(nb, std::mem::zeroed());
        }
        let p = &mut p[..nb];
        q4_k_prep(a, p);
        for i in 0..w.count {
            let x: &[BlockQ4K] =
                blocks(&w.data[i * w.stride..i * w.stride + nb * size_of::<BlockQ4K>()]);
            out[i * row_stride] = q4_k_row(x, p);
        }
    })
}

macro_rules! k_rows {
    ($name:ident, $body:expr, $W:ty) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $name(w: &Rows, a: &[u8], out: &mut [f32], row_stride: usize) {
            let a: &[BlockQ8K] = blocks(a);
            for i in 0..w.count {
                let x: &[$W] = blocks(
                    &w.data[i * w.stride
                        ..i * w.stride + size_of_val(a) / size_of::<BlockQ8K>() * size_of::<$W>()],
                );
                out[i * row_stride] = $body(x, a);
            }
        }
    };
}

k_rows!(q5_k_rows, k45_row::<BlockQ5K>, BlockQ5K);
k_rows!(q6_k_rows, q6_k_row, BlockQ6K);

/// Every row of `w` against one activation row `a` (Q8_K) for the K-quants, bit-identical to the
/// `lanes` kernel (see above): element `i` goes to `out[i * row_stride]`. False for other types.
///
/// # Safety
/// As `lanes::matrix` with one activation row.
pub(super) unsafe fn k_rows_one_token(
    ty: GgmlType,
    w: &Rows,
    a: &[u8],
    out: &mut [f32],
    row_stride: usize,
) -> bool {
    match ty {
        GgmlType::Q4_K => q4_k_rows(w, a, out, row_stride),
        GgmlType::Q5_K => q5_k_rows(w, a, out, row_stride),
        GgmlType::Q6_K => q6_k_rows(w, a, out, row_stride),
        _ => return false,
    }
    true
}
