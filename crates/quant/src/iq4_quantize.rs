//! IQ4_NL and IQ4_XS quantizers, ported from ggml-quants.c's `quantize_row_iq4_nl_impl` as
//! `quantize_iq4_nl` / `quantize_iq4_xs` call it without an importance matrix (what `llama-quantize`
//! writes): per 32-block, the scale is searched over 15 candidates with weights `x^2`; IQ4_XS then
//! rounds the block scales to 6 bits against one f16 super-scale and re-picks every level.

use crate::block::f32_to_f16;
use crate::iq4::{BlockIQ4NL, BlockIQ4XS, KVALUES_IQ4NL};
use crate::k_quantize::nearest_int;

/// Below this a block counts as all zero (`GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// Scale-search half width (`ntry = 7` in `quantize_iq4_nl` / `quantize_iq4_xs`).
const NTRY: i32 = 7;

/// Index of the level nearest to `x` in the sorted `val` (`best_index_int8`): the largest `j` with
/// `2x >= val[j-1] + val[j]`, found by branch-free binary search; exact, as both sides are.
#[inline]
fn best_index_int8(val: &[i8; 16], x: f32) -> usize {
    let x2 = x + x;
    let mut idx = 0;
    let mut step = 8;
    while step > 0 {
        let j = idx + step;
        if x2 >= (val[j - 1] as i32 + val[j] as i32) as f32 {
            idx = j;
        }
        step >>= 1;
    }
    idx
}

/// One 32-element block: fills `l` with level indices and returns its scale (0 for an all-zero
/// block).
fn search_block(xb: &[f32], l: &mut [u8]) -> f32 {
    let values = &KVALUES_IQ4NL;
    let mut weight = [0f32; 32];
    for (w, &v) in weight.iter_mut().zip(xb) {
        *w = v * v;
    }
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let mut d = -max / values[0] as f32;
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for j in 0..xb.len() {
        let li = best_index_int8(values, id * xb[j]);
        l[j] = li as u8;
        let q = values[li] as f32;
        sumqx += weight[j] * q * xb[j];
        sumq2 += weight[j] * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        id = (itry + values[0] as i32) as f32 / max;
        sumqx = 0.0;
        sumq2 = 0.0;
        for j in 0..xb.len() {
            let q = values[best_index_int8(values, id * xb[j])] as f32;
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

fn pack_nibbles(l: &[u8], qs: &mut [u8]) {
    for (i, q) in qs.chunks_exact_mut(16).enumerate() {
        for j in 0..16 {
            q[j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
}

/// `quantize_iq4_nl` without importance weights (`llama-quantize`'s IQ4_NL; ggml's
/// `quantize_row_iq4_nl_ref` skips the scale search and the final re-pick).
pub fn quantize_row_iq4_nl(x: &[f32], out: &mut [BlockIQ4NL]) {
    assert_eq!(
        x.len(),
        out.len() * 32,
        "input length and block count disagree"
    );
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let mut l = [0u8; 32];
        let d = search_block(xb, &mut l);
        b.d = f32_to_f16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (lj, &v) in l.iter_mut().zip(xb) {
            *lj = best_index_int8(&KVALUES_IQ4NL, id * v) as u8;
        }
        pack_nibbles(&l, &mut b.qs);
    }
}

/// `quantize_iq4_xs` without importance weights (also ggml's `quantize_row_iq4_xs_ref`).
pub fn quantize_row_iq4_xs(x: &[f32], out: &mut [BlockIQ4XS]) {
    assert_eq!(
        x.len(),
        out.len() * 256,
        "input length and block count disagree"
    );
    for (xs, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let mut l = [0u8; 256];
        let mut scales = [0f32; 8];
        let (mut max_scale, mut amax_scale) = (0f32, 0f32);
        for ib in 0..8 {
            let d = search_block(&xs[32 * ib..32 * ib + 32], &mut l[32 * ib..32 * ib + 32]);
            scales[ib] = d;
            if d.abs() > amax_scale {
                amax_scale = d.abs();
                max_scale = d;
            }
        }
        let d = -max_scale / 32.0;
        b.d = f32_to_f16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut scales_h = 0u16;
        b.scales_l = [0; 4];
        for ib in 0..8 {
            let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..32 {
                l[32 * ib + j] = best_index_int8(&KVALUES_IQ4NL, idl * xs[32 * ib + j]) as u8;
            }
            let ls = (ls + 32) as u8;
            b.scales_l[ib / 2] |= (ls & 0xf) << (4 * (ib % 2));
            scales_h |= ((ls >> 4) as u16) << (2 * ib);
        }
        b.scales_h = scales_h.to_le_bytes();
        pack_nibbles(&l, &mut b.qs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_picks_nearest_level() {
        let v = &KVALUES_IQ4NL;
        for (x, want) in [
            (-200.0, 0),
            (-127.0, 0),
            (-115.6, 0),
            (-115.4, 1),
            (0.0, 8),
            (1.0, 8),
            (7.0, 9),
            (112.0, 15),
            (500.0, 15),
        ] {
            assert_eq!(best_index_int8(v, x), want, "x = {x}");
        }
    }
}
