//! Matrix products on quantized weights.
//!
//! Activations are quantized once per product to the type llama.cpp pairs with the weight type
//! (`vec_dot_type`: Q8_0, Q8_1, Q8_K, F16, BF16 or F32), then every output element is one
//! `vec_dot` of a weight row with an activation row. Rows are split across threads, never the
//! reduction: an element's value does not depend on the thread count, the batch or the tiling.

use hearth_quant::{quantize_row, vec_dot_type, GgmlType, Rows};

use crate::ops::{glu, Activation};
use crate::threads::{SharedMut, ThreadPool};
use crate::weights::Weight;

use std::cell::RefCell;

thread_local! {
    /// Per-thread output blocks of prefill calls (`[tokens][rows]`, two for gate and up), grown
    /// once: as stack arrays they were zeroed at every task, 16 KB each.
    static CALL_OUT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `dst.copy_from_slice(src)`, 16 floats at a time as fixed-size copies (inlined vector moves;
/// `copy_from_slice`, or a fixed-size copy of 64, is a `memcpy` call).
#[inline]
fn copy_block(dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len());
    let mut d = dst.chunks_exact_mut(16);
    let mut s = src.chunks_exact(16);
    for (d, s) in (&mut d).zip(&mut s) {
        let d: &mut [f32; 16] = d.try_into().expect("chunks of 16");
        *d = s.try_into().expect("chunks of 16");
    }
    d.into_remainder().copy_from_slice(s.remainder());
}

/// Runs `f` on a per-thread buffer of at least `n` floats (contents unspecified).
fn with_call_out<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    CALL_OUT.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < n {
            b.resize(n, 0.0);
        }
        f(&mut b[..n])
    })
}

/// Activations quantized to one type: `n_rows` rows of `row_bytes` bytes.
pub struct QuantActs {
    ty: GgmlType,
    cols: usize,
    row_bytes: usize,
    n_rows: usize,
    data: Vec<u8>, // [n_rows, row_bytes], capacity sized once
}

impl QuantActs {
    /// An empty buffer with room for `max_rows` rows of `max_cols` elements of any type.
    pub fn with_capacity(max_rows: usize, max_cols: usize) -> QuantActs {
        // F32 is the widest activation type (4 bytes per element).
        QuantActs {
            ty: GgmlType::F32,
            cols: 0,
            row_bytes: 0,
            n_rows: 0,
            data: Vec::with_capacity(max_rows * max_cols * 4),
        }
    }

    /// The type the rows are quantized to.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Quantizes `n_rows` rows of `cols` floats from `x` (row stride `stride`) for products with
    /// `w_ty` weights, rows split over the pool's threads.
    pub fn quantize(
        &mut self,
        pool: &ThreadPool,
        w_ty: GgmlType,
        x: &[f32],
        n_rows: usize,
        cols: usize,
        stride: usize,
    ) {
        self.prepare(w_ty, n_rows, cols);
        let (ty, row_bytes) = (self.ty, self.row_bytes);
        if n_rows == 0 {
            return;
        }
        pool.for_rows(
            &mut self.data[..n_rows * row_bytes],
            row_bytes,
            quantize_rows_per_task(n_rows, cols, pool.n_threads()),
            &|rows, r0| {
                for (i, dst) in rows.chunks_exact_mut(row_bytes).enumerate() {
                    let r = r0 + i;
                    quantize_row(ty, &x[r * stride..r * stride + cols], dst)
                        .expect("activation types have quantizers");
                }
            },
        );
    }

    /// Shapes the buffer for `n_rows` rows of `cols` elements quantized for products with `w_ty`
    /// weights, without writing them: every row must be written before it is read.
    fn prepare(&mut self, w_ty: GgmlType, n_rows: usize, cols: usize) {
        let ty = vec_dot_type(w_ty);
        self.ty = ty;
        self.cols = cols;
        self.row_bytes = ty
            .row_bytes(cols as u64)
            .expect("weight shapes were checked at load") as usize;
        self.n_rows = n_rows;
        self.reserve_rows();
    }

