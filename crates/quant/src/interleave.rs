//! Weight rows interleaved in groups (four rows of Q4_K / Q6_K, eight of the legacy formats), for
//! one-token products that read each register once and, for the K-quants, share each scale
//! multiply among the four rows.
//!
//! A Q4_K row is read by a one-row kernel one 32-element sub-block at a time: a `vpmaddubsw` per 32
//! products and a `vpmaddwd` by the sub-block's scale per 32. On a CPU whose integer multiplier
//! takes two cycles per 256-bit instruction (Zen 1) that is the limit of decode. With four rows'
//! super-blocks side by side in memory, one 32-byte load holds 8 quants of each of the four rows,
//! the four `vpmaddubsw` of a sub-block add up in i16 (at most 16 products of a 4-bit quant and an
//! 8-bit activation per word: |16 · 15 · 128| < 2^15), and one `vpmaddwd` multiplies them by the
//! four rows' scales: 5 multiplies per 128 products instead of 8, and one stream from memory instead
//! of four. Q6_K's sub-blocks are 16 elements: two `vpmaddubsw` add up in i16 (8 products of a
//! 6-bit quant per word: |8 · 63 · 128| < 2^15) before one `vpmaddwd`, 3 multiplies per 64
//! products instead of 4.
//!
//! The interleaved bytes take exactly the room of the rows they replace (a group of four rows of
//! `nb` super-blocks is `4 · nb · 144` bytes either way, `4 · nb · 210` for Q6_K), so a model
//! rewrites its weights in place after reading them into memory: no second copy. Products see the
//! same integers and the same f32 chain per output as on the file's layout (`acc = fma(d·dy, isum,
//! acc)` per super-block), so their results are the same bits; [`deinterleave`] gives the file's
//! bytes back exactly.
//!
//! Q4_K group super-block `b` of rows `4g..4g + 4` (576 bytes):
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
//!
//! Q6_K group super-block (840 bytes), with the same placement of rows in a register:
//!
//! | bytes | holds |
//! |---|---|
//! | 0..8 | `d` of rows 0..3 (f16) |
//! | 8..72 | scales (i8): byte `16G + 4r + i` is row `r`'s scale of sub-block `4G + i` |
//! | 72..840 | quants (six-bit, unsigned as stored): elements `32c..32c + 32` at `72 + 96c`, in three 32-byte parts, 8 bytes per row `r` at `8r`; byte `k` of part 0 holds the low 4 bits of element `32c + k` (low nibble) and `32c + 8 + k` (high), of part 1 those of `32c + 16 + k` and `32c + 24 + k`, and of part 2 the top 2 bits of `32c + k`, `32c + 8 + k`, `32c + 16 + k`, `32c + 24 + k` at bits 0, 2, 4, 6 |
//!
//! The legacy formats of 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) group **8** rows,
//! laid out as the 8-lane kernels of `simd::ymm::legacy` hold them in registers, so a one-token
//! product loads each register once instead of transposing 16-byte windows of 8 rows (SmolLM2's
//! Q4_1 and Q8_0 matrices). Group block `b` of rows `8g..8g + 8` is the 8 rows' blocks `b`, in
//! the same bytes as in the file:
//!
//! | bytes | holds |
//! |---|---|
//! | 0..16 | `d` of rows 0..7 (f16) |
//! | 16..32 | type 1 (Q4_1, Q5_1): `m` of rows 0..7 (f16) |
//! | then 32 bytes per dword `k` of the block after its header | dword `k` of rows 0..7 (Q5's `qh` is dword 0, the quants follow) |

use crate::k_quants::scale_min_k4;
use crate::GgmlType;

/// Rows per interleaved group of the K-quants (Q4_K, Q6_K); see [`group_rows`].
pub const GROUP_ROWS: usize = 4;

/// Rows per interleaved group of the legacy 32-element formats.
pub const LEGACY_GROUP_ROWS: usize = 8;

/// Bytes of a Q4_K super-block (one row).
const Q4_K_BLOCK: usize = 144;

/// Bytes of one group super-block: four rows' Q4_K super-blocks.
pub(crate) const Q4_K_GROUP_BLOCK: usize = GROUP_ROWS * Q4_K_BLOCK;

/// Bytes of a Q6_K super-block (one row).
const Q6_K_BLOCK: usize = 210;

/// Bytes of one group super-block: four rows' Q6_K super-blocks.
pub(crate) const Q6_K_GROUP_BLOCK: usize = GROUP_ROWS * Q6_K_BLOCK;

/// Offset of the quants in a Q6_K group super-block (after four `d` and 64 scales).
pub(crate) const Q6_K_GROUP_QUANTS: usize = 72;

