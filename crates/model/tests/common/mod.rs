//! Random tiny models of every architecture, written as GGUF files in memory: the shapes and
//! switches that tell the architectures apart, seeded normal weights of a chosen type.

#![allow(dead_code)]

use std::sync::Arc;

use hearth_gguf::{Array, Gguf, GgufBuilder, Value};
use hearth_quant::GgmlType;

/// The shape of a tiny model and the parts it has.
#[derive(Clone, Debug)]
pub struct Tiny {
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// Routed experts: (count, used, hidden size of one).
    pub experts: Option<(usize, usize, usize)>,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    pub post_norms: bool,
    /// A Llama-3.1-style `rope_freqs.weight`.
    pub rope_freqs: bool,
    /// No `output.weight`: the LM head reads `token_embd`.
    pub tied: bool,
    /// Type of the matrices (norms, biases and frequency factors stay F32).
    pub ty: GgmlType,
    /// More `{arch}.*` metadata (the key without the prefix).
    pub extra: Vec<(&'static str, Value)>,
}

impl Tiny {
    fn base(arch: &'static str) -> Tiny {
        Tiny {
            arch,
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            n_ff: 96,
            n_vocab: 101,
            experts: None,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            rope_freqs: false,
            tied: false,
            ty: GgmlType::F32,
            extra: Vec::new(),
        }
    }

    /// Llama 3.1: normal RoPE with per-dimension frequency factors.
    pub fn llama() -> Tiny {
        Tiny {
            rope_freqs: true,
            ..Tiny::base("llama")
        }
    }

    /// Qwen2: NeoX RoPE, Q/K/V biases.
    pub fn qwen2() -> Tiny {
        Tiny {
            qkv_bias: true,
            ..Tiny::base("qwen2")
        }
    }

    /// Qwen3: per-head Q/K norms, a head dimension that is not `n_embd / n_head`, tied output.
    pub fn qwen3() -> Tiny {
        Tiny {
            qk_norm: true,
            head_dim: 24,
            tied: true,
            ..Tiny::base("qwen3")
        }
    }

    /// Qwen3-MoE: 6 experts, top 2.
    pub fn qwen3moe() -> Tiny {
        Tiny {
            qk_norm: true,
            experts: Some((6, 2, 32)),
            ..Tiny::base("qwen3moe")
        }
    }

    /// Gemma 3: seven layers (sliding, except layer 5), a window of 5 positions, GELU, post-norms,
    /// one KV head, tied output.
    pub fn gemma3() -> Tiny {
        Tiny {
            n_layer: 7,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 32,
            qk_norm: true,
            post_norms: true,
            tied: true,
            extra: vec![
                ("attention.sliding_window", Value::U32(5)),
                ("rope.freq_base", Value::F32(1e6)),
            ],
            ..Tiny::base("gemma3")
        }
    }

    /// Gemma 2: four layers (0 and 2 slide), a window of 5, no Q/K norms, post-norms, the attention
    /// scores and final logits soft-capped low enough (2 and 3) that random weights reach the caps.
    pub fn gemma2() -> Tiny {
        Tiny {
            n_layer: 4,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            post_norms: true,
            tied: true,
            extra: vec![
                ("attention.sliding_window", Value::U32(5)),
                ("attn_logit_softcapping", Value::F32(2.0)),
                ("final_logit_softcapping", Value::F32(3.0)),
            ],
            ..Tiny::base("gemma2")
        }
    }

    /// A `{arch}.*` key added (or replaced).
    pub fn with(mut self, key: &'static str, value: Value) -> Tiny {
        self.extra.retain(|(k, _)| *k != key);
        self.extra.push((key, value));
        self
    }

