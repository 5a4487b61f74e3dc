//! AVX-512 kernels (F, BW, VL, VNNI) outside the register-blocked ones of `lanes.rs`: one token
//! through Q4_K, Q5_K, Q6_K, a row at a time (decode; see below).

use std::arch::x86_64::*;

use super::avx2::{blocks, f16c, k4_scales_mins, k4_scales_mins64, K45};
use super::ymm::rows::ahead;
use super::Rows;
use crate::k_quants::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use std::mem::{size_of, size_of_val};

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

// ---------------------------------------------------------------------------------------------
// One token, K-quants: a row at a time, for decode.
//
// `lanes` keeps each output's f32 chain per super-block: `acc = fma(d·dy, Σ, acc)` (and for Q4_K /
// Q5_K `accm = fma(dmin·dy, Σmins, accm)`, result `acc - accm`), Σ being exact i32 sums over the
// super-block. These kernels compute the same i32 sums (in vector lanes, reduced per super-block;
// integers are exact in any order) and then run that same f32 chain, so their results equal the
// lanes kernel's bit for bit while reading one row at a time, front to back, which needs no
// transpose: what decode (one token) wants. The hardware prefetchers alone did not keep a thread's
// stream from memory fed on an Intel Xeon (the 12-layer MoE's decode from the mapped file, whose
// rows these kernels read, `hearth bench --load mmap -p 0 -n 64`: 16.8 / 17.0 / 16.8 t/s); with
// `ahead`'s prefetches into L1 and L2, 30.9 / 30.1 / 32.2.

#[inline(always)]
unsafe fn hsum_epi32(v: __m512i) -> i32 {
    _mm512_reduce_add_epi32(v)
}

#[inline(always)]
unsafe fn k45_row<W: K45>(x: &[W], a: &[BlockQ8K]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (xb, y) in x.iter().zip(a) {
        ahead(xb);
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
        ahead(xb);
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
        ahead(xb);
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

/// One token through Q4_K rows (see `crate::traits::MatrixFn`; `acts` holds one row).
///
/// # Safety
/// As `crate::traits::MatrixFn`, with AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn q4_k_rows(
    _n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    _tok_stride: usize,
    row_stride: usize,
) {
    debug_assert_eq!(acts.len(), 1);
    let a: &[BlockQ8K] = blocks(acts[0]);
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
        /// One token through rows of one K-quant (see `crate::traits::MatrixFn`; `acts` holds one
        /// row).
        ///
        /// # Safety
        /// As `crate::traits::MatrixFn`, with AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(crate) unsafe fn $name(
            _n: usize,
            w: &Rows,
            acts: &[&[u8]],
            out: &mut [f32],
            _tok_stride: usize,
            row_stride: usize,
        ) {
            debug_assert_eq!(acts.len(), 1);
            let a: &[BlockQ8K] = blocks(acts[0]);
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
