//! Reference scalar dot products of one weight row with one quantized activation row, ported from
//! ggml's `ggml_vec_dot_*_generic` (ggml-cpu/quants.c): the same integer accumulation and the same
//! order of f32 operations, so results match llama.cpp's scalar path bit for bit. They are the twins
//! that SIMD kernels are tested against.
//!
//! `n` is the row length in elements; the slices must hold exactly `n / block_size` blocks.

use crate::block::f16_to_f32;
use crate::iq4::{BlockIQ4NL, BlockIQ4XS, KVALUES_IQ4NL};
use crate::k_quants::{
    q3k_scales, q6, scale_min_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K,
};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK};

fn check(n: usize, bs: usize, nw: usize, na: usize) {
    assert!(
        n % bs == 0 && nw == n / bs && na == n / bs,
        "vec_dot: n={n} with {nw} and {na} blocks of {bs}"
    );
}

/// Sum of `w_j * a_j` over the two nibble halves of a 32-block, as `(sumi0, sumi1)` summed.
#[inline]
fn nibble_dot(qs: &[u8; 16], a: &[i8; 32], offset: i32) -> i32 {
    let (mut s0, mut s1) = (0i32, 0i32);
    for j in 0..16 {
        s0 += ((qs[j] & 0x0f) as i32 - offset) * a[j] as i32;
        s1 += ((qs[j] >> 4) as i32 - offset) * a[j + 16] as i32;
    }
    s0 + s1
}

/// `ggml_vec_dot_q4_0_q8_0`: per block `sumf += sumi * dx * dy`.
pub fn vec_dot_q4_0_q8_0(n: usize, x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    check(n, QK, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sumi = nibble_dot(&x.qs, &y.qs, 8);
        sumf += sumi as f32 * f16_to_f32(x.d) * f16_to_f32(y.d);
    }
    sumf
}

