//! Loading: bind the file's tensors onto the architecture's layers, checking every required tensor,
//! shape and type up front and reporting every problem at once.

use std::path::Path;
use std::sync::Arc;

use hearth_gguf::{Gguf, TensorInfo};
use hearth_quant::interleave::{can_interleave, interleave};
use hearth_quant::simd::interleaved_kernels;
use hearth_quant::{can_dequantize, dequantize_row, kernel_isa, GgmlType};

use crate::arch::{FfnKind, Presence};
use crate::config::Config;
use crate::error::ModelError;
use crate::names::TensorRole;
use crate::weights::{Ffn, Layer, Weight};

/// A loaded model: its configuration and its weights, viewed in the mmap of its file.
pub struct Model {
    /// Hyperparameters.
    pub config: Config,
    /// `[n_embd, n_vocab]`
    pub tok_embd: Weight,
    /// `[n_embd]`
    pub output_norm: Vec<f32>,
    /// `[n_embd, n_vocab]`; `None` when tied to `tok_embd`.
    pub output: Option<Weight>,
    /// The blocks, in order.
    pub layers: Vec<Layer>,
    // Declared last so the weights (views into it) are dropped first.
    gguf: Arc<Gguf>,
}

impl Model {
    /// Opens and loads a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        Model::load(Arc::new(Gguf::open(path)?))
    }

    /// Binds an opened file's tensors. A file read into memory ([`Gguf::open_resident`]) and held
    /// by no one else has its Q4_K and Q6_K matrices laid out for this CPU's kernels first
    /// (`hearth_quant::interleave`).
    pub fn load(mut gguf: Arc<Gguf>) -> Result<Model, ModelError> {
        if let Some(g) = Arc::get_mut(&mut gguf) {
            interleave_weights(g)?;
        }
        let mut config = Config::from_metadata(gguf.metadata())?;
        let mut b = Binder {
            gguf: &gguf,
            problems: Vec::new(),
        };
        let c = &config;

        let n_vocab = gguf
            .tensor(&TensorRole::TokenEmbd.name(0))
            .map_or(0, |t| t.ne(1) as usize);
        let tok_embd = b.matrix(TensorRole::TokenEmbd, 0, [c.n_embd, n_vocab, 1]);
        let output_norm = b.vector(TensorRole::OutputNorm, 0, c.n_embd, Presence::Required);
        let output = if gguf.tensor(&TensorRole::Output.name(0)).is_some() {
            b.matrix(TensorRole::Output, 0, [c.n_embd, n_vocab, 1])
        } else {
            None // tied embeddings: the LM head reads token_embd
        };
        let freq_factors = b.vector(
            TensorRole::RopeFreqs,
            0,
            c.rope().n_rot / 2,
            Presence::Optional,
        );

        let arch = c.arch;
        let mut layers = Vec::with_capacity(c.n_layer);
        for l in 0..c.n_layer {
            let attn_norm = b.vector(TensorRole::AttnNorm, l, c.n_embd, Presence::Required);
            let wq = b.matrix(TensorRole::AttnQ, l, [c.n_embd, c.q_dim(), 1]);
            let wk = b.matrix(TensorRole::AttnK, l, [c.n_embd, c.k_dim(), 1]);
            let wv = b.matrix(TensorRole::AttnV, l, [c.n_embd, c.v_dim(), 1]);
            let wo = b.matrix(
                TensorRole::AttnOutput,
                l,
                [c.n_head * c.head_dim_v, c.n_embd, 1],
            );
            let bq = b.vector(TensorRole::AttnQBias, l, c.q_dim(), arch.qkv_bias);
            let bk = b.vector(TensorRole::AttnKBias, l, c.k_dim(), arch.qkv_bias);
            let bv = b.vector(TensorRole::AttnVBias, l, c.v_dim(), arch.qkv_bias);
            let q_norm = b.vector(TensorRole::AttnQNorm, l, c.head_dim, arch.qk_norm);
            let k_norm = b.vector(TensorRole::AttnKNorm, l, c.head_dim, arch.qk_norm);
            let attn_post_norm = b.vector(TensorRole::AttnPostNorm, l, c.n_embd, arch.post_norms);
            let ffn_norm = b.vector(TensorRole::FfnNorm, l, c.n_embd, Presence::Required);
            let ffn_post_norm = b.vector(TensorRole::FfnPostNorm, l, c.n_embd, arch.post_norms);
            let ffn = match (arch.ffn, &c.moe) {
                (FfnKind::Moe, Some(m)) => {
                    let gate_inp = b.matrix(TensorRole::FfnGateInp, l, [c.n_embd, m.n_expert, 1]);
                    let gate_exps = b.matrix(
                        TensorRole::FfnGateExps,
                        l,
                        [c.n_embd, m.n_ff_exp, m.n_expert],
                    );
                    let up_exps =
                        b.matrix(TensorRole::FfnUpExps, l, [c.n_embd, m.n_ff_exp, m.n_expert]);
                    let down_exps = b.matrix(
                        TensorRole::FfnDownExps,
                        l,
                        [m.n_ff_exp, c.n_embd, m.n_expert],
                    );
                    match (gate_inp, gate_exps, up_exps, down_exps) {
                        (Some(gate_inp), Some(gate_exps), Some(up_exps), Some(down_exps)) => {
                            Some(Ffn::Moe {
                                gate_inp,
                                gate_exps,
                                up_exps,
                                down_exps,
                            })
                        }
                        _ => None,
                    }
                }
                _ => {
                    let gate = b.matrix(TensorRole::FfnGate, l, [c.n_embd, c.n_ff, 1]);
                    let up = b.matrix(TensorRole::FfnUp, l, [c.n_embd, c.n_ff, 1]);
                    let down = b.matrix(TensorRole::FfnDown, l, [c.n_ff, c.n_embd, 1]);
                    match (gate, up, down) {
                        (Some(gate), Some(up), Some(down)) => Some(Ffn::Dense { gate, up, down }),
                        _ => None,
                    }
                }
            };
            if let (
                Some(attn_norm),
                Some(wq),
                Some(wk),
                Some(wv),
                Some(wo),
                Some(ffn_norm),
                Some(ffn),
            ) = (attn_norm, wq, wk, wv, wo, ffn_norm, ffn)
            {
                layers.push(Layer {
                    attn_norm,
                    wq,
                    wk,
                    wv,
                    wo,
                    bq,
                    bk,
                    bv,
                    q_norm,
                    k_norm,
                    attn_post_norm,
                    ffn_norm,
                    ffn,
                    ffn_post_norm,
                });
            }
        }
        if !b.problems.is_empty() {
            return Err(ModelError::Tensors(b.problems));
        }
        let (Some(tok_embd), Some(output_norm)) = (tok_embd, output_norm) else {
            unreachable!("missing tensors are reported as problems")
        };
        config.n_vocab = n_vocab;
        for rope in &mut config.ropes {
            rope.freq_factors = freq_factors.clone();
        }
        Ok(Model {
            config,
            tok_embd,
            output_norm,
            output,
            layers,
            gguf,
        })
    }

    /// The file the weights live in.
    pub fn gguf(&self) -> &Arc<Gguf> {
        &self.gguf
    }

    /// The LM head: `output.weight`, or the token embeddings when they are tied.
    pub fn lm_head(&self) -> &Weight {
        self.output.as_ref().unwrap_or(&self.tok_embd)
    }
}

