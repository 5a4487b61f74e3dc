//! Architectures as data: each supported `general.architecture` is one [`ArchSpec`] row, written as
//! its differences from [`BASE`] (a Llama-style decoder). Adding an architecture is a new row (and a
//! fixture), never a new forward pass; new behaviour is a new field or enum variant here.

pub use crate::ops::Activation;
use crate::rope::RopeStyle;

/// Whether a tensor must be present, may be present, or must not be looked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// The loader fails when the tensor is missing.
    Required,
    /// Loaded when present.
    Optional,
    /// Not part of this architecture.
    Absent,
}

/// The feed-forward network of every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnKind {
    /// A gated FFN over `ffn_gate`, `ffn_up`, `ffn_down`: `down(act(gate x) * up x)`.
    Dense,
    /// Routed experts: `ffn_gate_inp` router, stacked `ffn_{gate,up,down}_exps`.
    Moe,
}

/// What the token embeddings are multiplied by before the first layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbdScale {
    /// Used as stored.
    One,
    /// By `sqrt(n_embd)` (Gemma: HF `GemmaModel` normalizer, llama.cpp `build_inp_embd(.., sqrtf(n_embd))`).
    SqrtEmbd,
}

/// The scale of the attention scores `q · k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnScale {
    /// `1 / sqrt(head_dim)`.
    HeadDim,
    /// `1 / sqrt(n_embd / n_head)` for a model of `n_layer` layers, else `1 / sqrt(head_dim)`:
    /// Gemma's `query_pre_attn_scalar`, which GGUF does not carry; llama.cpp keys it on the layer
    /// count (Gemma 3 27B: 62 layers) as here.
    EmbdPerHeadAtLayers(usize),
}

/// Which layers attend within a sliding window of `{arch}.attention.sliding_window` positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swa {
    /// Every layer attends to the whole context; the window key is not read.
    None,
    /// When there is a window, layer `l` slides unless `l % period == period - 1`
    /// (`period` 0: every layer slides, Mistral-style), as llama.cpp's `set_swa_pattern`;
    /// `{arch}.attention.sliding_window_pattern` overrides the period, or lists the layers as bools.
    Pattern {
        /// Layers per group of sliding layers and one global layer, when the file does not say.
        period: u32,
        /// The window when the file has no `sliding_window` key (Gemma 2: 4096); `None`: no window.
        default_window: Option<usize>,
    },
}

/// How the sliding-window layers rotate Q and K.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SwaRope {
    /// As the global layers, unless the file's `{arch}.rope.freq_base_swa` gives another base
    /// (Gemma 2: llama.cpp copies the global base and scale).
    Global,
    /// With `{arch}.rope.freq_base_swa`, else this base, and never scaled (Gemma 3: 10,000,
    /// llama.cpp's `rope_freq_base_train_swa` default).
    Base(f32),
}

/// Soft-capping `cap * tanh(x / cap)` of the attention scores or of the final logits, from
/// `{arch}.attn_logit_softcapping` / `{arch}.final_logit_softcapping`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Softcap {
    /// Never; the key is not read.
    Off,
    /// As the file says; off when the key is absent or 0 (Gemma 3 reads the final one).
    FromFile,
    /// As the file says, this cap when the key is absent (Gemma 2: 50 and 30, llama.cpp's defaults).
    Default(f32),
}

/// The switches that tell one decoder-only transformer from another.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchSpec {
    /// `general.architecture`, also the prefix of the hyperparameter keys (`{name}.block_count`).
    pub name: &'static str,
    /// RoPE pair layout.
    pub rope: RopeStyle,
    /// Q/K/V projection biases (Qwen2 has them).
    pub qkv_bias: Presence,
    /// Per-head RMSNorm of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`; Qwen3, as HF `Qwen3Attention`).
    pub qk_norm: Presence,
    /// RMSNorm of the attention output and of the FFN output before each joins the residual stream
    /// (`post_attention_norm`, `post_ffw_norm`; Gemma 2/3, as HF `Gemma3DecoderLayer`).
    pub post_norms: Presence,
    /// Dense or routed FFN.
    pub ffn: FfnKind,
    /// The gated FFN's activation.
    pub act: Activation,
    /// Routed experts' top-k weights renormalised to sum to 1 unless the file says otherwise
    /// (`{arch}.expert_weights_norm`); Qwen3-MoE always does (HF `norm_topk_prob = true`).
    pub moe_norm_topk: bool,
    /// Scale of the token embeddings.
    pub embd_scale: EmbdScale,
    /// Scale of the attention scores.
    pub attn_scale: AttnScale,
    /// Sliding-window layers.
    pub swa: Swa,
    /// RoPE of the sliding-window layers.
    pub swa_rope: SwaRope,
    /// Soft-capping of the attention scores (Gemma 2).
    pub attn_softcap: Softcap,
    /// Soft-capping of the final logits (Gemma 2; Gemma 3 reads the key, its files leave it out).
    pub logit_softcap: Softcap,
}

