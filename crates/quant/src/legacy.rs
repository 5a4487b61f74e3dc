//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1 (`block_q*` in ggml-common.h),
//! their dequantizers (bit-exact with gguf-py / `dequantize_row_*`) and reference quantizers
//! (`quantize_row_*_ref` in ggml-quants.c).
//!
//! Layout reminder: in the 4- and 5-bit formats, byte `j` of `qs` holds element `j` in its low nibble
//! and element `j + 16` in its high nibble; `qh` (5-bit) holds bit 4 of element `j` at bit `j`.

#![allow(non_camel_case_types)]

use crate::block::{f16_to_f32, f32_to_f16, impl_block};
use crate::GgmlType;

/// Elements per legacy block.
pub const QK: usize = 32;

/// Q4_0: `x = d * (q - 8)`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_0 {
    /// Scale, f16 LE.
    pub d: [u8; 2],
    /// Nibbles: low = element j, high = element j + 16.
    pub qs: [u8; QK / 2],
}
impl_block!(BlockQ4_0, GgmlType::Q4_0, QK, 18);

/// Q4_1: `x = d * q + m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_1 {
    /// Scale, f16 LE.
    pub d: [u8; 2],
    /// Minimum, f16 LE.
    pub m: [u8; 2],
    /// Nibbles: low = element j, high = element j + 16.
    pub qs: [u8; QK / 2],
}
impl_block!(BlockQ4_1, GgmlType::Q4_1, QK, 20);

/// Q5_0: `x = d * (q - 16)`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_0 {
    /// Scale, f16 LE.
    pub d: [u8; 2],
    /// Bit 4 of element j at bit j (u32 LE).
    pub qh: [u8; 4],
    /// Low nibbles: low = element j, high = element j + 16.
    pub qs: [u8; QK / 2],
}
impl_block!(BlockQ5_0, GgmlType::Q5_0, QK, 22);

/// Q5_1: `x = d * q + m`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_1 {
    /// Scale, f16 LE.
    pub d: [u8; 2],
    /// Minimum, f16 LE.
    pub m: [u8; 2],
    /// Bit 4 of element j at bit j (u32 LE).
    pub qh: [u8; 4],
    /// Low nibbles: low = element j, high = element j + 16.
    pub qs: [u8; QK / 2],
}
impl_block!(BlockQ5_1, GgmlType::Q5_1, QK, 24);

/// Q8_0: `x = d * q`, q an i8.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    /// Scale, f16 LE.
    pub d: [u8; 2],
    /// Quants.
    pub qs: [i8; QK],
}
impl_block!(BlockQ8_0, GgmlType::Q8_0, QK, 34);

/// Q8_1 (activations for Q4_1 / Q5_1): `x = d * q`, and `s = d * sum(q)` so the dot product can
/// apply the weight's minimum in one multiply.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    /// Scale, f16 LE.
    pub d: [u8; 2],
    /// `d * sum(qs)`, f16 LE.
    pub s: [u8; 2],
    /// Quants.
    pub qs: [i8; QK],
}
impl_block!(BlockQ8_1, GgmlType::Q8_1, QK, 36);

fn check(nb: usize, out: usize) {
    assert_eq!(nb * QK, out, "block count and output length disagree");
}

/// The 5-bit quant `j` (0..32) of a Q5 block: low nibble from `qs`, bit 4 from `qh`.
#[inline]
fn q5(qs: &[u8; 16], qh: u32, j: usize) -> u8 {
    let lo = if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    };
    lo | ((((qh >> j) & 1) as u8) << 4)
}

/// Dequantizes Q4_0 blocks into `out` (`blocks.len() * 32` values).
pub fn dequantize_row_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for j in 0..QK / 2 {
            y[j] = ((b.qs[j] & 0x0f) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// Dequantizes Q4_1 blocks: `d * q + m` (product rounded to f32 first, as numpy and ggml).
pub fn dequantize_row_q4_1(blocks: &[BlockQ4_1], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for j in 0..QK / 2 {
            y[j] = d * (b.qs[j] & 0x0f) as f32 + m;
            y[j + QK / 2] = d * (b.qs[j] >> 4) as f32 + m;
        }
    }
}

/// Dequantizes Q5_0 blocks.
pub fn dequantize_row_q5_0(blocks: &[BlockQ5_0], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        let qh = u32::from_le_bytes(b.qh);
        for (j, v) in y.iter_mut().enumerate() {
            *v = (q5(&b.qs, qh, j) as i32 - 16) as f32 * d;
        }
    }
}

