//! The reference's hyperparameters, read from the file's metadata on their own (not through
//! `hearth_model::Config`), with the per-architecture choices spelled out as llama.cpp's model files
//! make them.

use hearth_gguf::{Array, Metadata, Value};

/// Everything the reference forward needs, per model and per layer.
#[derive(Clone, Debug)]
pub struct Hparams {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub eps: f32,
    /// Rotated dimensions of each head.
    pub n_rot: usize,
    /// NeoX pairs `(i, i + n_rot/2)`, else adjacent pairs `(2i, 2i+1)`.
    pub neox: bool,
    /// RoPE base of each layer `[n_layer]`.
    pub rope_base: Vec<f32>,
    /// Sliding window of each layer `[n_layer]` (`None`: the whole context).
    pub window: Vec<Option<usize>>,
    /// Scale of the attention scores.
    pub attn_scale: f32,
    /// What the token embeddings are multiplied by.
    pub embd_scale: f32,
    /// GELU (tanh) in the gated FFN, else SiLU.
    pub gelu: bool,
    /// Soft-capping of the attention scores.
    pub attn_softcap: Option<f32>,
    /// Final logit soft-capping.
    pub softcap: Option<f32>,
    /// Routed experts: (count, used, renormalise the top-k weights, weights scale).
    pub moe: Option<(usize, usize, bool, f32)>,
}

fn u(meta: &Metadata, key: &str) -> Option<usize> {
    meta.get_u64(key).map(|v| v as usize)
}

impl Hparams {
    /// Reads `{arch}.*`; panics on what a test model would never lack.
    pub fn read(meta: &Metadata) -> Hparams {
        let arch = meta.get_str("general.architecture").expect("architecture");
        let k = |s: &str| format!("{arch}.{s}");
        let n_layer = u(meta, &k("block_count")).expect("block_count");
        let n_embd = u(meta, &k("embedding_length")).expect("embedding_length");
        let n_head = u(meta, &k("attention.head_count")).expect("head_count");
        let n_head_kv = u(meta, &k("attention.head_count_kv")).unwrap_or(n_head);
        let head_dim = u(meta, &k("attention.key_length")).unwrap_or(n_embd / n_head);
        let n_rot = u(meta, &k("rope.dimension_count")).unwrap_or(head_dim);
        assert!(
            meta.get(&k("rope.scaling.type")).is_none(),
            "the reference has no RoPE scaling"
        );
        let base = meta.get_f32(&k("rope.freq_base")).unwrap_or(10_000.0);
        let (gemma2, gemma3) = (arch == "gemma2", arch == "gemma3");
        let gemma = gemma2 || gemma3;

        // Gemma 3 (llama.cpp `llama_model_gemma3`): with a window, layer l slides unless
        // l % 6 == 5 (or as the file's pattern says), and sliding layers rotate with base 10,000.
        // Gemma 2 (`llama_model_gemma2`): a window of 4096 unless the file says, every other
        // layer slides, at the global base.
        let n_swa = match arch {
            "gemma3" => u(meta, &k("attention.sliding_window")).filter(|&w| w > 0),
            "gemma2" => Some(u(meta, &k("attention.sliding_window")).unwrap_or(4096)),
            _ => None,
        };
        let sliding: Vec<bool> = match (n_swa, meta.get(&k("attention.sliding_window_pattern"))) {
            (None, _) => vec![false; n_layer],
            (Some(_), Some(Value::Array(Array::Bool(v)))) => v.clone(),
            (Some(_), p) => {
                let period = p
                    .and_then(Value::as_u32)
                    .unwrap_or(if gemma2 { 2 } else { 6 }) as usize;
                (0..n_layer)
                    .map(|l| period == 0 || l % period < period - 1)
                    .collect()
            }
        };
        let base_swa =
            meta.get_f32(&k("rope.freq_base_swa"))
                .unwrap_or(if gemma2 { base } else { 10_000.0 });
        let cap = |key: &str, default: Option<f32>| {
            meta.get_f32(&k(key)).or(default).filter(|&c| c > 0.0)
        };
        let moe = (arch == "qwen3moe").then(|| {
            (
                u(meta, &k("expert_count")).expect("expert_count"),
                u(meta, &k("expert_used_count")).expect("expert_used_count"),
                meta.get_bool(&k("expert_weights_norm")).unwrap_or(true),
                meta.get_f32(&k("expert_weights_scale")).unwrap_or(1.0),
            )
        });
        Hparams {
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            eps: meta
                .get_f32(&k("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            n_rot,
            neox: arch != "llama",
            rope_base: sliding
                .iter()
                .map(|&s| if s { base_swa } else { base })
                .collect(),
            window: sliding.iter().map(|&s| n_swa.filter(|_| s)).collect(),
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            embd_scale: if gemma { (n_embd as f32).sqrt() } else { 1.0 },
            gelu: gemma,
            attn_softcap: cap("attn_logit_softcapping", Some(50.0)).filter(|_| gemma2),
            softcap: cap("final_logit_softcapping", gemma2.then_some(30.0)).filter(|_| gemma),
            moe,
        }
    }
}
