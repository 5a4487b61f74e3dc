//! Element-wise and row-wise operations of the decoder, written as ggml computes them (f32 data,
//! reductions in f64 where ggml uses `ggml_float`), so intermediate values track llama.cpp's closely.

/// RMSNorm of one row in place, then multiplied by `weight`: `x * w / sqrt(mean(x^2) + eps)`.
/// As ggml's `rms_norm` (sum of squares in f64, scale in f32) followed by `mul`.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    debug_assert_eq!(x.len(), weight.len());
    let scale = rms_scale(x, eps);
    for (v, w) in x.iter_mut().zip(weight) {
        *v = (*v * scale) * w;
    }
}

/// RMSNorm of `src` into `dst`, multiplied by `weight`.
pub fn rms_norm_into(dst: &mut [f32], src: &[f32], weight: &[f32], eps: f32) {
    let scale = rms_scale(src, eps);
    for ((d, v), w) in dst.iter_mut().zip(src).zip(weight) {
        *d = (*v * scale) * w;
    }
}

/// RMSNorm of every row of `src` (rows of `weight.len()`) into the same rows of `dst`.
pub fn rms_norm_rows(dst: &mut [f32], src: &[f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    for (o, x) in dst.chunks_exact_mut(d).zip(src.chunks_exact(d)) {
        rms_norm_into(o, x, weight, eps);
    }
}

fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// SiLU, `x / (1 + e^-x)`, as ggml's `ggml_silu_f32`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `gate[i] = silu(gate[i]) * up[i]`: the SwiGLU of a dense or expert FFN, in place in `gate`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// Softmax of a row in place (max subtracted, sum in f64, as ggml's `soft_max`).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `y += x` element-wise.
pub fn add_assign(y: &mut [f32], x: &[f32]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_weight() {
        let mut x = vec![3.0f32, 4.0];
        rms_norm(&mut x, &[1.0, 1.0], 0.0);
        let rms = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / rms).abs() < 1e-6 && (x[1] - 4.0 / rms).abs() < 1e-6);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0f32, 2.0, 3.0, -1e9];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
    }
}
