//! The 4-bit non-linear formats IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of 256 with 6-bit
//! sub-block scales): each nibble indexes the [`KVALUES_IQ4NL`] table instead of being a linear level.

use crate::block::{f16_to_f32, impl_block};
use crate::GgmlType;

/// The IQ4 levels (`kvalues_iq4nl` in ggml-common.h).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Elements per IQ4_NL block.
pub const QK4_NL: usize = 32;

/// IQ4_NL: `x = d * KVALUES[q]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ4NL {
    /// Scale, f16 LE.
    pub d: [u8; 2],
    /// Nibbles: low = element j, high = element j + 16.
    pub qs: [u8; QK4_NL / 2],
}
impl_block!(BlockIQ4NL, GgmlType::IQ4_NL, QK4_NL, 18);

/// IQ4_XS: 8 sub-blocks of 32, `x = d * (ls - 32) * KVALUES[q]` with 6-bit `ls`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ4XS {
    /// Scale, f16 LE.
    pub d: [u8; 2],
    /// High 2 bits of the 8 sub-block scales (u16 LE, 2 bits each).
    pub scales_h: [u8; 2],
    /// Low 4 bits of the 8 sub-block scales (2 per byte, low nibble first).
    pub scales_l: [u8; 4],
    /// Nibbles: 16 bytes per sub-block, low = element j, high = element j + 16.
    pub qs: [u8; 128],
}
impl_block!(BlockIQ4XS, GgmlType::IQ4_XS, 256, 136);

impl BlockIQ4XS {
    /// The 6-bit scale of sub-block `ib` (0..8), still biased by 32.
    #[inline]
    pub fn ls(&self, ib: usize) -> i32 {
        let h = u16::from_le_bytes(self.scales_h);
        let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
        let hi = ((h >> (2 * ib)) & 3) as u8;
        (lo | (hi << 4)) as i32
    }
}

/// Dequantizes IQ4_NL blocks.
pub fn dequantize_row_iq4_nl(blocks: &[BlockIQ4NL], out: &mut [f32]) {
    assert_eq!(
        blocks.len() * QK4_NL,
        out.len(),
        "block count and output length disagree"
    );
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_NL)) {
        let d = f16_to_f32(b.d);
        for j in 0..QK4_NL / 2 {
            y[j] = d * KVALUES_IQ4NL[(b.qs[j] & 0xf) as usize] as f32;
            y[j + QK4_NL / 2] = d * KVALUES_IQ4NL[(b.qs[j] >> 4) as usize] as f32;
        }
    }
}

/// Dequantizes IQ4_XS blocks.
pub fn dequantize_row_iq4_xs(blocks: &[BlockIQ4XS], out: &mut [f32]) {
    assert_eq!(
        blocks.len() * 256,
        out.len(),
        "block count and output length disagree"
    );
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = f16_to_f32(b.d);
        for (ib, (qs, y)) in
            b.qs.chunks_exact(16)
                .zip(y.chunks_exact_mut(32))
                .enumerate()
        {
            let dl = d * (b.ls(ib) - 32) as f32;
            for j in 0..16 {
                y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as f32;
                y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}
