//! Hyperparameters read from `{arch}.*` metadata.

use hearth_gguf::Metadata;

use crate::arch::{arch_spec, ArchSpec, AttnScale, EmbdScale, FfnKind, Softcap, Swa, SwaRope};
use crate::error::ModelError;
use crate::rope::{RopeConfig, Yarn};

/// The routed-expert hyperparameters of a MoE model.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per layer (`expert_count`).
    pub n_expert: usize,
    /// Experts chosen per token (`expert_used_count`).
    pub n_expert_used: usize,
    /// Hidden size of one expert (`expert_feed_forward_length`).
    pub n_ff_exp: usize,
    /// Renormalise the chosen experts' weights to sum to 1.
    pub norm_topk: bool,
    /// Multiplier applied to the expert weights (`expert_weights_scale`, 1 when absent).
    pub weights_scale: f32,
}

/// What differs from layer to layer (llama.cpp's per-layer hyperparameters: `is_swa(il)`, the
/// layer's RoPE base and scale).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerConfig {
    /// A query at position `p` attends to the keys at `[p + 1 - window, p]` (clamped at 0) when set,
    /// else to `[0, p]`: a sliding window of `window` positions, its own included.
    pub window: Option<usize>,
    /// Which of [`Config::ropes`] rotates this layer's Q and K.
    pub rope: usize,
    /// The scale of the attention scores `q · k`.
    pub attn_scale: f32,
    /// Soft-capping of the scaled scores, `cap * tanh(s / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
}

/// Everything the decoder needs to know about a model's shape.
#[derive(Clone, Debug)]
pub struct Config {
    /// The architecture row.
    pub arch: &'static ArchSpec,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Dense FFN hidden size (0 for pure-MoE models that leave it out).
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Dimension of one query/key head (`key_length`, else `n_embd / n_head`).
    pub head_dim: usize,
    /// Dimension of one value head (`value_length`, else `head_dim`).
    pub head_dim_v: usize,
    /// Trained context length.
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// The RoPE tables layers pick from ([`LayerConfig::rope`]): the model's, then the sliding-window
    /// layers' when they have their own (Gemma 3: base 10,000, never scaled). Frequency factors are attached
    /// by the loader. Every table rotates the same `n_rot` dimensions.
    pub ropes: Vec<RopeConfig>,
    /// Per-layer attributes `[n_layer]`.
    pub layers: Vec<LayerConfig>,
    /// What the token embeddings are multiplied by (1, or `sqrt(n_embd)` for Gemma).
    pub embd_scale: f32,
    /// Final logit soft-capping `cap * tanh(logit / cap)` (Gemma 2's `final_logit_softcapping`).
    pub logit_softcap: Option<f32>,
    /// Vocabulary size (rows of `token_embd`), set by the loader.
    pub n_vocab: usize,
    /// Routed experts, for MoE architectures.
    pub moe: Option<MoeConfig>,
}

impl Config {
    /// Reads the hyperparameters of the file's architecture.
    pub fn from_metadata(meta: &Metadata) -> Result<Config, ModelError> {
        let arch_name = meta
            .get_str("general.architecture")
            .ok_or(ModelError::NoArchitecture)?;
        let arch = arch_spec(arch_name)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(arch_name.to_string()))?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req_usize = |k: &str| -> Result<usize, ModelError> {
            let full = key(k);
            match meta.get_u64(&full) {
                Some(v) if v > 0 && v <= (1 << 24) => Ok(v as usize),
                Some(v) => Err(ModelError::Hyperparameter {
                    key: full,
                    detail: Some(format!("{v} is out of range")),
                }),
                None => Err(ModelError::Hyperparameter {
                    key: full,
                    detail: None,
                }),
            }
        };
        let opt_usize = |k: &str| -> Result<Option<usize>, ModelError> {
            if meta.get(&key(k)).is_none() {
                return Ok(None);
            }
            req_usize(k).map(Some)
        };