/// Rewrites, in place, the matrices whose rows have an interleaved layout with kernels at
/// [`kernel_isa`] (Q4_K, Q6_K and the legacy formats on x86-64 from AVX2 up, AVX-512 included:
/// `hearth_quant::interleave`, `hearth_quant::simd::interleaved_kernels`) into
/// that layout, unless `HEARTH_INTERLEAVE=0`: a one-token product then reads each register once
/// (Q4_K shares each scale multiply among four rows: one thread, 2048 × 768 in cache on Zen 1,
/// 14.0 GB/s against 8.9; Q4_1 and Q8_0 need no transpose: 1536 × 576 on Zen 3, 35.9 and 47.3
/// GB/s against 19.5 and 23.7), and products of many tokens read the groups at least as fast as
/// the file's rows. The bytes take the same room, so there is no second copy; the products give
/// the same bits. Only a file read into memory can be rewritten; a mapped one is left as it is.
/// The token embeddings are rewritten only where they are also the LM head (tied): their lookups
/// then copy a row out of its group (`Weight::read_row`). Returns how many tensors were.
pub(crate) fn interleave_weights(gguf: &mut Gguf) -> Result<usize, ModelError> {
    if std::env::var_os("HEARTH_INTERLEAVE").is_some_and(|v| v == "0") {
        return Ok(0);
    }
    let isa = kernel_isa();
    let embd = TensorRole::TokenEmbd.name(0);
    let tied = gguf.tensor(&TensorRole::Output.name(0)).is_none();
    Ok(gguf.rewrite_tensors(&mut |t, bytes| {
        let (Some(&cols), Some(&rows)) = (t.dims.first(), t.dims.get(1)) else {
            return false;
        };
        let (Ok(cols), Ok(rows)) = (usize::try_from(cols), usize::try_from(rows)) else {
            return false;
        };
        (tied || t.name != embd)
            && interleaved_kernels(isa, t.ty)
            && can_interleave(t.ty, rows, cols)
            && interleave(t.ty, cols, bytes)
    })?)
}

