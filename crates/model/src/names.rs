//! The one table of GGUF tensor names: every weight is addressed by a [`TensorRole`].

/// The role a tensor plays in the model; [`TensorRole::name`] gives its GGUF name.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorRole {
    TokenEmbd,
    OutputNorm,
    Output,
    RopeFreqs,
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    AttnQBias,
    AttnKBias,
    AttnVBias,
    AttnQNorm,
    AttnKNorm,
    AttnPostNorm,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    FfnGateInp,
    FfnGateExps,
    FfnUpExps,
    FfnDownExps,
    FfnPostNorm,
}

impl TensorRole {
    /// The GGUF tensor name; `layer` is ignored for the model-wide tensors.
    pub fn name(self, layer: usize) -> String {
        use TensorRole::*;
        let blk = |s: &str| format!("blk.{layer}.{s}");
        match self {
            TokenEmbd => "token_embd.weight".into(),
            OutputNorm => "output_norm.weight".into(),
            Output => "output.weight".into(),
            RopeFreqs => "rope_freqs.weight".into(),
            AttnNorm => blk("attn_norm.weight"),
            AttnQ => blk("attn_q.weight"),
            AttnK => blk("attn_k.weight"),
            AttnV => blk("attn_v.weight"),
            AttnOutput => blk("attn_output.weight"),
            AttnQBias => blk("attn_q.bias"),
            AttnKBias => blk("attn_k.bias"),
            AttnVBias => blk("attn_v.bias"),
            AttnQNorm => blk("attn_q_norm.weight"),
            AttnKNorm => blk("attn_k_norm.weight"),
            AttnPostNorm => blk("post_attention_norm.weight"),
            FfnNorm => blk("ffn_norm.weight"),
            FfnGate => blk("ffn_gate.weight"),
            FfnUp => blk("ffn_up.weight"),
            FfnDown => blk("ffn_down.weight"),
            FfnGateInp => blk("ffn_gate_inp.weight"),
            FfnGateExps => blk("ffn_gate_exps.weight"),
            FfnUpExps => blk("ffn_up_exps.weight"),
            FfnDownExps => blk("ffn_down_exps.weight"),
            FfnPostNorm => blk("post_ffw_norm.weight"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_llama_cpp() {
        assert_eq!(
            TensorRole::FfnGateExps.name(3),
            "blk.3.ffn_gate_exps.weight"
        );
        assert_eq!(TensorRole::AttnQBias.name(0), "blk.0.attn_q.bias");
        assert_eq!(TensorRole::Output.name(7), "output.weight");
        assert_eq!(
            TensorRole::AttnPostNorm.name(2),
            "blk.2.post_attention_norm.weight"
        );
        assert_eq!(
            TensorRole::FfnPostNorm.name(0),
            "blk.0.post_ffw_norm.weight"
        );
    }
}
