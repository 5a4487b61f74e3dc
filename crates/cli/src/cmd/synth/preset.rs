//! The named shapes `hearth synth` writes.

/// Routed experts of a MoE preset.
#[derive(Clone, Copy, Debug)]
pub struct Experts {
    /// Experts per layer.
    pub count: usize,
    /// Experts each token uses.
    pub used: usize,
    /// Hidden size of one expert.
    pub ff: usize,
}

/// A model shape: everything written as `{arch}.*` metadata, and the tensor shapes that follow.
#[derive(Clone, Debug)]
pub struct Preset {
    /// The name on the command line.
    pub name: &'static str,
    /// `general.architecture`.
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    /// Dense FFN size; for MoE presets the `feed_forward_length` the real model's config carries.
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ctx: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// Vocabulary rows; `None` takes the tokenizer's own size.
    pub n_vocab: Option<usize>,
    /// `None` for dense presets.
    pub experts: Option<Experts>,
    /// The LM head reads `token_embd` (no `output.weight`).
    pub tied: bool,
    /// `{arch}.attention.sliding_window`: the architecture's sliding layers attend this far back.
    pub sliding_window: Option<usize>,
    /// `post_attention_norm` and `post_ffw_norm` in every layer (Gemma).
    pub post_norms: bool,
    /// `attn_q_norm` and `attn_k_norm` in every layer (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// `{arch}.attn_logit_softcapping` and `{arch}.final_logit_softcapping` (Gemma 2).
    pub softcaps: Option<(f32, f32)>,
}

/// Every preset.
pub fn presets() -> Vec<Preset> {
    vec![
        // Qwen3-30B-A3B-Instruct-2507 / Qwen3-Coder-30B-A3B (config.json): rope_theta 1e7,
        // max_position_embeddings 262144, intermediate_size 6144, moe_intermediate_size 768.
        Preset {
            name: "qwen3-moe-30b-a3b",
            arch: "qwen3moe",
            n_layer: 48,
            n_embd: 2048,
            n_ff: 6144,
            n_head: 32,
            n_head_kv: 4,
            head_dim: 128,
            n_ctx: 262_144,
            rope_base: 1e7,
            rms_eps: 1e-6,
            n_vocab: Some(151_936),
            experts: Some(Experts {
                count: 128,
                used: 8,
                ff: 768,
            }),
            tied: false,
            sliding_window: None,
            post_norms: false,
            qk_norm: true,
            softcaps: None,
        },
        // The fixtures' tiny-qwen3moe shape (q_dim 512 != hidden 256), with four layers so Q4_K_M's
        // alternate-layer rule shows.
        Preset {
            name: "qwen3-moe-tiny",
            arch: "qwen3moe",
            n_layer: 4,
            n_embd: 256,
            n_ff: 512,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 64,
            n_ctx: 4096,
            rope_base: 1e6,
            rms_eps: 1e-6,
            n_vocab: None,
            experts: Some(Experts {
                count: 8,
                used: 2,
                ff: 256,
            }),
            tied: false,
            sliding_window: None,
            post_norms: false,
            qk_norm: true,
            softcaps: None,
        },
        // Qwen3-0.6B (config.json): tie_word_embeddings true, max_position_embeddings 40960.
        Preset {
            name: "qwen3-dense-0.6b",
            arch: "qwen3",
            n_layer: 28,
            n_embd: 1024,
            n_ff: 3072,
            n_head: 16,
            n_head_kv: 8,
            head_dim: 128,
            n_ctx: 40_960,
            rope_base: 1e6,
            rms_eps: 1e-6,
            n_vocab: Some(151_936),
            experts: None,
            tied: true,
            sliding_window: None,
            post_norms: false,
            qk_norm: true,
            softcaps: None,
        },
        // A small Gemma 3: eight layers (sliding but for layer 5, Gemma 3's five-to-one pattern), a
        // window of 16 positions so the fixtures' short prompts run past it, one KV head, GELU,
        // post-norms, tied embeddings scaled by sqrt(n_embd).
        Preset {
            name: "gemma3-tiny",
            arch: "gemma3",
            n_layer: 8,
            n_embd: 256,
            n_ff: 512,
            n_head: 4,
            n_head_kv: 1,
            head_dim: 64,
            n_ctx: 2048,
            rope_base: 1e6,
            rms_eps: 1e-6,
            n_vocab: None,
            experts: None,
            tied: true,
            sliding_window: Some(16),
            post_norms: true,
            qk_norm: true,
            softcaps: None,
        },
        // A small Gemma 2: four layers (0 and 2 slide), a window of 16, no Q/K norms, two KV
        // heads, and the soft-caps lowered from Gemma 2's 50 (scores) and 30 (logits) to 1.5 and 3
        // so that random weights reach them.
        Preset {
            name: "gemma2-tiny",
            arch: "gemma2",
            n_layer: 4,
            n_embd: 256,
            n_ff: 512,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_ctx: 2048,
            rope_base: 10_000.0,
            rms_eps: 1e-6,
            n_vocab: None,
            experts: None,
            tied: true,
            sliding_window: Some(16),
            post_norms: true,
            qk_norm: false,
            softcaps: Some((1.5, 3.0)),
        },
    ]
}

/// The preset called `name`.
pub fn preset(name: &str) -> Option<Preset> {
    presets().into_iter().find(|p| p.name == name)
}