    /// The GGUF file, weights drawn from `seed`.
    pub fn build(&self, seed: u64) -> Arc<Gguf> {
        let a = self.arch;
        let u = |v: usize| Value::U32(v as u32);
        let mut b = GgufBuilder::new()
            .kv("general.architecture", Value::String(a.into()))
            .kv(format!("{a}.block_count"), u(self.n_layer))
            .kv(format!("{a}.context_length"), u(4096))
            .kv(format!("{a}.embedding_length"), u(self.n_embd))
            .kv(format!("{a}.feed_forward_length"), u(self.n_ff))
            .kv(format!("{a}.attention.head_count"), u(self.n_head))
            .kv(format!("{a}.attention.head_count_kv"), u(self.n_head_kv))
            .kv(format!("{a}.attention.key_length"), u(self.head_dim))
            .kv(format!("{a}.attention.value_length"), u(self.head_dim))
            .kv(
                format!("{a}.attention.layer_norm_rms_epsilon"),
                Value::F32(1e-6),
            );
        if let Some((n, k, ff)) = self.experts {
            b = b
                .kv(format!("{a}.expert_count"), u(n))
                .kv(format!("{a}.expert_used_count"), u(k))
                .kv(format!("{a}.expert_feed_forward_length"), u(ff));
        }
        for (k, v) in &self.extra {
            b = b.kv(format!("{a}.{k}"), v.clone());
        }
        let mut rng = Rng(seed);
        let (d, qd, kd) = (
            self.n_embd,
            self.n_head * self.head_dim,
            self.n_head_kv * self.head_dim,
        );
        let std = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        let mut t = |b: GgufBuilder, name: String, dims: &[usize], init: Init| {
            let n: usize = dims.iter().product();
            let vals: Vec<f32> = (0..n)
                .map(|_| match init {
                    Init::Norm => 1.0 + 0.2 * rng.normal(),
                    Init::Normal(s) => s * rng.normal(),
                })
                .collect();
            let ty = if dims.len() == 1 {
                GgmlType::F32
            } else {
                self.ty
            };
            let dims: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
            b.tensor(name, ty, &dims, encode(ty, &vals, dims[0] as usize))
        };
        // Gemma scales the embeddings by sqrt(n_embd): draw them small so the stream stays near 1.
        let embd_std = if a.starts_with("gemma") { std(d) } else { 1.0 };
        b = t(
            b,
            "token_embd.weight".into(),
            &[d, self.n_vocab],
            Init::Normal(embd_std),
        );
        b = t(b, "output_norm.weight".into(), &[d], Init::Norm);
        if !self.tied {
            b = t(
                b,
                "output.weight".into(),
                &[d, self.n_vocab],
                Init::Normal(std(d)),
            );
        }
        if self.rope_freqs {
            // Factors of 1 to ~8, as Llama 3.1's (the high-frequency dimensions keep 1).
            let half = self.head_dim / 2;
            let f: Vec<f32> = (0..half)
                .map(|i| 1.0 + 7.0 * (i as f32 / half as f32).powi(2))
                .collect();
            b = b.tensor(
                "rope_freqs.weight",
                GgmlType::F32,
                &[half as u64],
                encode(GgmlType::F32, &f, half),
            );
        }
        for l in 0..self.n_layer {
            let n = |s: &str| format!("blk.{l}.{s}");
            b = t(b, n("attn_norm.weight"), &[d], Init::Norm);
            b = t(b, n("attn_q.weight"), &[d, qd], Init::Normal(std(d)));
            b = t(b, n("attn_k.weight"), &[d, kd], Init::Normal(std(d)));
            b = t(b, n("attn_v.weight"), &[d, kd], Init::Normal(std(d)));
            b = t(b, n("attn_output.weight"), &[qd, d], Init::Normal(std(qd)));
            if self.qkv_bias {
                b = t(b, n("attn_q.bias"), &[qd], Init::Normal(0.5));
                b = t(b, n("attn_k.bias"), &[kd], Init::Normal(0.5));
                b = t(b, n("attn_v.bias"), &[kd], Init::Normal(0.5));
            }
            if self.qk_norm {
                b = t(b, n("attn_q_norm.weight"), &[self.head_dim], Init::Norm);
                b = t(b, n("attn_k_norm.weight"), &[self.head_dim], Init::Norm);
            }
            if self.post_norms {
                b = t(b, n("post_attention_norm.weight"), &[d], Init::Norm);
                b = t(b, n("post_ffw_norm.weight"), &[d], Init::Norm);
            }
            b = t(b, n("ffn_norm.weight"), &[d], Init::Norm);
            match self.experts {
                Some((ne, _, ff)) => {
                    b = t(b, n("ffn_gate_inp.weight"), &[d, ne], Init::Normal(std(d)));
                    b = t(
                        b,
                        n("ffn_gate_exps.weight"),
                        &[d, ff, ne],
                        Init::Normal(std(d)),
                    );
                    b = t(
                        b,
                        n("ffn_up_exps.weight"),
                        &[d, ff, ne],
                        Init::Normal(std(d)),
                    );
                    b = t(
                        b,
                        n("ffn_down_exps.weight"),
                        &[ff, d, ne],
                        Init::Normal(std(ff)),
                    );
                }
                None => {
                    let ff = self.n_ff;
                    b = t(b, n("ffn_gate.weight"), &[d, ff], Init::Normal(std(d)));
                    b = t(b, n("ffn_up.weight"), &[d, ff], Init::Normal(std(d)));
                    b = t(b, n("ffn_down.weight"), &[ff, d], Init::Normal(std(ff)));
                }
            }
        }
        Arc::new(Gguf::from_bytes(b.build().expect("valid GGUF")).expect("parses"))
    }
}

/// A per-layer bool array value (`sliding_window_pattern` as a list).
pub fn bools(v: &[bool]) -> Value {
    Value::Array(Array::Bool(v.to_vec()))
}

#[derive(Clone, Copy)]
enum Init {
    /// `1 + 0.2 N(0, 1)`: norm weights.
    Norm,
    /// `std * N(0, 1)`.
    Normal(f32),
}

/// Rows of `cols` values as `ty`.
fn encode(ty: GgmlType, vals: &[f32], cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols as u64).expect("row size") as usize;
    let mut out = vec![0u8; vals.len() / cols * rb];
    for (row, dst) in vals.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
        hearth_quant::quantize_row(ty, row, dst).expect("a quantizer for the type");
    }
    out
}

/// splitmix64, with Box-Muller normals.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        let (a, b) = (self.uniform(), self.uniform());
        ((-2.0 * a.ln()).sqrt() * (2.0 * std::f64::consts::PI * b).cos()) as f32
    }
}
