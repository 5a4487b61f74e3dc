//! Plain float rows: F32, F16 and BF16, all little-endian, read from unaligned bytes.

use crate::block::f32_to_f16;
use half::slice::HalfFloatSliceExt;

/// Elements converted per chunk: halves are gathered from unaligned bytes into an aligned stack
/// buffer, then widened by `half`'s slice conversion (F16C when the CPU has it, exact either way).
const CHUNK: usize = 64;

/// Widens `src.len() / 2` little-endian halves (at most [`CHUNK`]) into `out`.
#[inline]
fn f16_chunk_to_f32(src: &[u8], out: &mut [f32]) {
    let mut h = [half::f16::ZERO; CHUNK];
    let h = &mut h[..out.len()];
    for (d, c) in h.iter_mut().zip(src.chunks_exact(2)) {
        *d = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]]));
    }
    h.convert_to_f32_slice(out);
}

/// BF16 bits to f32: the 16 bits are the top half of the f32.
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to BF16 bits as `ggml_compute_fp32_to_bf16` (ggml-impl.h): NaNs are forced quiet, everything
/// else rounds to nearest even (infinities stay infinite, overflow rounds to infinity).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

/// F32 row bytes (4 per element) to f32.
pub fn dequantize_row_f32(src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), out.len() * 4, "F32 row length");
    for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// F16 row bytes (2 per element) to f32 (exact).
pub fn dequantize_row_f16(src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), out.len() * 2, "F16 row length");
    for (o, c) in out.chunks_mut(CHUNK).zip(src.chunks(2 * CHUNK)) {
        f16_chunk_to_f32(c, o);
    }
}

/// BF16 row bytes (2 per element) to f32 (exact).
pub fn dequantize_row_bf16(src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), out.len() * 2, "BF16 row length");
    for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// f32 to F32 row bytes.
pub fn quantize_row_f32(x: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), x.len() * 4, "F32 row length");
    for (v, c) in x.iter().zip(dst.chunks_exact_mut(4)) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

/// f32 to F16 row bytes, rounding to nearest even (as numpy's `astype(float16)` and ggml).
pub fn quantize_row_f16(x: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), x.len() * 2, "F16 row length");
    for (v, c) in x.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_f16(*v));
    }
}

/// f32 to BF16 row bytes (see [`f32_to_bf16`]).
pub fn quantize_row_bf16(x: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), x.len() * 2, "BF16 row length");
    for (v, c) in x.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
    }
}

/// `ggml_vec_dot_f32`, scalar path: each product in f32, summed in f64, rounded to f32 at the end.
pub fn vec_dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() == n * 4 && a.len() == n * 4, "F32 dot lengths");
    let mut sum = 0.0f64;
    for (x, y) in w.chunks_exact(4).zip(a.chunks_exact(4)) {
        let x = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        let y = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        sum += (x * y) as f64;
    }
    sum as f32
}

/// `ggml_vec_dot_f16`, scalar path: halves widened to f32, product in f32, summed in f64.
pub fn vec_dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() == n * 2 && a.len() == n * 2, "F16 dot lengths");
    let mut sum = 0.0f64;
    let (mut xf, mut yf) = ([0f32; CHUNK], [0f32; CHUNK]);
    for (x, y) in w.chunks(2 * CHUNK).zip(a.chunks(2 * CHUNK)) {
        let m = x.len() / 2;
        f16_chunk_to_f32(x, &mut xf[..m]);
        f16_chunk_to_f32(y, &mut yf[..m]);
        for (p, q) in xf[..m].iter().zip(&yf[..m]) {
            sum += (p * q) as f64;
        }
    }
    sum as f32
}

/// `ggml_vec_dot_bf16`, scalar path: widened to f32, product in f32, summed in f64.
pub fn vec_dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() == n * 2 && a.len() == n * 2, "BF16 dot lengths");
    let mut sum = 0.0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        let x = bf16_to_f32(u16::from_le_bytes([x[0], x[1]]));
        let y = bf16_to_f32(u16::from_le_bytes([y[0], y[1]]));
        sum += (x * y) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // Halfway cases round to even.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
    }
}
