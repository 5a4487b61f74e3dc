//! Weight rows interleaved four at a time, for one-token products that share each scale multiply
//! among the four rows.
//!
//! A Q4_K row is read by a one-row kernel one 32-element sub-block at a time: a `vpmaddubsw` per 32
//! products and a `vpmaddwd` by the sub-block's scale per 32. On a CPU whose integer multiplier
//! takes two cycles per 256-bit instruction (Zen 1) that is the limit of decode. With four rows'
//! super-blocks side by side in memory, one 32-byte load holds 8 quants of each of the four rows,
//! the four `vpmaddubsw` of a sub-block add up in i16 (at most 16 products of a 4-bit quant and an
//! 8-bit activation per word: |16 · 15 · 128| < 2^15), and one `vpmaddwd` multiplies them by the
//! four rows' scales: 5 multiplies per 128 products instead of 8, and one stream from memory instead
//! of four.
//!
//! The interleaved bytes take exactly the room of the rows they replace (a group of four rows of
//! `nb` super-blocks is `4 · nb · 144` bytes either way), so a model rewrites its weights in place
//! after reading them into memory: no second copy. Products see the same integers and the same
//! f32 chain per output as on the file's layout (`acc = fma(d·dy, isum, acc)` per super-block), so
//! their results are the same bits; [`deinterleave`] gives the file's bytes back exactly.
//!
//! Group super-block `b` of rows `4g..4g + 4` (576 bytes):
//!
//! | bytes | holds |
//! |---|---|
//! | 0..8 | `d` of rows 0..3 (f16) |
//! | 8..16 | `dmin` of rows 0..3 (f16) |
//! | 16..48 | the low 4 bits of 64 six-bit values: byte `i` holds value `i` in its low nibble and value `32 + i` in its high one |
//! | 48..64 | their top 2 bits: byte `k` holds those of values `k`, `16 + k`, `32 + k`, `48 + k` at bits 0, 2, 4, 6 |
//! | 64..576 | quants: sub-block `j` at `64 + 64j`, two 32-byte halves `h`, in each 8 bytes per row `r` at `8r`; byte `k` holds element `32j + 16h + k` in its low nibble and `32j + 16h + 8 + k` in its high one |
//!
//! Value `8r + j` is row `r`'s scale `j`, value `32 + 8r + j` its minimum `j`. The order puts rows
//! 0 and 1 in the low 128-bit half of a register and rows 2 and 3 in the high one, where an
//! in-lane byte shuffle spreads a sub-block's four scales over its four rows' products.

use crate::k_quants::scale_min_k4;
use crate::GgmlType;

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 4;

/// Bytes of a Q4_K super-block (one row).
const Q4_K_BLOCK: usize = 144;

/// Bytes of one group super-block: four rows' Q4_K super-blocks.
pub(crate) const Q4_K_GROUP_BLOCK: usize = GROUP_ROWS * Q4_K_BLOCK;

/// Whether rows of `ty` have an interleaved layout (Q4_K).
pub fn has_interleaved(ty: GgmlType) -> bool {
    ty == GgmlType::Q4_K
}

/// Whether a matrix of `rows` rows of `cols` elements of `ty` can be interleaved: a type with an
/// interleaved layout, whole groups of rows and whole super-blocks per row.
pub fn can_interleave(ty: GgmlType, rows: usize, cols: usize) -> bool {
    has_interleaved(ty) && rows % GROUP_ROWS == 0 && cols % ty.block_size() == 0 && cols > 0
}

/// Rewrites `data`, rows of `cols` elements of `ty` back to back (the file's layout), into the
/// interleaved layout in place. `data` must hold whole groups of rows
/// ([`can_interleave`]); otherwise nothing is written and `false` is returned.
pub fn interleave(ty: GgmlType, cols: usize, data: &mut [u8]) -> bool {
    rewrite(ty, cols, data, q4_k_group)
}

/// The inverse of [`interleave`]: the file's bytes back, exactly.
pub fn deinterleave(ty: GgmlType, cols: usize, data: &mut [u8]) -> bool {
    rewrite(ty, cols, data, q4_k_ungroup)
}

/// Applies `f` (four rows of `nb` super-blocks → one group, or back) to each group of `data`.
fn rewrite(ty: GgmlType, cols: usize, data: &mut [u8], f: fn(&[u8], usize, &mut [u8])) -> bool {
    if !has_interleaved(ty) || cols == 0 || cols % ty.block_size() != 0 {
        return false;
    }
    let nb = cols / ty.block_size();
    let group = GROUP_ROWS * nb * ty.type_size();
    if data.len() % group != 0 {
        return false;
    }
    let mut scratch = vec![0u8; group];
    for g in data.chunks_exact_mut(group) {
        f(g, nb, &mut scratch);
        g.copy_from_slice(&scratch);
    }
    true
}

