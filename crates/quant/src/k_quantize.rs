//! Reference quantizers for the K formats, ported from ggml-quants.c (`quantize_row_q*_K_ref` and
//! their helpers `nearest_int`, `make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`). These are what
//! `llama-quantize` runs without an importance matrix, and what ggml's CPU path uses to quantize
//! activations to Q8_K.
//! Float operations are kept in ggml's order (no fused multiply-add), so outputs match bit for bit.

use crate::block::{f16_to_f32, f32_to_f16};
use crate::k_quants::{
    q3k_scales, scale_min_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K,
};

/// `GROUP_MAX_EPS`: below this a group counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, through the float adder (ggml's `nearest_int`): adding 1.5 * 2^23
/// leaves the rounded integer in the low mantissa bits. Valid for |x| <= 4194303; outside that it
/// returns the same garbage as ggml.
#[inline]
pub fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12582912.0;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// `make_qx_quants`: symmetric quantization of `x` to `L` in `0..2*nmax` (stored as `l + nmax`),
/// returning the scale. `rmse_type` 1 with `qw == None` weights each element by `x^2` and searches 19
/// candidate scales around `nmax / max`.
pub fn make_qx_quants(
    nmax: i32,
    x: &[f32],
    l_out: &mut [i8],
    rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for (l, &v) in l_out.iter_mut().zip(x) {
            let q = nearest_int(iscale * v);
            *l = (nmax + q.clamp(-nmax, nmax - 1)) as i8;
        }
        return 1.0 / iscale;
    }
    let (rmse_type, return_early) = if rmse_type < 0 {
        (-rmse_type, true)
    } else {
        (rmse_type, false)
    };
    let weight = |i: usize| -> f32 {
        match qw {
            Some(w) => w[i],
            None => match rmse_type {
                1 => x[i] * x[i],
                2 => 1.0,
                3 => x[i].abs(),
                _ => x[i].abs().sqrt(),
            },
        }
    };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = weight(i);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1) as f32;
            let w = weight(i);
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]);
                l_out[i] = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_qkx2_quants`: asymmetric quantization of `x` to `L` in `0..=nmax` with scale and min, fitted
/// by weighted least squares over `nstep + 1` candidate scales. Returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)]
pub fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let mut diff = scale * l as f32 + min - x[i];
        diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_aux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let mut diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                diff = if use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

fn check(x: usize, nb: usize) {
    assert_eq!(x, nb * QK_K, "input length and block count disagree");
}

/// `quantize_row_q8_K_ref`: `d = max / -127` from the signed value of largest magnitude, `q =
/// nearest_int(x / d)` capped at 127, and the sums of each 16 quants. An all-zero block gets `d = 0`
/// and zero quants and sums (ggml leaves its sums unwritten).
pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    check(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = crate::block::Block::zeroed();
            continue;
        }
        // ggml uses -127 rather than -128 so that the AVX IQ2_XXS path stays simple.
        let iscale = -127.0f32 / max;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let sum: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
            b.bsums[2 * j..2 * j + 2].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