/// Dequantizes Q5_1 blocks.
pub fn dequantize_row_q5_1(blocks: &[BlockQ5_1], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        let qh = u32::from_le_bytes(b.qh);
        for (j, v) in y.iter_mut().enumerate() {
            *v = d * q5(&b.qs, qh, j) as f32 + m;
        }
    }
}

/// Dequantizes Q8_0 blocks.
pub fn dequantize_row_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (v, &q) in y.iter_mut().zip(&b.qs) {
            *v = q as f32 * d;
        }
    }
}

/// Dequantizes Q8_1 blocks (`d * q`; `s` is redundant).
pub fn dequantize_row_q8_1(blocks: &[BlockQ8_1], out: &mut [f32]) {
    check(blocks.len(), out.len());
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (v, &q) in y.iter_mut().zip(&b.qs) {
            *v = q as f32 * d;
        }
    }
}

/// The first element of largest magnitude (`amax < fabsf(v)` keeps the first on ties), signed.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn check_q(x: usize, nb: usize) {
    assert_eq!(x, nb * QK, "input length and block count disagree");
}

/// `quantize_row_q4_0_ref`: `d = max / -8` where max is the signed value of largest magnitude.
pub fn quantize_row_q4_0(x: &[f32], out: &mut [BlockQ4_0]) {
    check_q(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let d = signed_absmax(xb) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        for j in 0..QK / 2 {
            // `(int8_t)(x + 8.5f)` truncates toward zero; `as i8` does too (and saturates).
            let q0 = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((xb[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// `quantize_row_q4_1_ref`: `d = (max - min) / 15`, `m = min`.
pub fn quantize_row_q4_1(x: &[f32], out: &mut [BlockQ4_1]) {
    check_q(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        for j in 0..QK / 2 {
            let q0 = (((xb[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((xb[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// Packs 32 five-bit quants into `qs` / `qh`.
fn pack_q5(q: &[u8; QK], qs: &mut [u8; 16], qh: &mut [u8; 4]) {
    let mut h = 0u32;
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4);
        h |= (((q[j] & 0x10) >> 4) as u32) << j;
        h |= (((q[j + 16] & 0x10) >> 4) as u32) << (j + 16);
    }
    *qh = h.to_le_bytes();
}

/// `quantize_row_q5_0_ref`: `d = max / -16`.
pub fn quantize_row_q5_0(x: &[f32], out: &mut [BlockQ5_0]) {
    check_q(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let d = signed_absmax(xb) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        let mut q = [0u8; QK];
        for (qj, &v) in q.iter_mut().zip(xb) {
            *qj = ((v * id + 16.5) as i8).min(31) as u8;
        }
        pack_q5(&q, &mut b.qs, &mut b.qh);
    }
}

/// `quantize_row_q5_1_ref`: `d = (max - min) / 31`, `m = min`.
pub fn quantize_row_q5_1(x: &[f32], out: &mut [BlockQ5_1]) {
    check_q(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        let mut q = [0u8; QK];
        for (qj, &v) in q.iter_mut().zip(xb) {
            // ggml writes `(uint8_t)(x + 0.5f)` unclamped; the value cannot exceed 31 for finite
            // input, and gguf-py clips to 31, so clip.
            *qj = (((v - min) * id + 0.5) as u8).min(31);
        }
        pack_q5(&q, &mut b.qs, &mut b.qh);
    }
}

/// Scale and inverse scale of an 8-bit block: `d = amax / 127`.
fn q8_scale(xb: &[f32]) -> (f32, f32) {
    let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

/// `quantize_row_q8_0_ref`: `d = amax / 127`, `q = roundf(x / d)` (half away from zero).
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    check_q(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let (d, id) = q8_scale(xb);
        b.d = f32_to_f16(d);
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
}

/// `quantize_row_q8_1_ref`: as Q8_0, plus `s = f16(sum(q) * d)`.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    check_q(x.len(), out.len());
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let (d, id) = q8_scale(xb);
        b.d = f32_to_f16(d);
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        b.s = f32_to_f16(sum as f32 * d);
    }
}