/// Collects tensors by role, recording every problem instead of stopping at the first.
struct Binder<'a> {
    gguf: &'a Gguf,
    problems: Vec<String>,
}

impl Binder<'_> {
    fn find(&mut self, role: TensorRole, layer: usize, presence: Presence) -> Option<&TensorInfo> {
        let name = role.name(layer);
        if presence == Presence::Absent {
            return None;
        }
        let t = self.gguf.tensor(&name);
        if t.is_none() && presence == Presence::Required {
            self.problems.push(format!("missing tensor {name}"));
        }
        t
    }

    fn shape_ok(&mut self, t: &TensorInfo, expected: &[usize]) -> bool {
        // Trailing 1s carry no meaning in ggml shapes: [256] and [256, 1] are the same tensor.
        let trim = |v: Vec<u64>| {
            let mut v = v;
            while v.len() > 1 && v.last() == Some(&1) {
                v.pop();
            }
            v
        };
        let got = trim(t.dims.clone());
        let want = trim(expected.iter().map(|&d| d as u64).collect());
        if got != want {
            self.problems.push(format!(
                "tensor {} has shape {:?}, expected {:?}",
                t.name, got, want
            ));
            return false;
        }
        true
    }

    /// A small f32 vector (norm weights, biases, frequency factors), dequantized once at load.
    fn vector(
        &mut self,
        role: TensorRole,
        layer: usize,
        len: usize,
        presence: Presence,
    ) -> Option<Vec<f32>> {
        let t = self.find(role, layer, presence)?.clone();
        if !self.shape_ok(&t, &[len]) {
            return None;
        }
        if !can_dequantize(t.ty) {
            self.problems
                .push(format!("tensor {} has unsupported type {}", t.name, t.ty));
            return None;
        }
        let mut v = vec![0f32; len];
        if let Err(e) = dequantize_row(t.ty, self.gguf.tensor_data(&t), &mut v) {
            self.problems.push(format!("tensor {}: {e}", t.name));
            return None;
        }
        Some(v)
    }

    /// A weight matrix `[cols, rows, n_mat]` used in matrix products.
    fn matrix(&mut self, role: TensorRole, layer: usize, dims: [usize; 3]) -> Option<Weight> {
        let t = self.find(role, layer, Presence::Required)?.clone();
        if !self.shape_ok(&t, &dims) {
            return None;
        }
        if !can_dequantize(t.ty) || matches!(t.ty, GgmlType::Q8_1 | GgmlType::Q8_K) {
            self.problems.push(format!(
                "tensor {} has type {}, which Hearth does not support for weights",
                t.name, t.ty
            ));
            return None;
        }
        let data = self.gguf.tensor_data(&t);
        let interleaved = self.gguf.is_rewritten(&t);
        // SAFETY: `data` lives in the mmap owned by the `Arc<Gguf>` that the `Model` keeps.
        Some(unsafe { Weight::new(t.name.clone(), t.ty, dims, t.row_bytes(), data, interleaved) })
    }
}