/// The row every architecture starts from: a Llama-style decoder (normal RoPE, pre-norms only,
/// dense SwiGLU FFN, scores scaled by `1 / sqrt(head_dim)`, no sliding window).
pub const BASE: ArchSpec = ArchSpec {
    name: "",
    rope: RopeStyle::Normal,
    qkv_bias: Presence::Absent,
    qk_norm: Presence::Absent,
    post_norms: Presence::Absent,
    ffn: FfnKind::Dense,
    act: Activation::Silu,
    moe_norm_topk: false,
    embd_scale: EmbdScale::One,
    attn_scale: AttnScale::HeadDim,
    swa: Swa::None,
    swa_rope: SwaRope::Global,
    attn_softcap: Softcap::Off,
    logit_softcap: Softcap::Off,
};

/// Every architecture Hearth runs.
pub const ARCHS: &[ArchSpec] = &[
    ArchSpec {
        name: "llama",
        qkv_bias: Presence::Optional,
        ..BASE
    },
    ArchSpec {
        name: "qwen2",
        rope: RopeStyle::Neox,
        qkv_bias: Presence::Required,
        ..BASE
    },
    ArchSpec {
        name: "qwen3",
        rope: RopeStyle::Neox,
        qk_norm: Presence::Required,
        ..BASE
    },
    ArchSpec {
        name: "qwen3moe",
        rope: RopeStyle::Neox,
        qk_norm: Presence::Required,
        ffn: FfnKind::Moe,
        moe_norm_topk: true,
        ..BASE
    },
    // As llama.cpp's `llama_model_gemma2` and HF `Gemma2ForCausalLM`: sliding and global layers
    // alternate (window 4096 unless the file says), GELU (tanh) FFN, pre- and post-norms,
    // embeddings scaled by sqrt(n_embd), attention scores and final logits soft-capped.
    ArchSpec {
        name: "gemma2",
        rope: RopeStyle::Neox,
        post_norms: Presence::Required,
        act: Activation::GeluTanh,
        embd_scale: EmbdScale::SqrtEmbd,
        attn_scale: AttnScale::EmbdPerHeadAtLayers(46),
        swa: Swa::Pattern {
            period: 2,
            default_window: Some(4096),
        },
        attn_softcap: Softcap::Default(50.0),
        logit_softcap: Softcap::Default(30.0),
        ..BASE
    },
    // As llama.cpp's `llama_model_gemma3` and HF `Gemma3ForCausalLM` (text): Gemma 2 with five
    // sliding layers per global one (when the file has a window), a local RoPE base of its own,
    // per-head Q/K norms and no attention soft-capping.
    ArchSpec {
        name: "gemma3",
        rope: RopeStyle::Neox,
        qk_norm: Presence::Required,
        post_norms: Presence::Required,
        act: Activation::GeluTanh,
        embd_scale: EmbdScale::SqrtEmbd,
        attn_scale: AttnScale::EmbdPerHeadAtLayers(62),
        swa: Swa::Pattern {
            period: 6,
            default_window: None,
        },
        swa_rope: SwaRope::Base(10_000.0),
        logit_softcap: Softcap::FromFile,
        ..BASE
    },
];

/// The spec of architecture `name`, if Hearth runs it.
pub fn arch_spec(name: &str) -> Option<&'static ArchSpec> {
    ARCHS.iter().find(|a| a.name == name)
}

/// The names of every architecture Hearth runs, comma-separated (for errors).
pub fn arch_names() -> String {
    ARCHS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_exhaustive_and_unique() {
        let names: Vec<_> = ARCHS.iter().map(|a| a.name).collect();
        assert_eq!(
            names,
            ["llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3"]
        );
        for n in names {
            assert_eq!(arch_spec(n).unwrap().name, n);
        }
        assert!(arch_spec("gpt-j").is_none());
        assert!(
            arch_spec("").is_none(),
            "the base row is not an architecture"
        );
        assert_eq!(
            arch_names(),
            "llama, qwen2, qwen3, qwen3moe, gemma2, gemma3"
        );
    }
}
