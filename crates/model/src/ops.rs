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

/// Independent f64 partial sums in [`rms_scale`].
const SQ_CHAINS: usize = 8;

/// `1 / sqrt(mean(x²) + eps)`, the squares in f32 and summed in f64 as ggml's RMSNorm does.
///
/// The sum runs in [`SQ_CHAINS`] partial sums (element `i` into sum `i % SQ_CHAINS`, the tail
/// after the last whole group into the first), added together in order at the end: a fixed order
/// for a given row length, so a row's result does not depend on the batch or the thread. One
/// sequential sum, ggml's order, was a dependent f64 add per element: 3% of SmolLM2's pp512 on a
/// Zen 5 (`perf`, `norm_rows`). An f64 sum of at most a few thousand f32 squares rounds to the
/// same f32 mean in either order except within ~2⁻²⁹ of a rounding boundary.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mut part = [0f64; SQ_CHAINS];
    let mut groups = x.chunks_exact(SQ_CHAINS);
    for g in &mut groups {
        for (p, &v) in part.iter_mut().zip(g) {
            *p += (v * v) as f64;
        }
    }
    for &v in groups.remainder() {
        part[0] += (v * v) as f64;
    }
    let sum = part.iter().fold(0f64, |s, &p| s + p);
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// The activation of a gated FFN: `act(gate x) * (up x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU: Llama, Qwen).
    Silu,
    /// GELU with the tanh approximation (GeGLU: Gemma, HF `gelu_pytorch_tanh`).
    GeluTanh,
}

impl Activation {
    /// The activation of one value.
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => silu(x),
            Activation::GeluTanh => gelu_tanh(x),
        }
    }
}

/// SiLU, `x / (1 + e^-x)`, as ggml's `ggml_silu_f32` (with [`exp`]).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// GELU (tanh approximation), `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, written as the
/// equal `x / (1 + e^(-2 sqrt(2/pi) (x + 0.044715 x^3)))` (since `(1 + tanh u) / 2 = 1 / (1 + e^-2u)`)
/// so it takes the same [`exp`] as SiLU and has no cancellation near 0. ggml's CPU `geglu` instead
/// looks the value up in an f16 table (rounding the input and the result to f16); this is the f32
/// formula of its `ggml_gelu_f32`, within a few ulp.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
    const A: f32 = 0.044_715;
    x / (1.0 + exp(-TWO_SQRT_2_OVER_PI * (x * (1.0 + A * x * x))))
}

/// `gate[i] = act(gate[i]) * up[i]`: the gated linear unit of a dense or expert FFN (SwiGLU,
/// GeGLU), in place in `gate`. Vectorised at the kernel level the CPU has; the same operations (and
/// bits) at every level.
pub fn glu(act: Activation, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    {
        use hearth_quant::Level;
        match hearth_quant::kernel_level() {
            // SAFETY: the level is at most what the CPU supports (hearth_quant checks).
            Level::Avx512 => return unsafe { glu_avx512(act, gate, up) },
            Level::Avx2 => return unsafe { glu_avx2(act, gate, up) },
            Level::Scalar => {}
        }
    }
    glu_body(act, gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn glu_avx512(act: Activation, gate: &mut [f32], up: &[f32]) {
    glu_body(act, gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn glu_avx2(act: Activation, gate: &mut [f32], up: &[f32]) {
    glu_body(act, gate, up)
}

/// One loop per activation, so each vectorises on its own.
#[inline(always)]
fn glu_body(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = silu(*g) * u;
            }
        }
        Activation::GeluTanh => {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = gelu_tanh(*g) * u;
            }
        }
    }
}

/// Logit soft-capping, `cap * tanh(x / cap)` for every value (Gemma 2's `final_logit_softcapping`,
/// as llama.cpp's scale, `tanh`, scale).
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = (*v / cap).tanh() * cap;
    }
}

/// `e^x` (inputs above 88 saturate at `e^88`), within 2 ulp, with the
/// same operations on every target: `x = n ln 2 + r`, a degree-6 polynomial for `e^r` (Cephes'
/// `expf` coefficients) and `2^n` from the exponent bits. Below -87.3 the result is 0.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(-87.3, 88.0);
    let shifted = xc.mul_add(LOG2E, MAGIC);
    let n = shifted - MAGIC;
    let ni = shifted.to_bits() as i32 - MAGIC.to_bits() as i32;
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let mut y = 1.987_569_1e-4f32;
    y = y.mul_add(r, 1.398_199_9e-3);
    y = y.mul_add(r, 8.333_452e-3);
    y = y.mul_add(r, 4.166_579_6e-2);
    y = y.mul_add(r, 0.166_666_65);
    y = y.mul_add(r, 0.5);
    y = y.mul_add(r * r, r + 1.0);
    let pow2 = f32::from_bits(((ni + 127) as u32) << 23);
    if x < -87.3 {
        0.0
    } else {
        y * pow2
    }
}

