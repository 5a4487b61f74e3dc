//! Small AVX2 / F16C helpers the kernels of `ymm/`, `lanes.rs` and `avx512.rs` share.

use std::arch::x86_64::*;

use crate::block::{cast_blocks, Block};
use crate::k_quants::{BlockQ4K, BlockQ5K};

pub(super) fn blocks<B: Block>(src: &[u8]) -> &[B] {
    cast_blocks(src).expect("row lengths checked by the dispatcher")
}

/// Horizontal sum of 8 f32 lanes in a fixed order.
#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
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

/// The parts of Q4_K and Q5_K the one-row kernels read (AVX2 and AVX-512).
pub(crate) trait K45: Block {
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
