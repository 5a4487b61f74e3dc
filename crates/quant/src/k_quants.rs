//! The 256-element "K" super-block formats (`block_q*_K` in ggml-common.h) and their dequantizers,
//! bit-exact with gguf-py and ggml's `dequantize_row_q*_K`.
//!
//! Each super-block holds 16 or 8 sub-blocks with their own small integer scale (and for Q2_K, Q4_K and
//! Q5_K a minimum), themselves scaled by one or two f16 values. The products are computed in the same
//! order as ggml: first `d * scale` (and `dmin * min`) in f32, then times the quant.

use crate::block::{f16_to_f32, impl_block};
use crate::GgmlType;

/// Elements per super-block.
pub const QK_K: usize = 256;

/// Q2_K: 16 sub-blocks of 16; `x = d * (sc & 15) * q - dmin * (sc >> 4)`, q in 0..4.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2K {
    /// Per sub-block: scale in the low nibble, min in the high nibble.
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants: byte `l` of each 32-byte group holds four elements 32 apart.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the scales, f16 LE.
    pub d: [u8; 2],
    /// Super-block scale for the mins, f16 LE.
    pub dmin: [u8; 2],
}
impl_block!(BlockQ2K, GgmlType::Q2_K, QK_K, 84);

/// Q3_K: 16 sub-blocks of 16; `x = d * (sc - 32) * (q - 4 * !hbit)`, 6-bit scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ3K {
    /// High bit of each quant (set means *no* offset of -4).
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of each quant.
    pub qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales, packed (see [`q3k_scales`]).
    pub scales: [u8; 12],
    /// Super-block scale, f16 LE.
    pub d: [u8; 2],
}
impl_block!(BlockQ3K, GgmlType::Q3_K, QK_K, 110);

/// Q4_K: 8 sub-blocks of 32; `x = d * sc * q - dmin * m`, 6-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4K {
    /// Super-block scale for the scales, f16 LE.
    pub d: [u8; 2],
    /// Super-block scale for the mins, f16 LE.
    pub dmin: [u8; 2],
    /// Eight 6-bit scales and eight 6-bit mins, packed (see [`scale_min_k4`]).
    pub scales: [u8; 12],
    /// Nibbles: each 32-byte group holds sub-block 2i in the low and 2i+1 in the high nibbles.
    pub qs: [u8; QK_K / 2],
}
impl_block!(BlockQ4K, GgmlType::Q4_K, QK_K, 144);

/// Q5_K: as Q4_K with a fifth bit per quant in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5K {
    /// Super-block scale for the scales, f16 LE.
    pub d: [u8; 2],
    /// Super-block scale for the mins, f16 LE.
    pub dmin: [u8; 2],
    /// Packed 6-bit scales and mins, as Q4_K.
    pub scales: [u8; 12],
    /// Bit 4 of element `32 * s + l` (sub-block s) at bit s of byte l.
    pub qh: [u8; QK_K / 8],
    /// Low nibbles, as Q4_K.
    pub qs: [u8; QK_K / 2],
}
impl_block!(BlockQ5K, GgmlType::Q5_K, QK_K, 176);

/// Q6_K: 16 sub-blocks of 16; `x = d * sc * (q - 32)`, q in 0..64, i8 scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale, f16 LE.
    pub d: [u8; 2],
}
impl_block!(BlockQ6K, GgmlType::Q6_K, QK_K, 210);

/// Q8_K (activations for the K-quants and IQ4_XS): an f32 scale, 256 i8 and the sums of each 16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8K {
    /// Scale, f32 LE (stored as bytes: a Q8_K block may start at any address).
    pub d: [u8; 4],
    /// Quants.
    pub qs: [i8; QK_K],
    /// Sum of each group of 16 quants, i16 LE.
    pub bsums: [u8; QK_K / 16 * 2],
}
impl_block!(BlockQ8K, GgmlType::Q8_K, QK_K, 292);