/// Whether rows of `ty` have an interleaved layout (Q4_K, Q6_K and the legacy formats).
pub fn has_interleaved(ty: GgmlType) -> bool {
    group_rows(ty) > 0
}

/// Rows per interleaved group of `ty`: 4 (Q4_K, Q6_K), 8 (legacy formats), 0 (no layout).
pub fn group_rows(ty: GgmlType) -> usize {
    use GgmlType::*;
    match ty {
        Q4_K | Q6_K => GROUP_ROWS,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL => LEGACY_GROUP_ROWS,
        _ => 0,
    }
}

/// Whether a matrix of `rows` rows of `cols` elements of `ty` can be interleaved: a type with an
/// interleaved layout, whole groups of rows and whole super-blocks per row.
pub fn can_interleave(ty: GgmlType, rows: usize, cols: usize) -> bool {
    has_interleaved(ty) && rows % group_rows(ty) == 0 && cols % ty.block_size() == 0 && cols > 0
}

/// The one-group rewrites of `ty`: (file → interleaved, interleaved → file).
type GroupFn = fn(&[u8], usize, &mut [u8]);

fn group_fns(ty: GgmlType) -> Option<(GroupFn, GroupFn)> {
    use GgmlType::*;
    match ty {
        Q4_K => Some((q4_k_group, q4_k_ungroup)),
        Q6_K => Some((q6_k_group, q6_k_ungroup)),
        Q4_0 | IQ4_NL => Some((legacy_group::<2, 18>, legacy_ungroup::<2, 18>)),
        Q4_1 => Some((legacy_group::<4, 20>, legacy_ungroup::<4, 20>)),
        Q5_0 => Some((legacy_group::<2, 22>, legacy_ungroup::<2, 22>)),
        Q5_1 => Some((legacy_group::<4, 24>, legacy_ungroup::<4, 24>)),
        Q8_0 => Some((legacy_group::<2, 34>, legacy_ungroup::<2, 34>)),
        _ => None,
    }
}

/// Rewrites `data`, rows of `cols` elements of `ty` back to back (the file's layout), into the
/// interleaved layout in place. `data` must hold whole groups of rows
/// ([`can_interleave`]); otherwise nothing is written and `false` is returned.
pub fn interleave(ty: GgmlType, cols: usize, data: &mut [u8]) -> bool {
    group_fns(ty).is_some_and(|(f, _)| rewrite(ty, cols, data, f))
}

/// The inverse of [`interleave`]: the file's bytes back, exactly.
pub fn deinterleave(ty: GgmlType, cols: usize, data: &mut [u8]) -> bool {
    group_fns(ty).is_some_and(|(_, f)| rewrite(ty, cols, data, f))
}

/// Applies `f` (a group's rows of `nb` blocks → one group, or back) to each group of `data`.
fn rewrite(ty: GgmlType, cols: usize, data: &mut [u8], f: GroupFn) -> bool {
    if cols == 0 || cols % ty.block_size() != 0 {
        return false;
    }
    let nb = cols / ty.block_size();
    let group = group_rows(ty) * nb * ty.type_size();
    if group == 0 || data.len() % group != 0 {
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
    let (_, f) = group_fns(ty).expect("a type with an interleaved layout");
    f(src, cols / ty.block_size(), dst);
}

/// Row `r` (of the whole matrix) of `data`, rows of `cols` elements of `ty` rewritten by
/// [`interleave`], in the file's layout: a lookup of one row, such as a token's embedding, in a
/// matrix the products read interleaved. The row's group is put back into `buf` (grown as needed,
/// so repeated lookups allocate nothing), and the row is returned from it.
///
/// # Panics
/// If `ty` has no interleaved layout, `cols` is not whole blocks, or the group of row `r` is not in
/// `data`.
pub fn interleaved_row<'a>(
    ty: GgmlType,
    cols: usize,
    data: &[u8],
    r: usize,
    buf: &'a mut Vec<u8>,
) -> &'a [u8] {
    assert!(
        has_interleaved(ty) && cols > 0 && cols % ty.block_size() == 0,
        "{cols} columns of {ty}"
    );
    let rb = cols / ty.block_size() * ty.type_size();
    let n = group_rows(ty);
    let group = &data[r / n * n * rb..(r / n + 1) * n * rb];
    buf.resize(n * rb, 0);
    ungroup(ty, cols, group, buf);
    &buf[r % n * rb..(r % n + 1) * rb]
}

