//! Which tensors a preset has, their shapes, how they are initialised and which type each gets.
//!
//! The types follow llama.cpp's `llama-quantize` (`llama_tensor_get_type` in src/llama-quant.cpp), so a
//! synthetic file has the layout a real quantized model has:
//! - 1-D tensors (norms) and the router `ffn_gate_inp` are not quantized (F32);
//! - `output.weight` (or `token_embd` when tied) is Q6_K unless the file type is Q8_0;
//! - with exactly 8 experts, `attn_k` and `attn_v` are Q8_0 and Q4_K_M's `attn_output` is Q5_K;
//! - Q4_K_M puts `attn_v` and `ffn_down` / `ffn_down_exps` in Q6_K on the layers `use_more_bits`
//!   picks: the first and last eighth and every third layer in between;
//! - a row length the block size does not divide falls back (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0,
//!   then F16).

use hearth_quant::GgmlType;

use super::preset::Preset;

/// `--quant`: a llama.cpp file type.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// Q4_K, with Q6_K / Q5_K / Q8_0 where llama-quantize's Q4_K_M puts them.
    #[value(name = "q4_k_m")]
    Q4KM,
    /// Q8_0 everywhere.
    #[value(name = "q8_0")]
    Q8_0,
    /// Q4_0, output Q6_K.
    #[value(name = "q4_0")]
    Q4_0,
    /// Q6_K everywhere.
    #[value(name = "q6_k")]
    Q6K,
    /// Half precision, not quantized.
    #[value(name = "f16")]
    F16,
}

impl Quant {
    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            Quant::F16 => 1,
            Quant::Q4_0 => 2,
            Quant::Q8_0 => 7,
            Quant::Q4KM => 15,
            Quant::Q6K => 18,
        }
    }

    fn default_type(self) -> GgmlType {
        match self {
            Quant::F16 => GgmlType::F16,
            Quant::Q4_0 => GgmlType::Q4_0,
            Quant::Q8_0 => GgmlType::Q8_0,
            Quant::Q4KM => GgmlType::Q4_K,
            Quant::Q6K => GgmlType::Q6_K,
        }
    }
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// `1 + 0.02 * N(0, 1)`: RMSNorm weights.
    Norm,
    /// `std * N(0, 1)`.
    Normal(f32),
}

/// One tensor of the file.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    /// ggml order: `[cols, rows]` or `[cols, rows, n_expert]`.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub init: Init,
}

impl TensorSpec {
    /// Row length.
    pub fn cols(&self) -> usize {
        self.dims[0] as usize
    }

    /// Rows over all matrices of the tensor.
    pub fn rows(&self) -> usize {
        self.dims[1..].iter().product::<u64>() as usize
    }
}