        let n_layer = req_usize("block_count")?;
        let n_embd = req_usize("embedding_length")?;
        let n_head = req_usize("attention.head_count")?;
        let n_head_kv = opt_usize("attention.head_count_kv")?.unwrap_or(n_head);
        if n_head % n_head_kv != 0 {
            return Err(ModelError::Hyperparameter {
                key: key("attention.head_count_kv"),
                detail: Some(format!(
                    "{n_head} query heads are not a multiple of {n_head_kv} KV heads"
                )),
            });
        }
        let head_dim = match opt_usize("attention.key_length")? {
            Some(d) => d,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(ModelError::Hyperparameter {
                    key: key("attention.key_length"),
                    detail: Some(format!(
                        "absent and {n_embd} is not a multiple of {n_head} heads"
                    )),
                })
            }
        };
        let head_dim_v = opt_usize("attention.value_length")?.unwrap_or(head_dim);
        for (k, d) in [
            ("attention.key_length", head_dim),
            ("attention.value_length", head_dim_v),
        ] {
            if d == 0 || d > crate::attention::MAX_HEAD_DIM {
                return Err(ModelError::Hyperparameter {
                    key: key(k),
                    detail: Some(format!(
                        "head dimension {d}: not within the 1 to {} supported",
                        crate::attention::MAX_HEAD_DIM
                    )),
                });
            }
        }
        let n_ff = match arch.ffn {
            FfnKind::Dense => req_usize("feed_forward_length")?,
            FfnKind::Moe => opt_usize("feed_forward_length")?.unwrap_or(0),
        };
        let n_ctx_train = opt_usize("context_length")?.unwrap_or(4096);
        let rms_eps = meta
            .get_f32(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5);
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(ModelError::Hyperparameter {
                key: key("attention.layer_norm_rms_epsilon"),
                detail: Some(format!("{rms_eps}")),
            });
        }

        let n_rot = opt_usize("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::Hyperparameter {
                key: key("rope.dimension_count"),
                detail: Some(format!(
                    "{n_rot} must be even and at most the head dimension {head_dim}"
                )),
            });
        }
        let freq_base = meta.get_f32(&key("rope.freq_base")).unwrap_or(10000.0);
        if !(freq_base.is_finite() && freq_base > 1.0) {
            return Err(ModelError::Hyperparameter {
                key: key("rope.freq_base"),
                detail: Some(format!("{freq_base}")),
            });
        }
        let scaling = meta.get_str(&key("rope.scaling.type")).unwrap_or("none");
        let factor = meta
            .get_f32(&key("rope.scaling.factor"))
            .or_else(|| meta.get_f32(&key("rope.scale_linear")))
            .unwrap_or(1.0);
        let factor_ok = factor.is_finite() && factor > 0.0;
        let (freq_scale, yarn) = match scaling {
            "none" => (1.0, None),
            "linear" if factor_ok => (1.0 / factor, None),
            "yarn" if factor_ok => {
                let n_ctx_orig = opt_usize("rope.scaling.original_context_length")?
                    .unwrap_or(n_ctx_train) as u32;
                // llama.cpp (llama-context.cpp) sets attn_factor = get_mscale(factor) * 1/(1 + 0.1 ln factor)
                // so that rope_yarn's own magnitude correction is applied once; kept in f32 as there.
                let mscale = if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * factor.ln() + 1.0
                };
                let attn_factor = mscale * (1.0 / (1.0 + 0.1 * factor.ln()));
                let attn_factor = attn_factor
                    * meta
                        .get_f32(&key("rope.scaling.attn_factor"))
                        .unwrap_or(1.0);
                (
                    1.0 / factor,
                    Some(Yarn {
                        ext_factor: 1.0,
                        attn_factor,
                        beta_fast: meta
                            .get_f32(&key("rope.scaling.yarn_beta_fast"))
                            .unwrap_or(32.0),
                        beta_slow: meta
                            .get_f32(&key("rope.scaling.yarn_beta_slow"))
                            .unwrap_or(1.0),
                        n_ctx_orig,
                    }),
                )
            }
            "linear" | "yarn" => {
                return Err(ModelError::Hyperparameter {
                    key: key("rope.scaling.factor"),
                    detail: Some(format!("{factor}")),
                })
            }
            other => {
                return Err(ModelError::Hyperparameter {
                    key: key("rope.scaling.type"),
                    detail: Some(format!(
                        "unsupported RoPE scaling '{other}' (supported: none, linear, yarn)"
                    )),
                })
            }
        };

        let moe = match arch.ffn {
            FfnKind::Dense => None,
            FfnKind::Moe => {
                let n_expert = req_usize("expert_count")?;
                let n_expert_used = req_usize("expert_used_count")?;
                if n_expert_used > n_expert {
                    return Err(ModelError::Hyperparameter {
                        key: key("expert_used_count"),
                        detail: Some(format!(
                            "{n_expert_used} is more than expert_count {n_expert}"
                        )),
                    });
                }
                Some(MoeConfig {
                    n_expert,
                    n_expert_used,
                    n_ff_exp: req_usize("expert_feed_forward_length")?,
                    norm_topk: meta
                        .get_bool(&key("expert_weights_norm"))
                        .unwrap_or(arch.moe_norm_topk),
                    weights_scale: meta
                        .get_f32(&key("expert_weights_scale"))
                        .filter(|s| *s != 0.0)
                        .unwrap_or(1.0),
                })
            }
        };

        let rope = RopeConfig {
            style: arch.rope,
            n_rot,
            freq_base,
            freq_scale,
            yarn,
            freq_factors: None,
        };
        let window = match arch.swa {
            Swa::None => None,
            // llama.cpp: a window of 0 turns sliding off.
            Swa::Pattern { .. } if meta.get_u64(&key("attention.sliding_window")) == Some(0) => {
                None
            }
            Swa::Pattern { default_window, .. } => {
                opt_usize("attention.sliding_window")?.or(default_window)
            }
        };
        let swa_layers = match (arch.swa, window) {
            (Swa::Pattern { period, .. }, Some(_)) => swa_pattern(meta, &key, n_layer, period)?,
            _ => vec![false; n_layer],
        };
        let mut ropes = vec![rope];
        if swa_layers.contains(&true) {
            let file_base = meta.get_f32(&key("rope.freq_base_swa"));
            let local = match (arch.swa_rope, file_base) {
                (SwaRope::Global, None) => None,
                // llama.cpp: Gemma 2's local layers keep the global scale.
                (SwaRope::Global, Some(base)) => Some((base, ropes[0].freq_scale)),
                // llama.cpp: `rope_freq_scale_train_swa` is 1.
                (SwaRope::Base(default), base) => Some((base.unwrap_or(default), 1.0)),
            };
            if let Some((freq_base, freq_scale)) = local {
                if !(freq_base.is_finite() && freq_base > 1.0) {
                    return Err(ModelError::Hyperparameter {
                        key: key("rope.freq_base_swa"),
                        detail: Some(format!("{freq_base}")),
                    });
                }
                // YaRN's other parameters are the context's, shared by every layer.
                ropes.push(RopeConfig {
                    freq_base,
                    freq_scale,
                    ..ropes[0].clone()
                });
            }
        }
        let attn_scale = match arch.attn_scale {
            AttnScale::EmbdPerHeadAtLayers(n) if n == n_layer => {
                1.0 / ((n_embd / n_head) as f32).sqrt()
            }
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let attn_softcap = softcap(meta, &key, "attn_logit_softcapping", arch.attn_softcap)?;
        let local_rope = ropes.len() - 1;
        let layers = swa_layers
            .iter()
            .map(|&swa| LayerConfig {
                window: if swa { window } else { None },
                rope: if swa { local_rope } else { 0 },
                attn_scale,
                attn_softcap,
            })
            .collect();
        let embd_scale = match arch.embd_scale {
            EmbdScale::One => 1.0,
            EmbdScale::SqrtEmbd => (n_embd as f32).sqrt(),
        };
        let logit_softcap = softcap(meta, &key, "final_logit_softcapping", arch.logit_softcap)?;

        Ok(Config {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_ctx_train,
            rms_eps,
            ropes,
            layers,
            embd_scale,
            logit_softcap,
            n_vocab: 0,
            moe,
        })
    }

    /// The model's own RoPE table (the global layers').
    pub fn rope(&self) -> &RopeConfig {
        &self.ropes[0]
    }

    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of all key heads together (one token's K row in the cache).
    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of all value heads together.
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }

    /// The shape of one token's cached keys and values.
    pub fn kv_dims(&self) -> crate::KvDims {
        crate::KvDims {
            n_kv: self.n_head_kv,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim_v,
        }
    }
}