    /// Rows `rows[i]` of `src`, in that order, rows split over the pool's threads.
    pub fn gather(&mut self, pool: &ThreadPool, src: &QuantActs, rows: &[u32]) {
        let row_bytes = src.row_bytes;
        self.ty = src.ty;
        self.cols = src.cols;
        self.row_bytes = row_bytes;
        self.n_rows = rows.len();
        self.reserve_rows();
        if rows.is_empty() || row_bytes == 0 {
            return;
        }
        pool.for_rows(
            &mut self.data[..rows.len() * row_bytes],
            row_bytes,
            quantize_rows_per_task(rows.len(), src.cols, pool.n_threads()),
            &|dst, r0| {
                for (i, d) in dst.chunks_exact_mut(row_bytes).enumerate() {
                    d.copy_from_slice(src.row(rows[r0 + i] as usize));
                }
            },
        );
    }

    /// Makes `data` hold at least `n_rows` rows. It only grows: every row in use is written before
    /// it is read, so zeroing the buffer again for every call (a memset of up to ~10 MB per MoE
    /// layer in a prefill) buys nothing.
    fn reserve_rows(&mut self) {
        let need = self.n_rows * self.row_bytes;
        if self.data.len() < need {
            self.data.resize(need, 0);
        }
    }

    /// Row `r`.
    #[inline]
    pub fn row(&self, r: usize) -> &[u8] {
        assert!(r < self.n_rows, "row {r} of {}", self.n_rows);
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// `count` consecutive rows from `start`, back to back (`row_bytes` each).
    #[inline]
    pub fn rows(&self, start: usize, count: usize) -> &[u8] {
        assert!(
            start + count <= self.n_rows,
            "rows {start}+{count} of {}",
            self.n_rows
        );
        &self.data[start * self.row_bytes..(start + count) * self.row_bytes]
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Rows held.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }
}

/// One group of a product: matrix `mat` of a stacked weight applied to the activation rows
/// `start..start + n`.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    /// Which matrix of a stacked weight (0 for plain weights).
    pub mat: usize,
    /// First entry of the group in the row lists.
    pub start: usize,
    /// Number of rows in the group.
    pub n: usize,
}

impl Group {
    /// The single group of a dense product: matrix 0 over rows `0..n`.
    pub fn all(n: usize) -> Group {
        Group {
            mat: 0,
            start: 0,
            n,
        }
    }
}

/// Activation rows quantized per task, at most.
const QUANTIZE_ROWS_PER_TASK: usize = 8;

/// Elements up to which quantizing (or gathering) activation rows is one task, run in place on
/// the calling thread: a pass's hand-off and wait cost more than the work (see
/// `forward::INLINE_ELEMENTS`). A server step of 8 sequences of SmolLM2 quantizes 8 rows of 576
/// or 1536 before each product: one task each. (Split over the threads, `q8_1_row` left the
/// profile's engine thread, but the passes cost more than it saved.)
const INLINE_ELEMENTS: usize = 16 << 10;

/// Rows per task of quantizing `n_rows` activation rows of `cols` elements: one task for at most
/// [`INLINE_ELEMENTS`], else [`QUANTIZE_ROWS_PER_TASK`] or fewer so that every thread gets a
/// share.
fn quantize_rows_per_task(n_rows: usize, cols: usize, threads: usize) -> usize {
    if n_rows.saturating_mul(cols) <= INLINE_ELEMENTS {
        return n_rows.max(1);
    }
    n_rows
        .div_ceil(threads.max(1))
        .clamp(1, QUANTIZE_ROWS_PER_TASK)
}

/// The granularity of a task's rows (one register block of the lanes kernels); decode tasks make
/// one kernel call for all their rows, prefill tasks one per [`PREFILL_ROWS_PER_CALL`].
const ROWS_PER_CALL: usize = 16;

/// Output rows per matrix-kernel call when several tokens share each weight row (prefill): the
/// kernel prepares the tokens' activation blocks once per call, so calls of more rows prepare
/// them less often. Tasks are then this many rows when the pass keeps at least 16 per thread.
const PREFILL_ROWS_PER_CALL: usize = 64;

