//! Small vector kernels of attention: `o += a * v` over a cached value row (f16 or f32), with an
//! AVX2/F16C path picked at run time and the scalar twin it is tested against. The K·Q products go
//! through `hearth_quant::vec_dot` (F16 × F16 or F32 × F32), as llama.cpp's flash attention does.

use half::f16;

/// `o[i] += a * v[i]` for an f16 row.
pub fn axpy_f16(o: &mut [f32], a: f32, v: &[f16]) {
    debug_assert_eq!(o.len(), v.len());
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2_f16c() {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked above); lengths are equal.
            unsafe { axpy_f16_avx2(o, a, v) };
            return;
        }
    }
    axpy_f16_scalar(o, a, v);
}

/// Scalar twin of [`axpy_f16`].
pub fn axpy_f16_scalar(o: &mut [f32], a: f32, v: &[f16]) {
    for (x, v) in o.iter_mut().zip(v) {
        *x += a * v.to_f32();
    }
}

/// `o[i] += a * v[i]` for an f32 row.
pub fn axpy_f32(o: &mut [f32], a: f32, v: &[f32]) {
    for (x, v) in o.iter_mut().zip(v) {
        *x += a * v;
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_f16c() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        // Honour a forced scalar run (HEARTH_KERNELS=scalar), as the quant kernels do.
        hearth_quant::kernel_level() != hearth_quant::Level::Scalar
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_f16_avx2(o: &mut [f32], a: f32, v: &[f16]) {
    use std::arch::x86_64::*;
    let n = o.len().min(v.len());
    let va = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n bounds both rows; unaligned loads and stores.
        let h = _mm_loadu_si128(v.as_ptr().add(i) as *const __m128i);
        let x = _mm256_cvtph_ps(h);
        let acc = _mm256_loadu_ps(o.as_ptr().add(i));
        // Multiply then add (no FMA), so the result equals the scalar twin bit for bit.
        _mm256_storeu_ps(
            o.as_mut_ptr().add(i),
            _mm256_add_ps(acc, _mm256_mul_ps(va, x)),
        );
        i += 8;
    }
    axpy_f16_scalar(&mut o[i..n], a, &v[i..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_axpy_equals_scalar() {
        for n in [1usize, 7, 8, 64, 100, 128] {
            let v: Vec<f16> = (0..n)
                .map(|i| f16::from_f32((i as f32 * 0.37).sin() * 3.0))
                .collect();
            let base: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let (mut a, mut b) = (base.clone(), base);
            axpy_f16(&mut a, 0.731, &v);
            axpy_f16_scalar(&mut b, 0.731, &v);
            assert_eq!(a, b);
        }
    }
}