/// llama-quantize's `use_more_bits`.
pub fn use_more_bits(i_layer: usize, n_layer: usize) -> bool {
    let (i, n) = (i_layer as i64, n_layer as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// What a tensor is, for the type rules.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGateUp,
    FfnDown,
    Router,
}

// `usize::is_multiple_of` is newer than the workspace's rust-version (1.80).
#[allow(clippy::manual_is_multiple_of)]
fn tensor_type(
    p: &Preset,
    q: Quant,
    role: Role,
    layer: usize,
    n_layer: usize,
    cols: usize,
) -> GgmlType {
    if role == Role::Router {
        return GgmlType::F32; // llama-quantize never quantizes ffn_gate_inp
    }
    let mut ty = q.default_type();
    if q == Quant::F16 {
        return ty;
    }
    let eight_experts = p.experts.is_some_and(|e| e.count == 8);
    let q4km = q == Quant::Q4KM;
    match role {
        Role::Output => {
            if cols % ty.block_size() != 0 {
                ty = GgmlType::Q8_0;
            } else if ty != GgmlType::Q8_0 {
                ty = GgmlType::Q6_K;
            }
        }
        Role::AttnV => {
            if q4km && use_more_bits(layer, n_layer) {
                ty = GgmlType::Q6_K;
            }
            if eight_experts {
                ty = GgmlType::Q8_0;
            }
        }
        Role::AttnK if eight_experts => ty = GgmlType::Q8_0,
        Role::FfnDown if q4km && use_more_bits(layer, n_layer) => ty = GgmlType::Q6_K,
        Role::AttnOutput if eight_experts && q4km => ty = GgmlType::Q5_K,
        _ => {}
    }
    if cols % ty.block_size() != 0 {
        ty = match ty {
            GgmlType::Q4_K => GgmlType::Q5_0,
            GgmlType::Q5_K => GgmlType::Q5_1,
            GgmlType::Q6_K => GgmlType::Q8_0,
            other => other,
        };
        if cols % ty.block_size() != 0 {
            ty = GgmlType::F16;
        }
    }
    ty
}

/// The tensors of `p` with `n_layer` layers and `n_vocab` rows of embeddings, in llama.cpp's order.
pub fn plan(p: &Preset, n_layer: usize, n_vocab: usize, q: Quant) -> Vec<TensorSpec> {
    let (d, qd, kd) = (p.n_embd, p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
    let mut out = Vec::new();
    let mut push =
        |name: String, dims: Vec<usize>, role: Option<Role>, layer: usize, init: Init| {
            let ty = match role {
                None => GgmlType::F32,
                Some(r) => tensor_type(p, q, r, layer, n_layer, dims[0]),
            };
            out.push(TensorSpec {
                name,
                dims: dims.iter().map(|&x| x as u64).collect(),
                ty,
                init,
            });
        };
    let fan_in = |n: usize| Init::Normal(1.0 / (n as f32).sqrt());
    let rs = if std::env::var_os("NORES").is_some() {
        1.0
    } else {
        1.0 / ((2 * n_layer) as f32).sqrt()
    };
    let residual = |n: usize| Init::Normal(rs / (n as f32).sqrt());
    // Embedding rows of unit variance, the scale later layers add to the residual stream. Tied
    // embeddings are also the LM head, a matrix like any other (std 1/sqrt(fan_in)): at unit variance
    // every token's logit for itself would dwarf the rest (~n_embd against ~sqrt(n_embd)).
    let (embd_role, embd_init) = if p.tied {
        (Role::Output, fan_in(d))
    } else {
        (Role::TokenEmbd, Init::Normal(1.0))
    };
    push(
        "token_embd.weight".into(),
        vec![d, n_vocab],
        Some(embd_role),
        0,
        embd_init,
    );
    push("output_norm.weight".into(), vec![d], None, 0, Init::Norm);
    if !p.tied {
        push(
            "output.weight".into(),
            vec![d, n_vocab],
            Some(Role::Output),
            0,
            fan_in(d),
        );
    }
    for l in 0..n_layer {
        let b = |s: &str| format!("blk.{l}.{s}");
        push(b("attn_norm.weight"), vec![d], None, l, Init::Norm);
        push(
            b("attn_q.weight"),
            vec![d, qd],
            Some(Role::AttnQ),
            l,
            fan_in(d),
        );
        push(
            b("attn_k.weight"),
            vec![d, kd],
            Some(Role::AttnK),
            l,
            fan_in(d),
        );
        push(
            b("attn_v.weight"),
            vec![d, kd],
            Some(Role::AttnV),
            l,
            fan_in(d),
        );
        push(
            b("attn_output.weight"),
            vec![qd, d],
            Some(Role::AttnOutput),
            l,
            residual(qd),
        );
        if p.qk_norm {
            push(
                b("attn_q_norm.weight"),
                vec![p.head_dim],
                None,
                l,
                Init::Norm,
            );
            push(
                b("attn_k_norm.weight"),
                vec![p.head_dim],
                None,
                l,
                Init::Norm,
            );
        }
        if p.post_norms {
            push(
                b("post_attention_norm.weight"),
                vec![d],
                None,
                l,
                Init::Norm,
            );
        }
        push(b("ffn_norm.weight"), vec![d], None, l, Init::Norm);
        match p.experts {
            Some(e) => {
                push(
                    b("ffn_gate_inp.weight"),
                    vec![d, e.count],
                    Some(Role::Router),
                    l,
                    fan_in(d),
                );
                push(
                    b("ffn_gate_exps.weight"),
                    vec![d, e.ff, e.count],
                    Some(Role::FfnGateUp),
                    l,
                    fan_in(d),
                );
                push(
                    b("ffn_up_exps.weight"),
                    vec![d, e.ff, e.count],
                    Some(Role::FfnGateUp),
                    l,
                    fan_in(d),
                );
                push(
                    b("ffn_down_exps.weight"),
                    vec![e.ff, d, e.count],
                    Some(Role::FfnDown),
                    l,
                    residual(e.ff),
                );
            }
            None => {
                push(
                    b("ffn_gate.weight"),
                    vec![d, p.n_ff],
                    Some(Role::FfnGateUp),
                    l,
                    fan_in(d),
                );
                push(
                    b("ffn_up.weight"),
                    vec![d, p.n_ff],
                    Some(Role::FfnGateUp),
                    l,
                    fan_in(d),
                );
                push(
                    b("ffn_down.weight"),
                    vec![p.n_ff, d],
                    Some(Role::FfnDown),
                    l,
                    residual(p.n_ff),
                );
            }
        }
        if p.post_norms {
            push(b("post_ffw_norm.weight"), vec![d], None, l, Init::Norm);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::preset::preset;
    use super::*;

    fn ty(specs: &[TensorSpec], name: &str) -> GgmlType {
        specs
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name}"))
            .ty
    }

    #[test]
    fn use_more_bits_matches_llama_quantize() {
        // 48 layers: 0-5, 42-47 and 8, 11, ..., 41.
        let picked: Vec<usize> = (0..48).filter(|&i| use_more_bits(i, 48)).collect();
        let mut want: Vec<usize> = (0..6).chain(42..48).collect();
        want.extend((8..42).step_by(3));
        want.sort();
        assert_eq!(picked, want);
        assert_eq!(
            (0..2).filter(|&i| use_more_bits(i, 2)).collect::<Vec<_>>(),
            [1]
        );
    }

    #[test]
    fn tiny_q4_k_m_matches_the_fixture_layout() {
        // ../shared/fixtures/tiny-qwen3moe.q4_k_m.gguf (2 layers, 8 experts, made by llama-quantize).
        let p = preset("qwen3-moe-tiny").unwrap();
        let s = plan(&p, 2, 503, Quant::Q4KM);
        use GgmlType::*;
        for (name, want) in [
            ("output.weight", Q6_K),
            ("token_embd.weight", Q4_K),
            ("blk.0.attn_k.weight", Q8_0),
            ("blk.0.attn_v.weight", Q8_0),
            ("blk.0.attn_output.weight", Q5_K),
            ("blk.0.attn_q.weight", Q4_K),
            ("blk.0.ffn_down_exps.weight", Q4_K),
            ("blk.1.ffn_down_exps.weight", Q6_K),
            ("blk.1.ffn_gate_exps.weight", Q4_K),
            ("blk.1.ffn_up_exps.weight", Q4_K),
            ("blk.0.attn_q_norm.weight", F32),
        ] {
            assert_eq!(ty(&s, name), want, "{name}");
        }
    }

    #[test]
    fn big_moe_q4_k_m() {
        let p = preset("qwen3-moe-30b-a3b").unwrap();
        let s = plan(&p, 48, 151_936, Quant::Q4KM);
        use GgmlType::*;
        assert_eq!(ty(&s, "blk.0.attn_v.weight"), Q6_K);
        assert_eq!(ty(&s, "blk.6.attn_v.weight"), Q4_K);
        assert_eq!(ty(&s, "blk.8.attn_v.weight"), Q6_K);
        assert_eq!(ty(&s, "blk.7.ffn_down_exps.weight"), Q4_K);
        assert_eq!(ty(&s, "blk.47.ffn_down_exps.weight"), Q6_K);
        assert_eq!(ty(&s, "blk.3.attn_k.weight"), Q4_K);
        assert_eq!(ty(&s, "blk.3.attn_output.weight"), Q4_K);
        assert_eq!(ty(&s, "blk.3.ffn_gate_inp.weight"), F32);
        assert_eq!(ty(&s, "output.weight"), Q6_K);
        assert_eq!(ty(&s, "token_embd.weight"), Q4_K);
        assert_eq!(s.len(), 3 + 48 * 12);
        let bytes: u64 = s
            .iter()
            .map(|t| hearth_quant::row_len(t.ty, t.cols()).unwrap() as u64 * t.rows() as u64)
            .sum();
        // Qwen3-30B-A3B Q4_K_M is about 18.6 GB.
        assert!((17_500_000_000..19_500_000_000).contains(&bytes), "{bytes}");
    }

    #[test]
    fn tied_dense_head_and_other_types() {
        let p = preset("qwen3-dense-0.6b").unwrap();
        use GgmlType::*;
        let s = plan(&p, 28, 151_936, Quant::Q4KM);
        assert!(s.iter().all(|t| t.name != "output.weight"));
        assert_eq!(ty(&s, "token_embd.weight"), Q6_K);
        assert_eq!(
            ty(&plan(&p, 28, 151_936, Quant::Q8_0), "token_embd.weight"),
            Q8_0
        );
        let s = plan(&p, 28, 151_936, Quant::Q4_0);
        assert_eq!(ty(&s, "token_embd.weight"), Q6_K);
        assert_eq!(ty(&s, "blk.0.attn_v.weight"), Q4_0);
        assert_eq!(ty(&s, "blk.0.ffn_down.weight"), Q4_0);
        let s = plan(&p, 28, 151_936, Quant::F16);
        assert_eq!(ty(&s, "token_embd.weight"), F16);
        assert_eq!(ty(&s, "blk.0.attn_norm.weight"), F32);
    }
}