/// Weight bytes per task when one token meets each weight row (decode): each thread then streams
/// long runs of consecutive rows, which the hardware prefetchers follow (12-layer MoE tg128: 64 KB
/// tasks 30-33 t/s, 256 KB 36-40, 1 MB 37-39; a plain 2-thread read of the mapped file peaks at
/// ~26 GB/s here).
const TASK_BYTES: usize = 1 << 20;

/// Rows per task for a product of `w` whose groups hold `tokens` rows in all. Which task computes
/// an output never changes its value.
fn rows_per_task(
    w: &Weight,
    n_groups: usize,
    tokens: usize,
    threads: usize,
    pass_bytes: usize,
) -> usize {
    rows_per_task_of(w.row_bytes, w.rows, n_groups, tokens, threads, pass_bytes)
}

/// [`rows_per_task`] for `rows` rows that each read `row_bytes` bytes of weights.
///
/// Decode (one token per group): a group's rows in equal tasks of about [`TASK_BYTES`], and none
/// larger than a thread's share of the whole pass (`pass_bytes`, every product and group of it
/// over the threads). Every task starts a new stream from memory, whose first rows wait on the
/// loads until the prefetches get ahead, so small matrices are cut into as few tasks as keep the
/// threads busy: SmolLM2's 576-row products in two halves instead of eight 72-row tasks took
/// decode from 119 to 139 t/s (medians of 6 alternating `hearth bench -p 0 -n 256` runs, Zen 4,
/// AVX-512), and the loss of balance between the threads costs less than that. In a pass of
/// several products (Q, K and V) a small one is not split when the others give the threads their
/// shares: SmolLM2's K and V (69 KB each) run whole next to Q's halves.
///
/// Otherwise several kernel calls' worth of rows when each weight byte serves few tokens, as long
/// as the pass keeps at least four tasks per thread.
fn rows_per_task_of(
    row_bytes: usize,
    rows: usize,
    n_groups: usize,
    tokens: usize,
    threads: usize,
    pass_bytes: usize,
) -> usize {
    let n_groups = n_groups.max(1);
    let per_group = tokens.div_ceil(n_groups).max(1);
    if per_group == 1 {
        let bytes = rows * row_bytes;
        // A thread's share of the whole pass: no task of this product is larger.
        let share = pass_bytes
            .max(n_groups * bytes)
            .div_ceil(threads.max(1))
            .max(1);
        let tasks = bytes.div_ceil(TASK_BYTES).max(bytes.div_ceil(share)).max(1);
        return rows.div_ceil(tasks).next_multiple_of(ROWS_PER_CALL).max(1);
    }
    let mut calls = (TASK_BYTES / (ROWS_PER_CALL * row_bytes * per_group)).clamp(1, 64);
    // Prefill: tasks of a whole prefill call where there are enough of them that the threads
    // still finish together (SmolLM2's 576-row products in 9 tasks left a thread idle).
    if n_groups * rows.div_ceil(PREFILL_ROWS_PER_CALL) >= 16 * threads {
        calls = calls.max(PREFILL_ROWS_PER_CALL / ROWS_PER_CALL);
    }
    while calls > 1 && n_groups * rows.div_ceil(calls * ROWS_PER_CALL) < 4 * threads {
        calls /= 2;
    }
    calls * ROWS_PER_CALL
}

/// Activation rows per matrix call in dense products.
const TOKENS_PER_CALL: usize = 64;

/// One product of a fused pass: a weight and where its outputs go (row stride `out_stride`).
pub struct Product<'a> {
    /// The weight.
    pub w: &'a Weight,
    /// The output rows.
    pub out: &'a mut [f32],
    /// Elements between consecutive output rows.
    pub out_stride: usize,
}