/// Packs eight 6-bit scales and mins the way [`scale_min_k4`] reads them.
fn pack_scales_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xf) | ((lm[j] & 0xf) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// The Q4_K / Q5_K scale search shared by both reference quantizers: per sub-block of 32,
/// `make_qkx2_quants` with weights `sqrt(mean(x^2)) + |x|`, then 6-bit scales and mins relative to the
/// largest, then a final requantization against the rounded scales. Returns (d, dmin, scales, L).
fn qk45_block(
    xb: &[f32],
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> ([u8; 2], [u8; 2], [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut l_aux = [0u8; 32];
    let mut weights = [0.0f32; 32];
    let mut mins = [0.0f32; 8];
    let mut scales = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let x = &xb[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in x {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(x) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            nmax,
            x,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut l_aux,
            rmin,
            rdelta,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        // ggml stores nearest_int's result into a uint8_t (wrapping), then caps at 63.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let packed = pack_scales_k4(&ls, &lm);
    let d = f32_to_f16(max_scale / 63.0);
    let dmin = f32_to_f16(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dd = f16_to_f32(d) * sc as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * m as f32;
        for ii in 0..32 {
            let q = nearest_int((xb[32 * j + ii] + dm) / dd);
            l[32 * j + ii] = q.clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, l)
}

/// `quantize_row_q4_K_ref`.
pub fn quantize_row_q4_k(x: &[f32], out: &mut [BlockQ4K]) {
    check(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (d, dmin, scales, l) = qk45_block(xb, 15, -1.0, 0.1, 20);
        b.d = d;
        b.dmin = dmin;
        b.scales = scales;
        for j in 0..QK_K / 64 {
            for i in 0..32 {
                b.qs[32 * j + i] = l[64 * j + i] | (l[64 * j + i + 32] << 4);
            }
        }
    }
}

/// `quantize_row_q5_K_ref`.
pub fn quantize_row_q5_k(x: &[f32], out: &mut [BlockQ5K]) {
    check(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (d, dmin, scales, l) = qk45_block(xb, 31, -0.5, 0.1, 15);
        b.d = d;
        b.dmin = dmin;
        b.scales = scales;
        b.qh = [0; QK_K / 8];
        let (mut m1, mut m2) = (1u8, 2u8);
        for n in 0..QK_K / 64 {
            for j in 0..32 {
                let mut l1 = l[64 * n + j];
                if l1 > 15 {
                    l1 -= 16;
                    b.qh[j] |= m1;
                }
                let mut l2 = l[64 * n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    b.qh[j] |= m2;
                }
                b.qs[32 * n + j] = l1 | (l2 << 4);
            }
            m1 = m1.wrapping_shl(2);
            m2 = m2.wrapping_shl(2);
        }
    }
}

/// `quantize_row_q6_K_ref`: per sub-block of 16, `make_qx_quants(nmax = 32, rmse_type = 1)`, then i8
/// scales relative to the signed largest scale (`-128 / max`), then requantization.
pub fn quantize_row_q6_k(x: &[f32], out: &mut [BlockQ6K]) {
    check(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let s = make_qx_quants(
                32,
                &xb[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
                1,
                None,
            );
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *b = crate::block::Block::zeroed();
            continue;
        }
        let iscale = -128.0f32 / max_scale;
        b.d = f32_to_f16(1.0 / iscale);
        for ib in 0..QK_K / 16 {
            b.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }
        let d0 = f16_to_f32(b.d);
        for j in 0..QK_K / 16 {
            let d = d0 * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(xb[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        for h in 0..QK_K / 128 {
            let lh = &l[128 * h..128 * h + 128];
            for i in 0..32 {
                let q = |k: usize| lh[i + 32 * k] as u8;
                b.ql[64 * h + i] = (q(0) & 0xf) | ((q(2) & 0xf) << 4);
                b.ql[64 * h + i + 32] = (q(1) & 0xf) | ((q(3) & 0xf) << 4);
                b.qh[32 * h + i] =
                    (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
    }
}

/// `make_q3_quants` with `do_rmse`: symmetric levels in `-nmax..nmax` chosen by weighted (`x^2`)
/// least squares, then up to five passes that move single elements to a better level. Stores
/// `l + nmax` and returns the scale.
pub fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = l as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l_out[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in &mut l_out[..n] {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Packs 256 two-bit values: byte `l` of each 32-byte group holds elements `l`, `l + 32`, `l + 64`,
/// `l + 96` of its 128-element half.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for h in 0..QK_K / 128 {
        for i in 0..32 {
            let b = 128 * h + i;
            qs[32 * h + i] = l[b] | (l[b + 32] << 2) | (l[b + 64] << 4) | (l[b + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref`: per sub-block of 16, `make_qkx2_quants(nmax = 3)` with weights `|x|` and
/// absolute-error fitting, 4-bit scales and mins relative to the largest, then requantization.
pub fn quantize_row_q2_k(x: &[f32], out: &mut [BlockQ2K]) {
    check(x.len(), out.len());
    const Q4SCALE: f32 = 15.0;
    for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut l = [0u8; QK_K];
        let mut l_aux = [0u8; 16];
        let mut weights = [0f32; 16];
        let mut mins = [0f32; 16];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..16 {
            let xs = &xb[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(
                3,
                xs,
                &weights,
                &mut l[16 * j..16 * j + 16],
                &mut l_aux,
                -0.5,
                0.1,
                15,
                true,
            );
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                b.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = f32_to_f16(max_scale / Q4SCALE);
        } else {
            b.scales = [0; 16];
            b.d = f32_to_f16(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                b.scales[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            b.dmin = f32_to_f16(max_min / Q4SCALE);
        } else {
            b.dmin = f32_to_f16(0.0);
        }
        for j in 0..16 {
            let d = f16_to_f32(b.d) * (b.scales[j] & 0xf) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = f16_to_f32(b.dmin) * (b.scales[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((xb[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut b.qs);
    }
}

/// `quantize_row_q3_K_ref`: per sub-block of 16, `make_q3_quants(nmax = 4)`, 6-bit signed scales
/// relative to the signed largest (`-32 / max`), requantization, then the high bit of each level moved
/// to `hmask`.
pub fn quantize_row_q3_k(x: &[f32], out: &mut [BlockQ3K]) {
    check(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0f32, 0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &xb[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        b.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            for j in 0..16 {
                // ggml stores nearest_int's result in an int8_t before clamping.
                let q = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                let q = q as u8;
                if j < 8 {
                    b.scales[j] = q & 0xf;
                } else {
                    b.scales[j - 8] |= (q & 0xf) << 4;
                }
                b.scales[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
            }
            b.d = f32_to_f16(1.0 / iscale);
        } else {
            b.d = f32_to_f16(0.0);
        }
        let sc = q3k_scales(&b.scales);
        for j in 0..16 {
            let d = f16_to_f32(b.d) * sc[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(xb[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        // High bit of the first 32 levels into bit 0 of hmask[0..32], the next 32 into bit 1, ...
        b.hmask = [0; QK_K / 8];
        let mut lu = [0u8; QK_K];
        for j in 0..QK_K {
            let mut v = l[j] as u8;
            if v > 3 {
                b.hmask[j % 32] |= 1 << (j / 32);
                v -= 4;
            }
            lu[j] = v;
        }
        pack_2bit(&lu, &mut b.qs);
    }
}