/// `tanh(x)` as `1 - 2 / (e^(2x) + 1)` with [`exp`]: the same operations on every target, so the
/// attention kernels' vector form gives the same bits (libm's `tanhf` differs between platforms).
/// Within 2e-7 of the exact value (absolute), which is what scores soft-capped at a few tens need.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
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
    fn glu_levels_agree_bit_for_bit() {
        let g0: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.07).collect();
        let up: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.3).sin()).collect();
        type Exact = fn(f64) -> f64;
        let silu: Exact = |g| g / (1.0 + (-g).exp());
        let gelu: Exact = |g| {
            0.5 * g
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
        };
        for (act, exact) in [(Activation::Silu, silu), (Activation::GeluTanh, gelu)] {
            let mut want = g0.clone();
            glu_body(act, &mut want, &up);
            for (i, (w, (g, u))) in want.iter().zip(g0.iter().zip(&up)).enumerate() {
                let exact = exact(*g as f64) * *u as f64;
                assert!(
                    (*w as f64 - exact).abs() <= 1e-6 * (1.0 + exact.abs()),
                    "{act:?} {i}: {w} vs {exact}"
                );
            }
            #[cfg(target_arch = "x86_64")]
            for level in hearth_quant::simd::available_levels() {
                let mut got = g0.clone();
                match level {
                    // SAFETY: available_levels lists only what the CPU has.
                    hearth_quant::Level::Avx512 => unsafe { glu_avx512(act, &mut got, &up) },
                    hearth_quant::Level::Avx2 => unsafe { glu_avx2(act, &mut got, &up) },
                    hearth_quant::Level::Scalar => glu_body(act, &mut got, &up),
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{act:?} {level}");
            }
        }
    }

    #[test]
    fn gelu_tanh_matches_the_tanh_form() {
        // ggml's ggml_gelu_f32, in f64, over the range where it is not 0 or x.
        let mut x = -12.0f32;
        while x <= 12.0 {
            let g = x as f64;
            let want =
                0.5 * g * (1.0 + (0.797_884_560_802_865_4 * g * (1.0 + 0.044715 * g * g)).tanh());
            let got = gelu_tanh(x) as f64;
            assert!(
                (got - want).abs() <= 4e-7 * (1.0 + want.abs()),
                "gelu({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert_eq!(gelu_tanh(100.0), 100.0);
        assert!(gelu_tanh(-100.0).abs() < 1e-30);
    }

    #[test]
    fn tanh_is_close_to_std() {
        let mut x = -30.0f32;
        while x <= 30.0 {
            let want = (x as f64).tanh();
            let got = tanh(x) as f64;
            assert!((got - want).abs() < 2e-7, "tanh({x}) = {got}, want {want}");
            x += 0.0071;
        }
        assert_eq!((tanh(0.0), tanh(100.0), tanh(-100.0)), (0.0, 1.0, -1.0));
    }

    #[test]
    fn softcap_bounds_and_keeps_small_values() {
        let mut x = vec![0.0f32, 1.0, -3.0, 1e4, -1e4];
        softcap(&mut x, 30.0);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 30.0 * (1.0f32 / 30.0).tanh()).abs() < 1e-6 && (x[1] - 1.0).abs() < 1e-3);
        assert!((x[2] + 3.0).abs() < 0.01);
        assert_eq!((x[3], x[4]), (30.0, -30.0));
    }

    #[test]
    fn exp_is_close_to_std() {
        let mut worst = 0f64;
        let mut x = -90.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            if want > 1e-37 {
                worst = worst.max(((got - want) / want).abs());
            } else {
                assert!(got < 2e-37, "exp({x}) = {got}");
            }
            x += 0.001_37;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn rms_norm_unit_weight() {
        let mut x = vec![3.0f32, 4.0];
        rms_norm(&mut x, &[1.0, 1.0], 0.0);
        let rms = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / rms).abs() < 1e-6 && (x[1] - 4.0 / rms).abs() < 1e-6);
    }

    /// The partial sums give ggml's scale (one sequential f64 sum) on rows of every length up to
    /// a large hidden size, tails included.
    #[test]
    fn rms_scale_matches_the_sequential_sum() {
        let mut rng = crate::test_rng::Rng(0x2545_f491_4f6c_dd1d);
        for len in (1..=64).chain([576, 577, 1536, 2048, 4095, 5120]) {
            let x = rng.row(len, 4.0);
            let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
            let mean = (sum / len as f64) as f32;
            let want = 1.0 / (mean + 1e-6).sqrt();
            assert_eq!(
                rms_scale(&x, 1e-6).to_bits(),
                want.to_bits(),
                "length {len}"
            );
        }
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0f32, 2.0, 3.0, -1e9];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
    }
}