/// The pieces of a legacy group of 8 rows of `nb` blocks of `WB` bytes, each block a header of
/// `HB` bytes (`d`, type 1 also `m`) and dwords after it: `f(at in the rows, at in the group,
/// length)` for each f16 field and dword.
fn legacy_pieces<const HB: usize, const WB: usize>(
    nb: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    const R: usize = LEGACY_GROUP_ROWS;
    for b in 0..nb {
        for r in 0..R {
            let (x, o) = (r * nb * WB + b * WB, b * R * WB);
            for h in 0..HB / 2 {
                f(x + 2 * h, o + 16 * h + 2 * r, 2);
            }
            for k in 0..(WB - HB) / 4 {
                f(x + HB + 4 * k, o + 8 * HB + 32 * k + 4 * r, 4);
            }
        }
    }
}

/// One group of the legacy layout in `dst` from its 8 rows in `src` ([`legacy_pieces`]).
fn legacy_group<const HB: usize, const WB: usize>(src: &[u8], nb: usize, dst: &mut [u8]) {
    legacy_pieces::<HB, WB>(nb, |x, o, n| dst[o..o + n].copy_from_slice(&src[x..x + n]));
}

/// The inverse of [`legacy_group`].
fn legacy_ungroup<const HB: usize, const WB: usize>(src: &[u8], nb: usize, dst: &mut [u8]) {
    legacy_pieces::<HB, WB>(nb, |x, o, n| dst[x..x + n].copy_from_slice(&src[o..o + n]));
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

/// The 8 bytes at `at` as a little-endian word.
#[inline(always)]
fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[inline(always)]
fn put_word(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Low nibbles of every byte.
const NIB: u64 = 0x0F0F_0F0F_0F0F_0F0F;

/// Four Q4_K rows in `dst` from one interleaved group in `src` (the inverse of [`q4_k_group`]),
/// 8 bytes at a time: products at instruction sets without interleaved kernels take the file's
/// layout back on the fly through this.
fn q4_k_ungroup(src: &[u8], nb: usize, dst: &mut [u8]) {
    const TWO: u64 = 0x0303_0303_0303_0303;
    let rb = nb * Q4_K_BLOCK;
    for b in 0..nb {
        let o = &src[b * Q4_K_GROUP_BLOCK..(b + 1) * Q4_K_GROUP_BLOCK];
        for r in 0..GROUP_ROWS {
            let x = &mut dst[r * rb + b * Q4_K_BLOCK..][..Q4_K_BLOCK];
            x[0..2].copy_from_slice(&o[2 * r..2 * r + 2]);
            x[2..4].copy_from_slice(&o[8 + 2 * r..8 + 2 * r + 2]);
            // Scales j (values 8r + j) and minimums (32 + 8r + j): low bits in the two nibbles of
            // bytes 16 + 8r.., top bits at bits 2(v / 16) of bytes 48 + v % 16.
            let lo = word(o, 16 + 8 * r);
            let hi = word(o, 48 + 8 * (r % 2));
            let sc = (lo & NIB) | (hi >> (2 * (r / 2)) & TWO) << 4;
            let mn = (lo >> 4 & NIB) | (hi >> (2 * (2 + r / 2)) & TWO) << 4;
            // The packing `scale_min_k4` reads: scales and minimums 0..3 in the low 6 bits of
            // bytes 0..3 and 4..7, 4..7 split into a nibble of bytes 8..11 and the top 2 bits
            // of bytes 0..7.
            let (sc_lo, sc_hi) = (sc as u32, (sc >> 32) as u32);
            let (mn_lo, mn_hi) = (mn as u32, (mn >> 32) as u32);
            let top = |v: u32| (v >> 4 & 0x0303_0303) << 6;
            x[4..8].copy_from_slice(&(sc_lo | top(sc_hi)).to_le_bytes());
            x[8..12].copy_from_slice(&(mn_lo | top(mn_hi)).to_le_bytes());
            let mixed = (sc_hi & 0x0F0F_0F0F) | (mn_hi & 0x0F0F_0F0F) << 4;
            x[12..16].copy_from_slice(&mixed.to_le_bytes());
            // Sub-blocks 2p (low nibbles of the file's bytes 16 + 32p..) and 2p + 1 (high).
            for p in 0..4 {
                let at = |j: usize, h: usize| word(o, 64 + 64 * j + 32 * h + 8 * r);
                for h in 0..2 {
                    let (e, f) = (at(2 * p, h), at(2 * p + 1, h));
                    put_word(x, 16 + 32 * p + 16 * h, (e & NIB) | (f & NIB) << 4);
                    put_word(x, 24 + 32 * p + 16 * h, (e >> 4 & NIB) | (f & !NIB));
                }
            }
        }
    }
}

/// The 256 six-bit quants (unsigned, as stored) of a Q6_K super-block: element `128n + 32p + l`
/// has its low 4 bits in byte `64n + l + 32 (p % 2)` of `ql` (the high nibble for `p >= 2`) and its
/// top 2 bits at bits `2p` of byte `32n + l` of `qh`.
fn q6_quants(x: &[u8]) -> [u8; 256] {
    let (ql, qh) = (&x[..128], &x[128..192]);
    std::array::from_fn(|e| {
        let (n, p, l) = (e / 128, e % 128 / 32, e % 32);
        let low = ql[64 * n + l + 32 * (p % 2)] >> (4 * (p / 2)) & 15;
        low | (qh[32 * n + l] >> (2 * p) & 3) << 4
    })
}

/// One group of the interleaved layout in `dst`, from four Q6_K rows of `nb` super-blocks in `src`.
fn q6_k_group(src: &[u8], nb: usize, dst: &mut [u8]) {
    let rb = nb * Q6_K_BLOCK;
    for b in 0..nb {
        let o = &mut dst[b * Q6_K_GROUP_BLOCK..(b + 1) * Q6_K_GROUP_BLOCK];
        o.fill(0);
        for r in 0..GROUP_ROWS {
            let x = &src[r * rb + b * Q6_K_BLOCK..][..Q6_K_BLOCK];
            o[2 * r..2 * r + 2].copy_from_slice(&x[208..210]);
            for j in 0..16 {
                o[8 + 16 * (j / 4) + 4 * r + j % 4] = x[192 + j];
            }
            let q = q6_quants(x);
            for c in 0..8 {
                let part = &mut o[Q6_K_GROUP_QUANTS + 96 * c..][..96];
                for k in 0..8 {
                    let e = |i: usize| q[32 * c + 8 * i + k];
                    part[8 * r + k] = (e(0) & 15) | (e(1) & 15) << 4;
                    part[32 + 8 * r + k] = (e(2) & 15) | (e(3) & 15) << 4;
                    part[64 + 8 * r + k] =
                        e(0) >> 4 | (e(1) >> 4) << 2 | (e(2) >> 4) << 4 | (e(3) >> 4) << 6;
                }
            }
        }
    }
}

/// Four Q6_K rows in `dst` from one interleaved group in `src` (the inverse of [`q6_k_group`]),
/// 8 bytes at a time (see [`q4_k_ungroup`]).
fn q6_k_ungroup(src: &[u8], nb: usize, dst: &mut [u8]) {
    const TWO: u64 = 0x0303_0303_0303_0303;
    let rb = nb * Q6_K_BLOCK;
    for b in 0..nb {
        let o = &src[b * Q6_K_GROUP_BLOCK..(b + 1) * Q6_K_GROUP_BLOCK];
        for r in 0..GROUP_ROWS {
            let x = &mut dst[r * rb + b * Q6_K_BLOCK..][..Q6_K_BLOCK];
            x[208..210].copy_from_slice(&o[2 * r..2 * r + 2]);
            for g in 0..4 {
                x[192 + 4 * g..196 + 4 * g].copy_from_slice(&o[8 + 16 * g + 4 * r..][..4]);
            }
            // Chunk c = 4n + p holds elements 128n + 32p + l: l = k, 8 + k in the nibbles of
            // part 0, 16 + k, 24 + k in part 1, their top bits in part 2.
            let part = |c: usize, i: usize| word(o, Q6_K_GROUP_QUANTS + 96 * c + 32 * i + 8 * r);
            for n in 0..2 {
                // `ql` bytes 64n + 32(p % 2) + l: low 4 bits of element (p, l) in the low nibble
                // for p < 2, of (p + 2, l) in the high one.
                for p in 0..2 {
                    let (c, c2) = (4 * n + p, 4 * n + p + 2);
                    for i in 0..2 {
                        let (e, f) = (part(c, i), part(c2, i));
                        let at = 64 * n + 32 * p + 16 * i;
                        put_word(x, at, (e & NIB) | (f & NIB) << 4);
                        put_word(x, at + 8, (e >> 4 & NIB) | (f & !NIB));
                    }
                }
                // `qh` bytes 32n + l: the top bits of element (p, l) at bits 2p.
                let h: [u64; 4] = std::array::from_fn(|p| part(4 * n + p, 2));
                for q in 0..4 {
                    let v = (0..4).fold(0, |v, p| v | (h[p] >> (2 * q) & TWO) << (2 * p));
                    put_word(x, 128 + 32 * n + 8 * q, v);
                }
            }
        }
    }
}
