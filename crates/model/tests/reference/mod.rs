//! A naive reference forward pass, in the spirit of llama2.c's `run.c`: one token at a time, plain
//! loops, f32 values with f64 sums, every weight dequantized row by row from the file as it is used.
//! It shares no code with the decoder beyond the GGUF reader and the dequantizers (both tested
//! against gguf-py on their own), reads its hyperparameters itself ([`hparams`]) and takes the
//! optional parts of a layer (biases, Q/K norms, post-norms, RoPE frequency factors) from what the
//! file holds. One function per architecture feature: [`Reference::block`] is the whole layer.

pub mod hparams;

use hearth_gguf::{Gguf, TensorInfo};
pub use hparams::Hparams;

/// A model file and the reference's reading of it.
pub struct Reference<'a> {
    gguf: &'a Gguf,
    pub hp: Hparams,
}

/// One layer's cache: every position's K and V rows (`[pos][n_head_kv * head_dim]`).
#[derive(Default, Clone)]
struct LayerCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// A sequence's state: the cache of every layer.
pub struct Sequence {
    layers: Vec<LayerCache>,
}

impl<'a> Reference<'a> {
    pub fn new(gguf: &'a Gguf) -> Reference<'a> {
        Reference {
            gguf,
            hp: Hparams::read(gguf.metadata()),
        }
    }

    pub fn sequence(&self) -> Sequence {
        Sequence {
            layers: vec![LayerCache::default(); self.hp.n_layer],
        }
    }

    fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.gguf.tensor(name)
    }

    fn layer_tensor(&self, l: usize, name: &str) -> Option<&TensorInfo> {
        self.tensor(&format!("blk.{l}.{name}"))
    }

    /// Row `r` of matrix `mat` of a tensor `[cols, rows, n_mat]`, dequantized.
    fn row(&self, t: &TensorInfo, mat: usize, r: usize) -> Vec<f32> {
        let cols = t.dims[0] as usize;
        let rows = t.dims.get(1).copied().unwrap_or(1) as usize;
        let rb = t.row_bytes();
        let data = self.gguf.tensor_data(t);
        let at = (mat * rows + r) * rb;
        let mut out = vec![0f32; cols];
        hearth_quant::dequantize_row(t.ty, &data[at..at + rb], &mut out).expect("dequantize");
        out
    }

    /// A whole 1-D tensor (norm weights, biases, frequency factors).
    fn vector(&self, t: &TensorInfo) -> Vec<f32> {
        self.row(t, 0, 0)
    }

    /// `W x` for `W` = matrix `mat` of `t`.
    fn matvec(&self, t: &TensorInfo, mat: usize, x: &[f32]) -> Vec<f32> {
        let rows = t.dims[1] as usize;
        (0..rows).map(|r| dot(&self.row(t, mat, r), x)).collect()
    }

    /// Feeds `token` at the sequence's next position; returns the logits `[n_vocab]`.
    pub fn step(&self, seq: &mut Sequence, token: u32) -> Vec<f32> {
        let hp = &self.hp;
        let pos = seq.layers[0].k.len();
        let embd = self.tensor("token_embd.weight").expect("token_embd");
        let mut x = self.row(embd, 0, token as usize);
        x.iter_mut().for_each(|v| *v *= hp.embd_scale);
        for l in 0..hp.n_layer {
            self.block(l, pos, &mut x, &mut seq.layers[l]);
        }
        let x = rmsnorm(
            &x,
            &self.vector(self.tensor("output_norm.weight").unwrap()),
            hp.eps,
        );
        // Tied embeddings: the LM head is token_embd.
        let head = self.tensor("output.weight").unwrap_or(embd);
        let mut logits = self.matvec(head, 0, &x);
        if let Some(cap) = hp.softcap {
            logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        }
        logits
    }

    /// One transformer block on the residual stream `x` at position `pos`:
    /// `x += post_norm(attention(norm(x)))`, then `x += post_norm(ffn(norm(x)))`.
    fn block(&self, l: usize, pos: usize, x: &mut [f32], cache: &mut LayerCache) {
        let eps = self.hp.eps;
        let norm = |name: &str, v: &[f32]| match self.layer_tensor(l, name) {
            Some(w) => rmsnorm(v, &self.vector(w), eps),
            None => v.to_vec(),
        };
        let h = norm("attn_norm.weight", x);
        let a = norm(
            "post_attention_norm.weight",
            &self.attention(l, pos, &h, cache),
        );
        add(x, &a);
        let h = norm("ffn_norm.weight", x);
        let f = norm("post_ffw_norm.weight", &self.ffn(l, &h));
        add(x, &f);
    }