/// For every product, group, entry `i` of the group and weight row `r`:
/// `out[out_rows[i]][r] = w[mat].row(r) · acts[i]` (without `out_rows`, `out[i][r]`).
///
/// All products share the activations (so their weights share an activation type and width) and run
/// in one parallel pass: Q, K and V, or an FFN's gate and up, cost one hand-off instead of several.
/// A group's activation rows are consecutive, so every task is one matrix-kernel call per block of
/// tokens: rows split across threads, never the reduction.
pub fn matmul_fused(
    pool: &ThreadPool,
    products: &mut [Product],
    acts: &QuantActs,
    groups: &[Group],
    out_rows: Option<&[u32]>,
) {
    const MAX_PRODUCTS: usize = 4;
    assert!(products.len() <= MAX_PRODUCTS);
    let mut first_task = [0usize; MAX_PRODUCTS + 1];
    let mut task_rows = [0usize; MAX_PRODUCTS];
    let mut outs = [(SharedMut::dangling(), 0usize); MAX_PRODUCTS];
    let tokens: usize = groups.iter().map(|g| g.n).sum();
    let pass_bytes: usize = products
        .iter()
        .map(|p| groups.len() * p.w.rows * p.w.row_bytes)
        .sum();
    for (i, p) in products.iter_mut().enumerate() {
        debug_assert_eq!(acts.ty, vec_dot_type(p.w.ty));
        debug_assert_eq!(acts.cols, p.w.cols);
        task_rows[i] = rows_per_task(p.w, groups.len(), tokens, pool.n_threads(), pass_bytes);
        first_task[i + 1] = first_task[i] + groups.len() * p.w.rows.div_ceil(task_rows[i]);
        outs[i] = (SharedMut::new(p.out), p.out.len());
    }
    let n = products.len();
    let weights: [Option<(&Weight, usize)>; MAX_PRODUCTS] =
        std::array::from_fn(|i| products.get(i).map(|p| (p.w, p.out_stride)));
    pool.run(first_task[n], &|task| {
        let pi = (0..n)
            .rfind(|&i| first_task[i] <= task)
            .expect("task in range");
        let (w, out_stride) = weights[pi].expect("product present");
        let (out_ptr, out_len) = outs[pi];
        let local = task - first_task[pi];
        let chunks = w.rows.div_ceil(task_rows[pi]);
        let g = &groups[local / chunks];
        let t0 = (local % chunks) * task_rows[pi];
        let t1 = (t0 + task_rows[pi]).min(w.rows);
        if g.n == 1 {
            // One token (decode): one call for all the task's rows, written in place; the
            // per-call checks and dispatch cost as much as a few rows' arithmetic.
            let row = out_rows.map_or(g.start, |rows| rows[g.start] as usize);
            let at = row * out_stride + t0;
            assert!(at + (t1 - t0) <= out_len);
            let a = Rows::packed(acts.rows(g.start, 1), acts.row_bytes());
            // SAFETY: in bounds (asserted); each (product, output row, weight row) is written by
            // exactly one task.
            let dst = unsafe { out_ptr.slice(at, t1 - t0) };
            w.product(g.mat, t0, t1, a, dst, 1);
            return;
        }
        // Rows per call, and the stride of the call's output block.
        let rpc = (t1 - t0).min(PREFILL_ROWS_PER_CALL);
        with_call_out(rpc * TOKENS_PER_CALL, |buf| {
            for r0 in (t0..t1).step_by(rpc) {
                let r1 = (r0 + rpc).min(t1);
                // One matrix call per block of tokens, so the per-call checks and dispatch are paid
                // once per block rather than once per weight row.
                let nr = r1 - r0;
                for j0 in (g.start..g.start + g.n).step_by(TOKENS_PER_CALL) {
                    let k = (g.start + g.n - j0).min(TOKENS_PER_CALL);
                    let a = Rows::packed(acts.rows(j0, k), acts.row_bytes());
                    w.product(g.mat, r0, r1, a, &mut buf[..(k - 1) * rpc + nr], rpc);
                    for j in 0..k {
                        let row = out_rows.map_or(j0 + j, |rows| rows[j0 + j] as usize);
                        let at = row * out_stride + r0;
                        assert!(at + nr <= out_len);
                        // SAFETY: in bounds (asserted); each (product, output row, weight row) is
                        // written by exactly one task.
                        let dst = unsafe { out_ptr.slice(at, nr) };
                        copy_block(dst, &buf[j * rpc..j * rpc + nr]);
                    }
                }
            }
        });
    });
}