/// Which layers slide, as llama.cpp's `load_swa_pattern`: `{arch}.attention.sliding_window_pattern`
/// as a bool per layer, or as the period (else `period`), where layer `l` slides unless
/// `l % period == period - 1` (period 0: every layer slides).
fn swa_pattern(
    meta: &Metadata,
    key: &dyn Fn(&str) -> String,
    n_layer: usize,
    period: u32,
) -> Result<Vec<bool>, ModelError> {
    let k = key("attention.sliding_window_pattern");
    let bad = |detail: String| ModelError::Hyperparameter {
        key: k.clone(),
        detail: Some(detail),
    };
    let period = match meta.get(&k) {
        None => period,
        Some(hearth_gguf::Value::Array(hearth_gguf::Array::Bool(v))) => {
            if v.len() != n_layer {
                return Err(bad(format!("{} entries for {n_layer} layers", v.len())));
            }
            return Ok(v.clone());
        }
        Some(v) => match v.as_u32() {
            Some(p) => p,
            None => return Err(bad("neither a period nor a bool per layer".into())),
        },
    };
    Ok((0..n_layer as u32)
        .map(|l| period == 0 || l % period < period - 1)
        .collect())
}

/// A soft-cap as `spec` says: the file's `{arch}.{name}`, its default when absent; 0 turns it off
/// (as in llama.cpp).
fn softcap(
    meta: &Metadata,
    key: &dyn Fn(&str) -> String,
    name: &str,
    spec: Softcap,
) -> Result<Option<f32>, ModelError> {
    let cap = match spec {
        Softcap::Off => return Ok(None),
        Softcap::FromFile => meta.get_f32(&key(name)),
        Softcap::Default(d) => Some(meta.get_f32(&key(name)).unwrap_or(d)),
    };
    match cap {
        None | Some(0.0) => Ok(None),
        Some(c) if c.is_finite() && c > 0.0 => Ok(Some(c)),
        Some(c) => Err(ModelError::Hyperparameter {
            key: key(name),
            detail: Some(format!("{c}")),
        }),
    }
}
