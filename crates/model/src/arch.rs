//! Architectures as data: each supported `general.architecture` is one [`ArchSpec`] row.
//! Adding an architecture is a new row (and a fixture), never a new forward pass.

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
    /// SwiGLU over `ffn_gate`, `ffn_up`, `ffn_down`.
    Dense,
    /// Routed experts: `ffn_gate_inp` router, stacked `ffn_{gate,up,down}_exps`.
    Moe,
}

/// The switches that tell one decoder-only transformer from another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchSpec {
    /// `general.architecture`, also the prefix of the hyperparameter keys (`{name}.block_count`).
    pub name: &'static str,
    /// RoPE pair layout.
    pub rope: RopeStyle,
    /// Q/K/V projection biases (Qwen2 has them).
    pub qkv_bias: Presence,
    /// Per-head RMSNorm of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`; Qwen3, as HF `Qwen3Attention`).
    pub qk_norm: Presence,
    /// Dense or routed FFN.
    pub ffn: FfnKind,
    /// Routed experts' top-k weights renormalised to sum to 1 unless the file says otherwise
    /// (`{arch}.expert_weights_norm`); Qwen3-MoE always does (HF `norm_topk_prob = true`).
    pub moe_norm_topk: bool,
}

/// Every architecture Hearth runs.
pub const ARCHS: &[ArchSpec] = &[
    ArchSpec {
        name: "llama",
        rope: RopeStyle::Normal,
        qkv_bias: Presence::Optional,
        qk_norm: Presence::Absent,
        ffn: FfnKind::Dense,
        moe_norm_topk: false,
    },
    ArchSpec {
        name: "qwen2",
        rope: RopeStyle::Neox,
        qkv_bias: Presence::Required,
        qk_norm: Presence::Absent,
        ffn: FfnKind::Dense,
        moe_norm_topk: false,
    },
    ArchSpec {
        name: "qwen3",
        rope: RopeStyle::Neox,
        qkv_bias: Presence::Absent,
        qk_norm: Presence::Required,
        ffn: FfnKind::Dense,
        moe_norm_topk: false,
    },
    ArchSpec {
        name: "qwen3moe",
        rope: RopeStyle::Neox,
        qkv_bias: Presence::Absent,
        qk_norm: Presence::Required,
        ffn: FfnKind::Moe,
        moe_norm_topk: true,
    },
];

/// The spec of architecture `name`, if Hearth runs it.
pub fn arch_spec(name: &str) -> Option<&'static ArchSpec> {
    ARCHS.iter().find(|a| a.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_exhaustive_and_unique() {
        let names: Vec<_> = ARCHS.iter().map(|a| a.name).collect();
        assert_eq!(names, ["llama", "qwen2", "qwen3", "qwen3moe"]);
        for n in names {
            assert_eq!(arch_spec(n).unwrap().name, n);
        }
        assert!(arch_spec("gpt-j").is_none());
    }
}