/// An FFN's gate and up products and the gated unit between them in one pass:
/// `out[i][r] = act(gate[mat].row(r) · acts[i]) * (up[mat].row(r) · acts[i])` for every group and
/// entry `i` (rows `out[i]`, stride `out_stride`); `act` is SiLU for a SwiGLU, GELU for a GeGLU.
/// Each task computes a block of gate rows and the same up rows for its tokens and applies [`glu`]
/// to them in registers-sized buffers, so the up product is never stored and there is no separate
/// pass. The values are those of [`matmul_fused`] then [`glu`], bit for bit.
///
/// With `quant` (the activations of the product that reads this output, and its weight type),
/// each task also quantizes its piece of every output row from where it just computed it, when
/// the type's blocks are short enough for the tasks' pieces to hold whole blocks (Q8_0 and
/// Q8_1, not Q8_K): the same bytes as [`QuantActs::quantize`] of the output, a block depending on
/// its own 32 values alone, without a pass that reads the output back from memory (a prefill's
/// `[512, 1536]` floats: 3 MB, past the L2 cache). Several tokens' rows are then not stored as
/// floats (`out` is scratch); a single token's are. With longer blocks (Q8_K) the output is
/// quantized after the pass, so `quant` is written either way.
#[allow(clippy::too_many_arguments)]
pub fn matmul_swiglu(
    pool: &ThreadPool,
    act: Activation,
    gate: &Weight,
    up: &Weight,
    acts: &QuantActs,
    groups: &[Group],
    out: &mut [f32],
    out_stride: usize,
    quant_out: Option<(&mut QuantActs, GgmlType)>,
) {
    assert!(gate.rows == up.rows && gate.cols == up.cols);
    assert!(acts.ty == vec_dot_type(gate.ty) && acts.ty == vec_dot_type(up.ty));
    let tokens: usize = groups.iter().map(|g| g.n).sum();
    // A row of the pass reads a gate row and an up row.
    let row_bytes = gate.row_bytes + up.row_bytes;
    let mut task_rows = rows_per_task_of(
        row_bytes,
        gate.rows,
        groups.len(),
        tokens,
        pool.n_threads(),
        groups.len() * gate.rows * row_bytes,
    );
    // Quantized in the tasks: every piece of a row (a task's rows, cut at multiples of
    // `PREFILL_ROWS_PER_CALL` from its first) whole blocks of the activation type.
    // The rest quantize the output after the pass (`after`).
    let (mut after, mut quant) = (None, None);
    if let Some((q, w_ty)) = quant_out {
        let qb = vec_dot_type(w_ty).block_size();
        if (2..=PREFILL_ROWS_PER_CALL).contains(&qb)
            && PREFILL_ROWS_PER_CALL.is_multiple_of(qb)
            && gate.rows.is_multiple_of(qb)
        {
            task_rows = task_rows.next_multiple_of(qb);
            q.prepare(w_ty, tokens, gate.rows);
            let (ty, rb) = (q.ty, q.row_bytes);
            quant = Some((SharedMut::new(&mut q.data[..tokens * rb]), ty, rb, qb));
        } else {
            after = Some((q, w_ty));
        }
    }
    let fused = quant.is_some();
    // Token `t`'s output elements `r0..r0 + x.len()`, quantized into `quant` (`r0` and the length
    // multiples of the block).
    let put = |t: usize, r0: usize, x: &[f32]| {
        if let Some((q, ty, rb, qb)) = &quant {
            let bb = rb / (gate.rows / qb);
            let (at, len) = (t * rb + r0 / qb * bb, x.len() / qb * bb);
            assert!(at + len <= tokens * rb);
            // SAFETY: in bounds (asserted); each (token, block) is written by exactly one task.
            let dst = unsafe { q.slice(at, len) };
            quantize_row(*ty, x, dst).expect("activation types have quantizers");
        }
    };
    let chunks = gate.rows.div_ceil(task_rows);
    let out_len = out.len();
    let out_ptr = SharedMut::new(out);
    pool.run(groups.len() * chunks, &|task| {
        let g = &groups[task / chunks];
        let t0 = (task % chunks) * task_rows;
        let t1 = (t0 + task_rows).min(gate.rows);
        let mat = g.mat;
        if g.n == 1 {
            // One token: the gate rows straight into the output, the up rows beside them.
            let at = g.start * out_stride + t0;
            assert!(at + (t1 - t0) <= out_len);
            let a = Rows::packed(acts.rows(g.start, 1), acts.row_bytes());
            // SAFETY: in bounds (asserted); each (output row, weight row) is written by one task.
            let dst = unsafe { out_ptr.slice(at, t1 - t0) };
            gate.product(mat, t0, t1, a, dst, 1);
            let mut u = [0f32; 1024];
            for (c, d) in dst.chunks_mut(u.len()).enumerate() {
                let (r0, r1) = (t0 + c * u.len(), t0 + c * u.len() + d.len());
                up.product(mat, r0, r1, a, &mut u[..d.len()], 1);
                glu(act, d, &u[..d.len()]);
            }
            put(g.start, t0, dst);
            return;
        }
        let rpc = (t1 - t0).min(PREFILL_ROWS_PER_CALL);
        with_call_out(2 * rpc * TOKENS_PER_CALL, |b| {
            let (bg, bu) = b.split_at_mut(rpc * TOKENS_PER_CALL);
            for r0 in (t0..t1).step_by(rpc) {
                let r1 = (r0 + rpc).min(t1);
                let nr = r1 - r0;
                for j0 in (g.start..g.start + g.n).step_by(TOKENS_PER_CALL) {
                    let k = (g.start + g.n - j0).min(TOKENS_PER_CALL);
                    let a = Rows::packed(acts.rows(j0, k), acts.row_bytes());
                    let len = (k - 1) * rpc + nr;
                    gate.product(mat, r0, r1, a, &mut bg[..len], rpc);
                    up.product(mat, r0, r1, a, &mut bu[..len], rpc);
                    // Element-wise, so the columns past `nr` (not stored) do not matter.
                    glu(act, &mut bg[..len], &bu[..len]);
                    for j in 0..k {
                        let b = j * rpc;
                        if fused {
                            put(j0 + j, r0, &bg[b..b + nr]);
                            continue;
                        }
                        let at = (j0 + j) * out_stride + r0;
                        assert!(at + nr <= out_len);
                        // SAFETY: in bounds (asserted); each (output row, weight row) is written by
                        // exactly one task.
                        let dst = unsafe { out_ptr.slice(at, nr) };
                        copy_block(dst, &bg[b..b + nr]);
                    }
                }
            }
        });
    });
    if let Some((q, w_ty)) = after {
        q.quantize(pool, w_ty, out, tokens, gate.rows, out_stride);
    }
}