    /// Grouped-query attention of one token over the layer's cache, causal and, in a sliding
    /// layer, within the window `[pos + 1 - window, pos]`.
    fn attention(&self, l: usize, pos: usize, h: &[f32], cache: &mut LayerCache) -> Vec<f32> {
        let hp = &self.hp;
        let proj = |name: &str| {
            let mut y = self.matvec(
                self.layer_tensor(l, &format!("{name}.weight")).unwrap(),
                0,
                h,
            );
            if let Some(b) = self.layer_tensor(l, &format!("{name}.bias")) {
                add(&mut y, &self.vector(b)); // Qwen2
            }
            y
        };
        let (mut q, mut k, v) = (proj("attn_q"), proj("attn_k"), proj("attn_v"));
        let hd = hp.head_dim;
        for (buf, name) in [
            (&mut q, "attn_q_norm.weight"),
            (&mut k, "attn_k_norm.weight"),
        ] {
            // Qwen3, Gemma 3: RMSNorm of each head before RoPE.
            if let Some(w) = self.layer_tensor(l, name) {
                let w = self.vector(w);
                for head in buf.chunks_exact_mut(hd) {
                    let n = rmsnorm(head, &w, hp.eps);
                    head.copy_from_slice(&n);
                }
            }
            for head in buf.chunks_exact_mut(hd) {
                self.rope(l, pos, head);
            }
        }
        cache.k.push(k);
        cache.v.push(v);

        let lo = hp.window[l].map_or(0, |w| (pos + 1).saturating_sub(w));
        let group = hp.n_head / hp.n_head_kv;
        let mut out = vec![0f32; hp.n_head * hd];
        for head in 0..hp.n_head {
            let kvh = head / group;
            let qh = &q[head * hd..(head + 1) * hd];
            let mut scores: Vec<f32> = (lo..=pos)
                .map(|t| dot(qh, &cache.k[t][kvh * hd..(kvh + 1) * hd]) * hp.attn_scale)
                // Gemma 2: scores soft-capped before the softmax.
                .map(|s| hp.attn_softcap.map_or(s, |c| c * (s / c).tanh()))
                .collect();
            softmax(&mut scores);
            let o = &mut out[head * hd..(head + 1) * hd];
            for (t, p) in (lo..=pos).zip(&scores) {
                for (o, v) in o.iter_mut().zip(&cache.v[t][kvh * hd..(kvh + 1) * hd]) {
                    *o += p * v;
                }
            }
        }
        self.matvec(self.layer_tensor(l, "attn_output.weight").unwrap(), 0, &out)
    }

    /// Rotates one head at `pos` with the layer's base: the pairs turn by `pos * base^(-2i/n_rot)`
    /// (divided by `rope_freqs[i]` where the file has it, Llama 3.1).
    fn rope(&self, l: usize, pos: usize, x: &mut [f32]) {
        let hp = &self.hp;
        let half = hp.n_rot / 2;
        let factors = self.tensor("rope_freqs.weight").map(|t| self.vector(t));
        for i in 0..half {
            let freq = (hp.rope_base[l] as f64).powf(-2.0 * i as f64 / hp.n_rot as f64);
            let ff = factors.as_ref().map_or(1.0, |f| f[i] as f64);
            let theta = pos as f64 * freq / ff;
            let (c, s) = (theta.cos() as f32, theta.sin() as f32);
            let (a, b) = if hp.neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (x[a], x[b]);
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }

    /// The FFN: gated `down(act(gate h) * up h)`, or the routed experts' weighted sum of those.
    fn ffn(&self, l: usize, h: &[f32]) -> Vec<f32> {
        let t = |name: &str| self.layer_tensor(l, name).unwrap();
        let Some((n_expert, k, norm_topk, scale)) = self.hp.moe else {
            return self.gated(
                t("ffn_gate.weight"),
                t("ffn_up.weight"),
                t("ffn_down.weight"),
                0,
                h,
            );
        };
        // Qwen3-MoE: softmax router, the top k by probability, their weights renormalised.
        let mut probs = self.matvec(t("ffn_gate_inp.weight"), 0, h);
        softmax(&mut probs);
        let mut order: Vec<usize> = (0..n_expert).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let chosen = &order[..k];
        let total: f32 = chosen.iter().map(|&e| probs[e]).sum();
        let mut out = vec![0f32; self.hp.n_embd];
        for &e in chosen {
            let w = if norm_topk {
                probs[e] / total
            } else {
                probs[e]
            } * scale;
            let y = self.gated(
                t("ffn_gate_exps.weight"),
                t("ffn_up_exps.weight"),
                t("ffn_down_exps.weight"),
                e,
                h,
            );
            out.iter_mut().zip(&y).for_each(|(o, y)| *o += w * y);
        }
        out
    }

    /// One gated FFN (matrix `mat` of each weight): SwiGLU, or GeGLU for Gemma.
    fn gated(
        &self,
        gate: &TensorInfo,
        up: &TensorInfo,
        down: &TensorInfo,
        mat: usize,
        h: &[f32],
    ) -> Vec<f32> {
        let g = self.matvec(gate, mat, h);
        let u = self.matvec(up, mat, h);
        let act: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| if self.hp.gelu { gelu_tanh(g) } else { silu(g) } * u)
            .collect();
        self.matvec(down, mat, &act)
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| x as f64 * y as f64)
        .sum::<f64>() as f32
}

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &w)| (v as f64 * inv) as f32 * w)
        .collect()
}

fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = x.iter().map(|&v| ((v - max) as f64).exp()).sum();
    x.iter_mut()
        .for_each(|v| *v = (((*v - max) as f64).exp() / sum) as f32);
}

fn silu(x: f32) -> f32 {
    let x = x as f64;
    (x / (1.0 + (-x).exp())) as f32
}

/// GELU, tanh approximation (HF `gelu_pytorch_tanh`).
fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    let c = (2.0 / std::f64::consts::PI).sqrt();
    (0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())) as f32
}