/// The file's rows of one interleaved group `src` (rows of `cols` elements of `ty`, a type with
/// an interleaved layout) into `dst`.
pub(crate) fn ungroup(ty: GgmlType, cols: usize, src: &[u8], dst: &mut [u8]) {
    debug_assert!(has_interleaved(ty));
    q4_k_ungroup(src, cols / ty.block_size(), dst);
}

/// One group of the interleaved layout in `dst`, from four Q4_K rows of `nb` super-blocks in `src`.
fn q4_k_group(src: &[u8], nb: usize, dst: &mut [u8]) {
    let rb = nb * Q4_K_BLOCK;
    for b in 0..nb {
        let o = &mut dst[b * Q4_K_GROUP_BLOCK..(b + 1) * Q4_K_GROUP_BLOCK];
        let x: [&[u8]; GROUP_ROWS] =
            std::array::from_fn(|r| &src[r * rb + b * Q4_K_BLOCK..][..Q4_K_BLOCK]);
        let mut val = [0u8; 64];
        for (r, x) in x.iter().enumerate() {
            o[2 * r..2 * r + 2].copy_from_slice(&x[0..2]);
            o[8 + 2 * r..8 + 2 * r + 2].copy_from_slice(&x[2..4]);
            let q: &[u8; 12] = x[4..16].try_into().expect("12 bytes");
            for j in 0..8 {
                (val[8 * r + j], val[32 + 8 * r + j]) = scale_min_k4(j, q);
            }
        }
        for i in 0..32 {
            o[16 + i] = (val[i] & 15) | ((val[32 + i] & 15) << 4);
        }
        for k in 0..16 {
            o[48 + k] = (val[k] >> 4)
                | (val[16 + k] >> 4) << 2
                | (val[32 + k] >> 4) << 4
                | (val[48 + k] >> 4) << 6;
        }
        for j in 0..8 {
            for h in 0..2 {
                for (r, x) in x.iter().enumerate() {
                    for k in 0..8 {
                        let e = 32 * j + 16 * h + k;
                        o[64 + 64 * j + 32 * h + 8 * r + k] = q4(x, e) | q4(x, e + 8) << 4;
                    }
                }
            }
        }
    }
}

/// Quant `e` of a Q4_K super-block: sub-block `s` in the low (even `s`) or high nibbles of bytes
/// `32 · (s / 2)..`.
fn q4(x: &[u8], e: usize) -> u8 {
    let (s, k) = (e / 32, e % 32);
    let byte = x[16 + 32 * (s / 2) + k];
    if s % 2 == 0 {
        byte & 15
    } else {
        byte >> 4
    }
}

/// Four Q4_K rows in `dst` from one interleaved group in `src` (the inverse of [`q4_k_group`]).
fn q4_k_ungroup(src: &[u8], nb: usize, dst: &mut [u8]) {
    let rb = nb * Q4_K_BLOCK;
    for b in 0..nb {
        let o = &src[b * Q4_K_GROUP_BLOCK..(b + 1) * Q4_K_GROUP_BLOCK];
        let val = |v: usize| (o[16 + v % 32] >> (4 * (v / 32)) & 15) | group_high_bits(o, v) << 4;
        for r in 0..GROUP_ROWS {
            let x = &mut dst[r * rb + b * Q4_K_BLOCK..][..Q4_K_BLOCK];
            x[0..2].copy_from_slice(&o[2 * r..2 * r + 2]);
            x[2..4].copy_from_slice(&o[8 + 2 * r..8 + 2 * r + 2]);
            let sc: [u8; 8] = std::array::from_fn(|j| val(8 * r + j));
            let mn: [u8; 8] = std::array::from_fn(|j| val(32 + 8 * r + j));
            // The packing `scale_min_k4` reads: scales and minimums 0..3 in the low 6 bits of
            // bytes 0..3 and 4..7, 4..7 split into a nibble of bytes 8..11 and the top 2 bits
            // of bytes 0..7.
            for j in 0..4 {
                x[4 + j] = sc[j] | (sc[j + 4] >> 4) << 6;
                x[8 + j] = mn[j] | (mn[j + 4] >> 4) << 6;
                x[12 + j] = (sc[j + 4] & 15) | (mn[j + 4] & 15) << 4;
            }
            for e in 0..256 {
                let (s, k) = (e / 32, e % 32);
                let (h, kk) = (k / 16, k % 16);
                let byte = o[64 + 64 * s + 32 * h + 8 * r + kk % 8];
                let q = if kk < 8 { byte & 15 } else { byte >> 4 };
                let at = 16 + 32 * (s / 2) + k;
                if s % 2 == 0 {
                    x[at] = (x[at] & 0xf0) | q;
                } else {
                    x[at] = (x[at] & 0x0f) | q << 4;
                }
            }
        }
    }
}

/// The top 2 bits of value `v` of a group super-block (bytes 48..64).
fn group_high_bits(o: &[u8], v: usize) -> u8 {
    (o[48 + v % 16] >> (2 * (v / 16))) & 3
}
