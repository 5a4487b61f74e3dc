//! Weights bound onto the mmap: one [`Weight`] per matrix (or stack of expert matrices), one
//! [`Layer`] per block with its optional parts as `Option`s and its FFN as an enum.

use hearth_quant::interleave::{group_rows, interleaved_row};
use hearth_quant::{vec_dot_matrix, vec_dot_matrix_interleaved, GgmlType, Rows};

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
    /// The rows are laid out in groups (of 4 or 8) for the interleaved kernels
    /// (`hearth_quant::interleave`), rewritten at load; products give the same bits either way.
    interleaved: bool,
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
        interleaved: bool,
    ) -> Weight {
        debug_assert_eq!(data.len(), row_bytes * dims[1] * dims[2]);
        Weight {
            name,
            ty,
            cols: dims[0],
            rows: dims[1],
            n_mat: dims[2],
            row_bytes,
            interleaved,
            ptr: data.as_ptr(),
            len: data.len(),
        }
    }

    /// All bytes of the tensor.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: see `Weight::new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Row `r` of matrix `mat`, in the file's layout.
    ///
    /// # Panics
    /// If the rows were interleaved at load (`Weight::interleaved`): they are read through
    /// [`Weight::product`] only.
    #[inline]
    pub fn row(&self, mat: usize, r: usize) -> &[u8] {
        assert!(!self.interleaved, "{}: rows interleaved at load", self.name);
        let start = (mat * self.rows + r) * self.row_bytes;
        &self.bytes()[start..start + self.row_bytes]
    }

    /// Row `r` of matrix `mat` in the file's layout, whatever the rows' layout: borrowed, or
    /// out of its interleaved group put back into `buf`.
    pub fn read_row<'a>(&'a self, mat: usize, r: usize, buf: &'a mut Vec<u8>) -> &'a [u8] {
        if !self.interleaved {
            return self.row(mat, r);
        }
        let rb = self.row_bytes;
        let matrix = &self.bytes()[mat * self.rows * rb..(mat + 1) * self.rows * rb];
        interleaved_row(self.ty, self.cols, matrix, r, buf)
    }

    /// Whether the rows were laid out in groups at load (`hearth_quant::interleave`).
    pub fn interleaved(&self) -> bool {
        self.interleaved
    }

    /// Rows `r0..r1` of matrix `mat` against every row of `acts`: element (row `r0 + i`, token
    /// `j`) to `out[j * out_stride + i]`, as [`vec_dot_matrix`], whatever the rows' layout.
    ///
    /// # Panics
    /// As [`vec_dot_matrix`], and for interleaved rows if `r0` or `r1` is not a multiple of the
    /// type's group rows (a group would be cut).
    #[inline]
    pub fn product(
        &self,
        mat: usize,
        r0: usize,
        r1: usize,
        acts: Rows,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let rows = self.rows_of(mat, r0, r1);
        if self.interleaved {
            vec_dot_matrix_interleaved(self.ty, self.cols, rows, acts, out, out_stride);
        } else {
            vec_dot_matrix(self.ty, self.cols, rows, acts, out, out_stride);
        }
    }

    /// Rows `r0..r1` of matrix `mat` as they are stored.
    fn rows_of(&self, mat: usize, r0: usize, r1: usize) -> Rows<'_> {
        let rb = self.row_bytes;
        let base = mat * self.rows;
        if self.interleaved {
            let g = group_rows(self.ty);
            assert!(
                r0.is_multiple_of(g) && r1.is_multiple_of(g),
                "{}: rows {r0}..{r1} cut a group of {g}",
                self.name
            );
        }
        Rows::packed(&self.bytes()[(base + r0) * rb..(base + r1) * rb], rb)
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