impl BlockQ8K {
    /// The scale.
    #[inline]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// Sum of quants `16 * j .. 16 * j + 16`.
    #[inline]
    pub fn bsum(&self, j: usize) -> i16 {
        i16::from_le_bytes([self.bsums[2 * j], self.bsums[2 * j + 1]])
    }
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block (`get_scale_min_k4`): bytes 0..4 hold
/// the low 6 bits of scales 0..4, bytes 4..8 those of mins 0..4; for j >= 4 the low nibble / high
/// nibble of byte j+4 are the low 4 bits and the top 2 bits of bytes j-4 / j are the high bits.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The sixteen 6-bit Q3_K scales (biased by 32): bytes 0..8 give the low nibbles (scales 0..8 in the
/// low nibbles, 8..16 in the high ones), bytes 8..12 two high bits each.
#[inline]
pub fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = if j < 8 { s[j] & 0xf } else { s[j - 8] >> 4 };
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

fn check(nb: usize, out: usize) {
    assert_eq!(nb * QK_K, out, "block count and output length disagree");
}

/// Dequantizes Q2_K blocks.
pub fn dequantize_row_q2_k(blocks: &[BlockQ2K], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let min = f16_to_f32(b.dmin);
        // Element order: for each 128-half n, shift s (0,2,4,6), then two sub-blocks of 16 reading
        // bytes n*32 + 0..16 and n*32 + 16..32.
        let mut is = 0;
        let mut yi = 0;
        for n in 0..QK_K / 128 {
            let q = &b.qs[32 * n..32 * n + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = b.scales[is];
                    is += 1;
                    let dl = d * (sc & 0xf) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for &ql in &q[16 * half..16 * half + 16] {
                        y[yi] = dl * ((ql >> shift) & 3) as f32 - ml;
                        yi += 1;
                    }
                }
            }
        }
    }
}

/// Dequantizes Q3_K blocks.
pub fn dequantize_row_q3_k(blocks: &[BlockQ3K], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d_all = f16_to_f32(b.d);
        let scales = q3k_scales(&b.scales);
        let mut is = 0;
        let mut yi = 0;
        let mut m = 1u8;
        for n in 0..QK_K / 128 {
            let q = &b.qs[32 * n..32 * n + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let dl = d_all * scales[is] as f32;
                    is += 1;
                    for l in 16 * half..16 * half + 16 {
                        let lo = ((q[l] >> shift) & 3) as i8;
                        let off = if b.hmask[l] & m != 0 { 0 } else { 4 };
                        y[yi] = dl * (lo - off) as f32;
                        yi += 1;
                    }
                }
                m = m.wrapping_shl(1);
            }
        }
    }
}

/// Dequantizes Q4_K blocks.
pub fn dequantize_row_q4_k(blocks: &[BlockQ4K], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let min = f16_to_f32(b.dmin);
        for (j, (q, y)) in
            b.qs.chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
        {
            let (sc1, m1) = scale_min_k4(2 * j, &b.scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xf) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// Dequantizes Q5_K blocks.
pub fn dequantize_row_q5_k(blocks: &[BlockQ5K], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let min = f16_to_f32(b.dmin);
        for (j, (q, y)) in
            b.qs.chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
        {
            let (sc1, m1) = scale_min_k4(2 * j, &b.scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
            for l in 0..32 {
                let h1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((q[l] & 0xf) + h1) as f32 - m1;
                y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

/// The 6-bit quant of element `l + 32 * k` (k in 0..4, l in 0..32) of a 128-element half of Q6_K,
/// minus 32. `ql` is the half's 64 low-nibble bytes and `qh` its 32 high-bit bytes.
#[inline]
pub(crate) fn q6(ql: &[u8], qh: &[u8], l: usize, k: usize) -> i8 {
    let lo = match k {
        0 => ql[l] & 0xf,
        1 => ql[l + 32] & 0xf,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    (lo | (((qh[l] >> (2 * k)) & 3) << 4)) as i8 - 32
}

/// Dequantizes Q6_K blocks.
pub fn dequantize_row_q6_k(blocks: &[BlockQ6K], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for n in 0..QK_K / 128 {
            let ql = &b.ql[64 * n..64 * n + 64];
            let qh = &b.qh[32 * n..32 * n + 32];
            let sc = &b.scales[8 * n..8 * n + 8];
            let y = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                for k in 0..4 {
                    y[l + 32 * k] = d * sc[is + 2 * k] as f32 * q6(ql, qh, l, k) as f32;
                }
            }
        }
    }
}

/// Dequantizes Q8_K blocks (`d * q`).
pub fn dequantize_row_q8_k(blocks: &[BlockQ8K], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (v, &q) in y.iter_mut().zip(&b.qs) {
            *v = d * q as f32;
        }
    }
}