/// [`matmul_fused`] with one product.
pub fn matmul_gather(
    pool: &ThreadPool,
    w: &Weight,
    acts: &QuantActs,
    groups: &[Group],
    out_rows: Option<&[u32]>,
    out: &mut [f32],
    out_stride: usize,
) {
    matmul_fused(
        pool,
        &mut [Product { w, out, out_stride }],
        acts,
        groups,
        out_rows,
    );
}

/// `out[t][r] = w.row(r) · acts[t]` for the first `n` activation rows: a plain dense product.
pub fn matmul(
    pool: &ThreadPool,
    w: &Weight,
    acts: &QuantActs,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    matmul_gather(pool, w, acts, &[Group::all(n)], None, out, out_stride);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_tasks_are_equal_whole_calls_and_cover_every_thread() {
        // (row bytes, rows, groups, threads) -> tasks of the pass
        for (rb, rows, groups, threads, tasks) in [
            (360, 576, 1, 2, 2),        // SmolLM2 Q4_1 576 x 576: two halves
            (360, 576, 1, 4, 4),        // a quarter each on four threads
            (720, 1536, 1, 2, 2),       // its gate + up, 1.1 MB: two tasks
            (1680, 151_936, 1, 2, 244), // a Q6_K output of 255 MB: ~1 MB tasks
            (2304, 768, 8, 2, 16),      // eight experts' gate + up, 1.8 MB each
            (360, 40, 1, 2, 2),         // fewer rows than two calls
            (360, 5, 1, 2, 1),          // fewer rows than one call: one task
        ] {
            let per = rows_per_task_of(rb, rows, groups, groups, threads, groups * rows * rb);
            assert_eq!(per % ROWS_PER_CALL, 0, "{rows} rows: {per} per task");
            assert_eq!(groups * rows.div_ceil(per), tasks, "{rows} rows of {rb} B");
        }
    }

    #[test]
    fn decode_pass_of_several_products_splits_only_what_exceeds_a_share() {
        // SmolLM2's Q, K and V (Q4_1, 576 columns: 360 B rows) in one pass on two threads: Q in
        // halves, K and V whole, so each thread streams 173 KB.
        let pass = (576 + 192 + 192) * 360;
        let tasks = |rows: usize| rows.div_ceil(rows_per_task_of(360, rows, 1, 1, 2, pass));
        assert_eq!((tasks(576), tasks(192)), (2, 1));
        // On four threads each is cut to at most a quarter of the pass (86 KB).
        let tasks4 = |rows: usize| rows.div_ceil(rows_per_task_of(360, rows, 1, 1, 4, pass));
        assert_eq!((tasks4(576), tasks4(192)), (3, 1));
        // Prefill ignores the pass's size.
        assert_eq!(
            rows_per_task_of(360, 576, 1, 64, 2, pass),
            rows_per_task_of(360, 576, 1, 64, 2, 0)
        );
    }

    /// A `rows x cols` weight of type `ty` from a smooth pattern (its bytes kept in `store`).
    fn weight(store: &mut Vec<u8>, ty: GgmlType, rows: usize, cols: usize, seed: f32) -> Weight {
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as f32 + seed) * 0.61).sin())
            .collect();
        let rb = ty.row_bytes(cols as u64).unwrap() as usize;
        *store = vec![0u8; rows * rb];
        for (r, dst) in store.chunks_exact_mut(rb).enumerate() {
            hearth_quant::quantize_row(ty, &x[r * cols..(r + 1) * cols], dst).unwrap();
        }
        // SAFETY: the test keeps `store` alive and unchanged while the weight is used.
        unsafe { Weight::new("w".into(), ty, [cols, rows, 1], rb, store, false) }
    }

    #[test]
    fn gated_unit_quantized_in_its_pass_is_the_quantized_output() {
        // The quantized gated unit of `matmul_swiglu` (decode's one token and prefill's blocks of
        // tokens, on one and two threads) is the quantization of its float output, byte for byte,
        // also for Q8_K, whose blocks do not fit a task's pieces and are quantized after the pass.
        let (cols, rows) = (64, 256);
        let (mut gs, mut us) = (vec![], vec![]);
        let gate = weight(&mut gs, GgmlType::Q4_1, rows, cols, 0.0);
        let up = weight(&mut us, GgmlType::Q4_1, rows, cols, 7.0);
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            for n in [1, 3, 8, 70] {
                let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.37).cos()).collect();
                let mut acts = QuantActs::with_capacity(n, cols);
                acts.quantize(&pool, gate.ty, &x, n, cols, cols);
                let all = [Group::all(n)];
                let mut out = vec![0f32; n * rows];
                let act = Activation::Silu;
                matmul_swiglu(&pool, act, &gate, &up, &acts, &all, &mut out, rows, None);
                for down_ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K] {
                    let mut want = QuantActs::with_capacity(n, rows);
                    want.quantize(&pool, down_ty, &out, n, rows, rows);
                    let mut got = QuantActs::with_capacity(n, rows);
                    let mut scratch = vec![0f32; n * rows];
                    let q = Some((&mut got, down_ty));
                    matmul_swiglu(&pool, act, &gate, &up, &acts, &all, &mut scratch, rows, q);
                    assert_eq!((got.ty(), got.n_rows()), (want.ty(), want.n_rows()));
                    assert_eq!(
                        got.rows(0, n),
                        want.rows(0, n),
                        "{down_ty}, {n} tokens, {threads} threads"
                    );
                }
            }
        }
    }
}
