//! Weights bound onto the mmap: one [`Weight`] per matrix (or stack of expert matrices), one
//! [`Layer`] per block with its optional parts as `Option`s and its FFN as an enum.

use hearth_quant::GgmlType;

/// A matrix (or a stack of `n_mat` matrices) of quantized rows, viewed zero-copy in the mmap.
///
/// ggml order: `cols` (ne0) is the reduction dimension, `rows` (ne1) the outputs, `n_mat` (ne2) the
/// experts of a stacked MoE tensor.
pub struct Weight {
    /// GGUF tensor name, for errors and traces.
    pub name: String,
    /// Element type of the rows.
    pub ty: GgmlType,
    /// Elements per row (the input width).
    pub cols: usize,
    /// Rows per matrix (the output width).
    pub rows: usize,
    /// Matrices in the stack (1 for plain weights).
    pub n_mat: usize,
    /// Bytes of one row.
    pub row_bytes: usize,
    ptr: *const u8,
    len: usize,
}

// SAFETY: a Weight is a read-only view into the model's mmap, which the `Model` keeps alive
// (it owns the `Arc<Gguf>`) for as long as any of its weights exist.
unsafe impl Send for Weight {}
unsafe impl Sync for Weight {}

impl Weight {
    /// # Safety
    /// `data` must stay valid and unchanged for the lifetime of the returned weight.
    pub(crate) unsafe fn new(
        name: String,
        ty: GgmlType,
        dims: [usize; 3],
        row_bytes: usize,
        data: &[u8],
    ) -> Weight {
        debug_assert_eq!(data.len(), row_bytes * dims[1] * dims[2]);
        Weight {
            name,
            ty,
            cols: dims[0],
            rows: dims[1],
            n_mat: dims[2],
            row_bytes,
            ptr: data.as_ptr(),
            len: data.len(),
        }
    }

    /// All bytes of the tensor.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: see `Weight::new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Row `r` of matrix `mat`.
    #[inline]
    pub fn row(&self, mat: usize, r: usize) -> &[u8] {
        let start = (mat * self.rows + r) * self.row_bytes;
        &self.bytes()[start..start + self.row_bytes]
    }
}

/// The feed-forward network of one block.
pub enum Ffn {
    /// Gated: `down(act(gate x) * up x)` (SwiGLU, GeGLU).
    Dense {
        /// `[n_embd, n_ff]`
        gate: Weight,
        /// `[n_embd, n_ff]`
        up: Weight,
        /// `[n_ff, n_embd]`
        down: Weight,
    },
    /// Routed experts: softmax router, top-k, gated experts, weighted sum.
    Moe {
        /// Router `[n_embd, n_expert]`.
        gate_inp: Weight,
        /// `[n_embd, n_ff_exp, n_expert]`
        gate_exps: Weight,
        /// `[n_embd, n_ff_exp, n_expert]`
        up_exps: Weight,
        /// `[n_ff_exp, n_embd, n_expert]`
        down_exps: Weight,
    },
}

/// One transformer block. Parts that only some architectures have are `Option`s.
pub struct Layer {
    /// `[n_embd]`
    pub attn_norm: Vec<f32>,
    /// `[n_embd, n_head * head_dim]`
    pub wq: Weight,
    /// `[n_embd, n_head_kv * head_dim]`
    pub wk: Weight,
    /// `[n_embd, n_head_kv * head_dim_v]`
    pub wv: Weight,
    /// `[n_head * head_dim_v, n_embd]`
    pub wo: Weight,
    /// `[n_head * head_dim]` (Qwen2)
    pub bq: Option<Vec<f32>>,
    /// `[n_head_kv * head_dim]` (Qwen2)
    pub bk: Option<Vec<f32>>,
    /// `[n_head_kv * head_dim_v]` (Qwen2)
    pub bv: Option<Vec<f32>>,
    /// `[head_dim]`, shared by all query heads (Qwen3)
    pub q_norm: Option<Vec<f32>>,
    /// `[head_dim]`, shared by all key heads (Qwen3)
    pub k_norm: Option<Vec<f32>>,
    /// `[n_embd]`, on the attention output before the residual add (Gemma)
    pub attn_post_norm: Option<Vec<f32>>,
    /// `[n_embd]`
    pub ffn_norm: Vec<f32>,
    /// Dense or routed.
    pub ffn: Ffn,
    /// `[n_embd]`, on the FFN output before the residual add (Gemma)
    pub ffn_post_norm: Option<Vec<f32>>,
}
