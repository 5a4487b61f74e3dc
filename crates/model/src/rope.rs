//! Rotary position embeddings, as ggml's `rope_ext` computes them: normal (adjacent pairs, Llama) or
//! NeoX (halves, Qwen) rotation; per-dimension frequency factors (Llama 3.1 `rope_freqs.weight`);
//! linear and YaRN scaling.

/// How the rotated pairs are laid out in a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(x[2i], x[2i+1])`: Llama's original layout (`LLAMA_ROPE_TYPE_NORM`).
    Normal,
    /// Pairs `(x[i], x[i + n_rot/2])`: GPT-NeoX layout, used by Qwen (`LLAMA_ROPE_TYPE_NEOX`).
    Neox,
}

/// YaRN parameters (llama.cpp's defaults: beta_fast 32, beta_slow 1, ext_factor 1).
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    /// Extrapolation mix factor (1 with YaRN scaling).
    pub ext_factor: f32,
    /// Attention magnitude factor given to `rope_yarn` (before its own log correction).
    pub attn_factor: f32,
    /// High-frequency correction boundary in rotations.
    pub beta_fast: f32,
    /// Low-frequency correction boundary in rotations.
    pub beta_slow: f32,
    /// Context length the model was trained at before scaling.
    pub n_ctx_orig: u32,
}

/// Everything needed to rotate a head at a position.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Pair layout.
    pub style: RopeStyle,
    /// Number of leading dimensions of each head that rotate.
    pub n_rot: usize,
    /// RoPE base frequency.
    pub freq_base: f32,
    /// 1 / scaling factor (1 without scaling).
    pub freq_scale: f32,
    /// YaRN correction, when the file asks for it.
    pub yarn: Option<Yarn>,
    /// Per-dimension frequency divisors `[n_rot / 2]` (`rope_freqs.weight`), when present.
    pub freq_factors: Option<Vec<f32>>,
}

impl RopeConfig {
    /// Fills `cos` and `sin` (each `[n_rot / 2]`) for position `pos`, as ggml's `rope_cache_init`:
    /// theta advances by repeated multiplication with `freq_base^(-2/n_rot)` in f32.
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        let half = self.n_rot / 2;
        let theta_scale = self.freq_base.powf(-2.0 / self.n_rot as f32);
        let (ext_factor, attn_factor, corr) = match &self.yarn {
            Some(y) => (
                y.ext_factor,
                y.attn_factor,
                yarn_corr_dims(
                    self.n_rot,
                    y.n_ctx_orig,
                    self.freq_base,
                    y.beta_fast,
                    y.beta_slow,
                ),
            ),
            None => (0.0, 1.0, [0.0, 0.0]),
        };
        let mut theta = pos as f32;
        for i in 0..half {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            let (c, s) = rope_yarn(
                theta / ff,
                self.freq_scale,
                corr,
                2 * i,
                ext_factor,
                attn_factor,
            );
            cos[i] = c;
            sin[i] = s;
            theta *= theta_scale;
        }
    }

    /// Rotates one head (`x.len() >= n_rot`) with precomputed `cos`/`sin` from [`RopeConfig::cos_sin`].
    pub fn rotate(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = self.n_rot / 2;
        match self.style {
            RopeStyle::Normal => {
                for i in 0..half {
                    let (x0, x1) = (x[2 * i], x[2 * i + 1]);
                    x[2 * i] = x0 * cos[i] - x1 * sin[i];
                    x[2 * i + 1] = x0 * sin[i] + x1 * cos[i];
                }
            }
            RopeStyle::Neox => {
                for i in 0..half {
                    let (x0, x1) = (x[i], x[i + half]);
                    x[i] = x0 * cos[i] - x1 * sin[i];
                    x[i + half] = x0 * sin[i] + x1 * cos[i];
                }
            }
        }
    }
}

fn rope_yarn_ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// ggml's `rope_yarn`: the angle mixes interpolation and extrapolation by the ramp, and the
/// magnitude grows by `1 + 0.1 ln(1/freq_scale)` when YaRN is on.
fn rope_yarn(
    theta_extrap: f32,
    freq_scale: f32,
    corr: [f32; 2],
    i0: usize,
    ext_factor: f32,
    mut mscale: f32,
) -> (f32, f32) {
    let theta_interp = freq_scale * theta_extrap;
    let mut theta = theta_interp;
    if ext_factor != 0.0 {
        let ramp_mix = rope_yarn_ramp(corr[0], corr[1], i0) * ext_factor;
        theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
    }
    (theta.cos() * mscale, theta.sin() * mscale)
}

fn yarn_corr_dim(n_dims: usize, n_ctx_orig: u32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

fn yarn_corr_dims(
    n_dims: usize,
    n_ctx_orig: u32,
    base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let start = yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, base).floor();
    let end = yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, base).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(style: RopeStyle) -> RopeConfig {
        RopeConfig {
            style,
            n_rot: 4,
            freq_base: 10000.0,
            freq_scale: 1.0,
            yarn: None,
            freq_factors: None,
        }
    }

    #[test]
    fn position_zero_is_identity() {
        let r = plain(RopeStyle::Neox);
        let (mut c, mut s) = ([0.0; 2], [0.0; 2]);
        r.cos_sin(0, &mut c, &mut s);
        let mut x = [1.0, 2.0, 3.0, 4.0];
        r.rotate(&mut x, &c, &s);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn rotation_preserves_norm_and_pairs() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let r = plain(style);
            let (mut c, mut s) = ([0.0; 2], [0.0; 2]);
            r.cos_sin(7, &mut c, &mut s);
            let mut x = [1.0f32, 0.0, 0.0, 0.0];
            r.rotate(&mut x, &c, &s);
            let partner = if style == RopeStyle::Normal { 1 } else { 2 };
            assert!((x[0] - 7f32.cos()).abs() < 1e-6);
            assert!((x[partner] - 7f32.sin()).abs() < 1e-6);
        }
    }
}