/// `ggml_vec_dot_q4_1_q8_1`: per block `sumf += (dx * dy) * sumi + mx * sy`.
pub fn vec_dot_q4_1_q8_1(n: usize, x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    check(n, QK, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sumi = nibble_dot(&x.qs, &y.qs, 0);
        sumf +=
            (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32 + f16_to_f32(x.m) * f16_to_f32(y.s);
    }
    sumf
}

/// Sum of 5-bit quants (minus `offset`) times activations over a 32-block.
#[inline]
fn q5_dot(qs: &[u8; 16], qh: [u8; 4], a: &[i8; 32], offset: i32) -> i32 {
    let qh = u32::from_le_bytes(qh);
    let (mut s0, mut s1) = (0i32, 0i32);
    for j in 0..16 {
        let h0 = (((qh >> j) & 1) << 4) as i32;
        let h1 = (((qh >> (j + 16)) & 1) << 4) as i32;
        s0 += (((qs[j] & 0x0f) as i32 | h0) - offset) * a[j] as i32;
        s1 += (((qs[j] >> 4) as i32 | h1) - offset) * a[j + 16] as i32;
    }
    s0 + s1
}

/// `ggml_vec_dot_q5_0_q8_0`: per block `sumf += (dx * dy) * sumi`.
pub fn vec_dot_q5_0_q8_0(n: usize, x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    check(n, QK, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sumi = q5_dot(&x.qs, x.qh, &y.qs, 16);
        sumf += (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32;
    }
    sumf
}

/// `ggml_vec_dot_q5_1_q8_1`: per block `sumf += (dx * dy) * sumi + mx * sy`.
pub fn vec_dot_q5_1_q8_1(n: usize, x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    check(n, QK, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sumi = q5_dot(&x.qs, x.qh, &y.qs, 0);
        sumf +=
            (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32 + f16_to_f32(x.m) * f16_to_f32(y.s);
    }
    sumf
}

/// `ggml_vec_dot_q8_0_q8_0`: per block `sumf += sumi * (dx * dy)`.
pub fn vec_dot_q8_0_q8_0(n: usize, x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    check(n, QK, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sumi: i32 =
            x.qs.iter()
                .zip(&y.qs)
                .map(|(&a, &b)| a as i32 * b as i32)
                .sum();
        sumf += sumi as f32 * (f16_to_f32(x.d) * f16_to_f32(y.d));
    }
    sumf
}

/// `ggml_vec_dot_iq4_nl_q8_0`: per block `sumf += (dy * dx) * (sumi1 + sumi2)`.
pub fn vec_dot_iq4_nl_q8_0(n: usize, x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    check(n, QK, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let d = f16_to_f32(y.d) * f16_to_f32(x.d);
        let (mut s1, mut s2) = (0i32, 0i32);
        for j in 0..16 {
            s1 += y.qs[j] as i32 * KVALUES_IQ4NL[(x.qs[j] & 0xf) as usize] as i32;
            s2 += y.qs[j + 16] as i32 * KVALUES_IQ4NL[(x.qs[j] >> 4) as usize] as i32;
        }
        sumf += d * (s1 + s2) as f32;
    }
    sumf
}

/// `ggml_vec_dot_q2_K_q8_K`: integer sums per sub-block, the mins applied through Q8_K's `bsums`;
/// per block `sumf += dall * isum - dmin * summs`.
pub fn vec_dot_q2_k_q8_k(n: usize, x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    check(n, QK_K, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sc = &x.scales;
        let mut summs = 0i32;
        for (j, &s) in sc.iter().enumerate() {
            summs += y.bsum(j) as i32 * (s >> 4) as i32;
        }
        let dall = y.d() * f16_to_f32(x.d);
        let dmin = y.d() * f16_to_f32(x.dmin);

        let mut isum = 0i32;
        let mut is = 0;
        let mut q8 = 0;
        for k in 0..QK_K / 128 {
            let q2 = &x.qs[32 * k..32 * k + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let d = (sc[is] & 0xf) as i32;
                    is += 1;
                    let mut isuml = 0i32;
                    for l in 16 * half..16 * half + 16 {
                        isuml += y.qs[q8 + l] as i32 * ((q2[l] >> shift) & 3) as i32;
                    }
                    isum += d * isuml;
                }
                q8 += 32;
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// Accumulates `scale * q8[l] * a[l]` for 16 elements into 8 lanes, as ggml's
/// `aux16` / `aux32` loops (two groups of 8).
#[inline]
fn acc16(aux32: &mut [i32; 8], scale: i32, q8: &[i8], a: &[i8]) {
    for g in 0..2 {
        for l in 0..8 {
            aux32[l] += scale * (q8[8 * g + l] as i32 * a[8 * g + l] as i32);
        }
    }
}

/// `ggml_vec_dot_q3_K_q8_K`: quants unpacked to i8 in [-4, 3], accumulated in 8 i32 lanes per block,
/// lanes scaled into 8 f32 sums that are added up at the very end.
pub fn vec_dot_q3_k_q8_k(n: usize, x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    check(n, QK_K, x.len(), y.len());
    let mut sums = [0.0f32; 8];
    let mut aux8 = [0i8; QK_K];
    for (x, y) in x.iter().zip(y) {
        let mut m = 1u8;
        let mut a = 0;
        for j in 0..QK_K / 128 {
            let q3 = &x.qs[32 * j..32 * j + 32];
            for shift in [0, 2, 4, 6] {
                for l in 0..32 {
                    let off = if x.hmask[l] & m != 0 { 0 } else { 4 };
                    aux8[a + l] = ((q3[l] >> shift) & 3) as i8 - off;
                }
                a += 32;
                m = m.wrapping_shl(1);
            }
        }
        let scales = q3k_scales(&x.scales);
        let mut aux32 = [0i32; 8];
        for (j, &s) in scales.iter().enumerate() {
            acc16(
                &mut aux32,
                s as i32,
                &y.qs[16 * j..16 * j + 16],
                &aux8[16 * j..16 * j + 16],
            );
        }
        let d = f16_to_f32(x.d) * y.d();
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0.0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

/// Shared tail of the Q4_K and Q5_K dots: `aux8` holds the 256 unsigned quants of block `x`.
fn q45k_block(
    scales12: &[u8; 12],
    d: f32,
    dmin: f32,
    aux8: &[i8; QK_K],
    y: &BlockQ8K,
    sums: &mut [f32; 8],
    sumf: &mut f32,
) {
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..8 {
        (scales[j], mins[j]) = scale_min_k4(j, scales12);
    }
    let mut sumi = 0i32;
    for j in 0..QK_K / 16 {
        sumi += y.bsum(j) as i32 * mins[j / 2] as i32;
    }
    let mut aux32 = [0i32; 8];
    for (j, &s) in scales.iter().enumerate() {
        for h in 0..2 {
            let o = 32 * j + 16 * h;
            acc16(&mut aux32, s as i32, &y.qs[o..o + 16], &aux8[o..o + 16]);
        }
    }
    let d = d * y.d();
    for l in 0..8 {
        sums[l] += d * aux32[l] as f32;
    }
    let dmin = dmin * y.d();
    *sumf -= dmin * sumi as f32;
}

/// `ggml_vec_dot_q4_K_q8_K`: mins applied through `bsums` into `sumf` block by block, scaled lanes
/// into 8 f32 sums added at the end.
pub fn vec_dot_q4_k_q8_k(n: usize, x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    check(n, QK_K, x.len(), y.len());
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    let mut aux8 = [0i8; QK_K];
    for (x, y) in x.iter().zip(y) {
        for (j, q4) in x.qs.chunks_exact(32).enumerate() {
            for l in 0..32 {
                aux8[64 * j + l] = (q4[l] & 0xf) as i8;
                aux8[64 * j + 32 + l] = (q4[l] >> 4) as i8;
            }
        }
        q45k_block(
            &x.scales,
            f16_to_f32(x.d),
            f16_to_f32(x.dmin),
            &aux8,
            y,
            &mut sums,
            &mut sumf,
        );
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// `ggml_vec_dot_q5_K_q8_K`: as Q4_K with the fifth bit from `qh`.
pub fn vec_dot_q5_k_q8_k(n: usize, x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    check(n, QK_K, x.len(), y.len());
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    let mut aux8 = [0i8; QK_K];
    for (x, y) in x.iter().zip(y) {
        for (j, q4) in x.qs.chunks_exact(32).enumerate() {
            let (m1, m2) = (1u8 << (2 * j), 2u8 << (2 * j));
            for l in 0..32 {
                let h1 = if x.qh[l] & m1 != 0 { 16 } else { 0 };
                let h2 = if x.qh[l] & m2 != 0 { 16 } else { 0 };
                aux8[64 * j + l] = (q4[l] & 0xf) as i8 + h1;
                aux8[64 * j + 32 + l] = (q4[l] >> 4) as i8 + h2;
            }
        }
        q45k_block(
            &x.scales,
            f16_to_f32(x.d),
            f16_to_f32(x.dmin),
            &aux8,
            y,
            &mut sums,
            &mut sumf,
        );
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// `ggml_vec_dot_q6_K_q8_K`: quants unpacked to i8 in [-32, 31], 8 i32 lanes, 8 f32 sums.
pub fn vec_dot_q6_k_q8_k(n: usize, x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    check(n, QK_K, x.len(), y.len());
    let mut sums = [0.0f32; 8];
    let mut aux8 = [0i8; QK_K];
    for (x, y) in x.iter().zip(y) {
        for h in 0..QK_K / 128 {
            let ql = &x.ql[64 * h..64 * h + 64];
            let qh = &x.qh[32 * h..32 * h + 32];
            for l in 0..32 {
                for k in 0..4 {
                    aux8[128 * h + 32 * k + l] = q6(ql, qh, l, k);
                }
            }
        }
        let mut aux32 = [0i32; 8];
        for (j, &s) in x.scales.iter().enumerate() {
            acc16(
                &mut aux32,
                s as i32,
                &y.qs[16 * j..16 * j + 16],
                &aux8[16 * j..16 * j + 16],
            );
        }
        let d = f16_to_f32(x.d) * y.d();
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0.0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

/// `ggml_vec_dot_iq4_xs_q8_K`: per sub-block `sumf += (d4d8 * (ls - 32)) * (sumi1 + sumi2)`.
pub fn vec_dot_iq4_xs_q8_k(n: usize, x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    check(n, QK_K, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let d4d8 = f16_to_f32(x.d) * y.d();
        for ib in 0..8 {
            let dl = d4d8 * (x.ls(ib) - 32) as f32;
            let qs = &x.qs[16 * ib..16 * ib + 16];
            let q8 = &y.qs[32 * ib..32 * ib + 32];
            let (mut s1, mut s2) = (0i32, 0i32);
            for j in 0..16 {
                s1 += q8[j] as i32 * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as i32;
                s2 += q8[j + 16] as i32 * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
            }
            sumf += dl * (s1 + s2) as f32;
        }
    }
    sumf
}
