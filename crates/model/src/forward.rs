//! The one forward pass: every architecture, prefill and decode alike, over a batch of tokens that may
//! belong to different sequences.
//!
//! A batch row's result depends only on its own sequence (its token, position and KV cache): products
//! reduce each output element in a fixed order, attention reads only the row's own sequence, and the
//! routed FFN computes each (token, expert) pair independently of how tokens are grouped.

use hearth_quant::{dequantize_row, vec_dot_type};

use crate::attention::{attend, AttnRows, AttnScratch};
use crate::error::ModelError;
use crate::kv_cache::KvCache;
use crate::kv_rotate::{fwht, Rotation};
use crate::matmul::{
    matmul, matmul_fused, matmul_gather, matmul_swiglu, Group, Product, QuantActs,
};
use crate::model::Model;
use crate::ops::{
    add_assign, glu, rms_norm, rms_norm_into, rms_norm_rows, softcap, softmax, Activation,
};
use crate::threads::ThreadPool;
use crate::weights::{Ffn, Layer, Weight};

/// Tokens to run, with where each one goes.
pub struct Batch<'a> {
    /// Token ids `[T]`.
    pub tokens: &'a [u32],
    /// Position of each token in its sequence `[T]`.
    pub pos: &'a [usize],
    /// Sequence slot of each token in the KV cache `[T]`.
    pub seq: &'a [usize],
    /// Whether to compute logits after each token `[T]`.
    pub logits: &'a [bool],
}

/// Receives named intermediate tensors (llama.cpp's names: `attn_norm-0`, `Qcur-0`, `l_out-1`, …),
/// for `hearth trace`. `data` is `[rows, cols]` row-major: `rows` tokens of `cols` values.
pub trait Tap {
    /// One intermediate tensor.
    fn tensor(&mut self, name: &str, layer: Option<usize>, data: &[f32], rows: usize, cols: usize);
    /// The experts chosen for each token of an MoE layer (`[T, k]`) with their weights.
    fn experts(&mut self, _layer: usize, _selected: &[u32], _weights: &[f32], _k: usize) {}
}

/// Buffers of the forward pass, sized once for a maximum batch.
pub struct Scratch {
    max_tokens: usize,
    x: Vec<f32>,           // [T, n_embd] residual stream
    xn: Vec<f32>,          // [T, n_embd] normed input of the current sublayer
    q: Vec<f32>,           // [T, n_head * head_dim]
    k: Vec<f32>,           // [T, n_head_kv * head_dim]
    v: Vec<f32>,           // [T, n_head_kv * head_dim_v]
    attn: Vec<f32>,        // [T, n_head * head_dim_v]
    proj: Vec<f32>,        // [T, n_embd] output of attn_output / ffn_down
    ffn_a: Vec<f32>,       // [T * max(1, k), max(n_ff, n_ff_exp)] gate, then the gated unit
    ffn_b: Vec<f32>,       // [T * max(1, k), max(n_ff, n_ff_exp)] up
    moe_out: Vec<f32>,     // [T * k, n_embd] each (token, expert) pair's down projection
    router: Vec<f32>,      // [T, n_expert]
    sel: Vec<u32>,         // [T, k] chosen experts, by descending probability
    sel_w: Vec<f32>,       // [T, k] their weights
    pair_tok: Vec<u32>,    // [T * k] token of each pair, grouped by expert
    pair_id: Vec<u32>,     // [T * k] pair index (t * k + slot), grouped by expert
    groups: Vec<Group>,    // [n_expert]
    expert_at: Vec<usize>, // [n_expert + 1] counting-sort offsets
    expert_load: Vec<u64>, // [n_expert] (token, layer) routings computed per expert, since creation
    cos: Vec<f32>,         // [n_ropes, T, n_rot / 2] per RoPE table, stride max_tokens rows
    sin: Vec<f32>,         // [n_ropes, T, n_rot / 2]
    lo: Vec<usize>,        // [T] first key of each row in the current layer
    acts: QuantActs,
    tok_acts: QuantActs, // [T] the batch rows quantized once, gathered into `acts` per expert pair
    ffn_acts: QuantActs, // [T * max(1, k), ff] the gated unit quantized for the down projection
    out_rows: Vec<usize>, // [T] batch rows whose logits are wanted
    attn_scratch: AttnScratch, // attention's task lists and chunk states
    logits: Vec<f32>,    // [T, n_vocab]
    embd_row: Vec<u8>, // a token embedding's group of rows, in the file's layout, where interleaved
}

impl Scratch {
    /// Buffers for batches of up to `max_tokens` tokens.
    pub fn new(model: &Model, max_tokens: usize) -> Scratch {
        let c = &model.config;
        let t = max_tokens.max(1);
        let (k, n_expert, n_ff_exp) = c
            .moe
            .as_ref()
            .map_or((1, 0, 0), |m| (m.n_expert_used, m.n_expert, m.n_ff_exp));
        let ff = c.n_ff.max(n_ff_exp);
        let widest = [c.n_embd, c.q_dim(), c.n_head * c.head_dim_v, ff]
            .into_iter()
            .max()
            .unwrap_or(0);
        Scratch {
            max_tokens: t,
            x: vec![0.0; t * c.n_embd],
            xn: vec![0.0; t * c.n_embd],
            q: vec![0.0; t * c.q_dim()],
            k: vec![0.0; t * c.k_dim()],
            v: vec![0.0; t * c.v_dim()],
            attn: vec![0.0; t * c.n_head * c.head_dim_v],
            proj: vec![0.0; t * c.n_embd],
            ffn_a: vec![0.0; t * k * ff],
            ffn_b: vec![0.0; t * k * ff],
            moe_out: vec![0.0; if n_expert > 0 { t * k * c.n_embd } else { 0 }],
            router: vec![0.0; t * n_expert],
            sel: vec![0; t * k],
            sel_w: vec![0.0; t * k],
            pair_tok: vec![0; t * k],
            pair_id: vec![0; t * k],
            groups: Vec::with_capacity(n_expert),
            expert_at: Vec::with_capacity(n_expert + 1),
            expert_load: vec![0; n_expert],
            cos: vec![0.0; c.ropes.len() * t * c.rope().n_rot / 2],
            sin: vec![0.0; c.ropes.len() * t * c.rope().n_rot / 2],
            lo: vec![0; t],
            acts: QuantActs::with_capacity(t * k, widest),
            tok_acts: QuantActs::with_capacity(if n_expert > 0 { t } else { 0 }, widest),
            ffn_acts: QuantActs::with_capacity(t * k, ff),
            out_rows: Vec::with_capacity(t),
            attn_scratch: AttnScratch::default(),
            logits: vec![0.0; t * c.n_vocab],
            embd_row: Vec::new(),
        }
    }

    /// The largest batch these buffers hold.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The logits of the last [`Model::forward`] through these buffers (`[n_out, n_vocab]`, the
    /// rows whose logits were asked for, in batch order): the same slice it returned.
    pub fn logits(&self) -> &[f32] {
        let n_vocab = self.logits.len() / self.max_tokens;
        &self.logits[..self.out_rows.len() * n_vocab]
    }

    /// [`Scratch::logits`], writable: a sampler may adjust a row in place (the next forward pass
    /// overwrites them all).
    pub fn logits_mut(&mut self) -> &mut [f32] {
        let n_vocab = self.logits.len() / self.max_tokens;
        &mut self.logits[..self.out_rows.len() * n_vocab]
    }

    /// Per expert, the (token, layer) routings the forward passes through these buffers computed
    /// (MoE models; empty otherwise). Counted as a by-product of grouping tokens by expert, so
    /// reading it changes nothing that is computed. Past the last layer's attention only the rows
    /// whose logits are wanted run the FFN, so its routings count for those rows only.
    pub fn expert_load(&self) -> &[u64] {
        &self.expert_load
    }
}

/// Products that read the same input `x` (`[n, cols]`): quantized once per activation type, and
/// every product of a type run in one fused pass.
fn shared_input_products(
    pool: &ThreadPool,
    acts: &mut QuantActs,
    x: &[f32],
    n: usize,
    groups: &[Group],
    products: &mut [Product],
) {
    let mut done = 0;
    while done < products.len() {
        let ty = vec_dot_type(products[done].w.ty);
        // Products are few (2-3): move those of this activation type next to each other.
        let mut end = done;
        for i in done..products.len() {
            if vec_dot_type(products[i].w.ty) == ty {
                products.swap(end, i);
                end += 1;
            }
        }
        let w = products[done].w;
        acts.quantize(pool, w.ty, x, n, w.cols, w.cols);
        matmul_fused(pool, &mut products[done..end], acts, groups, None);
        done = end;
    }
}

impl Model {
    /// Runs one batch: writes its K/V into `kv` and returns the logits `[n_out, n_vocab]` of the rows
    /// whose `batch.logits` is set, in batch order.
    pub fn forward<'s>(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        s: &'s mut Scratch,
        batch: &Batch,
        mut tap: Option<&mut dyn Tap>,
    ) -> Result<&'s [f32], ModelError> {
        let c = &self.config;
        let n = batch.tokens.len();
        self.check_batch(kv, s, batch)?;
        let (d, half) = (c.n_embd, c.rope().n_rot / 2);

        for (t, &tok) in batch.tokens.iter().enumerate() {
            let row = self.tok_embd.read_row(0, tok as usize, &mut s.embd_row);
            let x = &mut s.x[t * d..(t + 1) * d];
            dequantize_row(self.tok_embd.ty, row, x).expect("checked at load");
            if c.embd_scale != 1.0 {
                x.iter_mut().for_each(|v| *v *= c.embd_scale);
            }
            for (r, rope) in c.ropes.iter().enumerate() {
                let at = (r * s.max_tokens + t) * half;
                rope.cos_sin(
                    batch.pos[t],
                    &mut s.cos[at..at + half],
                    &mut s.sin[at..at + half],
                );
            }
        }
        if let (Some(tap), true) = (tap.as_deref_mut(), c.embd_scale != 1.0) {
            tap.tensor("inp_scaled", None, &s.x[..n * d], n, d);
        }

        s.out_rows.clear();
        s.out_rows.extend((0..n).filter(|&t| batch.logits[t]));
        let n_out = s.out_rows.len();
        // Past the last layer's attention only the rows whose logits are wanted matter (as
        // llama.cpp's `inp_out_ids`): the last FFN runs on those alone, none in a mid-prompt chunk.
        // Rows are independent, so their values do not change. A tap sees every row.
        let compact = tap.is_none();
        let last = self.layers.len().saturating_sub(1);
        for (l, layer) in self.layers.iter().enumerate() {
            self.attention_block(pool, kv, s, batch, l, layer, &mut tap);
            if l == last && compact {
                for (i, &t) in s.out_rows.iter().enumerate() {
                    s.x.copy_within(t * d..(t + 1) * d, i * d);
                }
                if n_out > 0 {
                    self.ffn_block(pool, s, n_out, l, layer, &mut tap);
                }
            } else {
                self.ffn_block(pool, s, n, l, layer, &mut tap);
            }
        }

        for i in 0..n_out {
            let t = if compact { i } else { s.out_rows[i] };
            rms_norm_into(
                &mut s.xn[i * d..(i + 1) * d],
                &s.x[t * d..(t + 1) * d],
                &self.output_norm,
                c.rms_eps,
            );
        }
        if let Some(tap) = tap.as_deref_mut() {
            tap.tensor("result_norm", None, &s.xn[..n_out * d], n_out, d);
        }
        let head = self.lm_head();
        s.acts.quantize(pool, head.ty, &s.xn, n_out, d, d);
        matmul(pool, head, &s.acts, n_out, &mut s.logits, c.n_vocab);
        if let Some(cap) = c.logit_softcap {
            let nv = c.n_vocab;
            pool.for_rows(&mut s.logits[..n_out * nv], nv, 1, &|rows, _| {
                softcap(rows, cap)
            });
        }
        let logits = &s.logits[..n_out * c.n_vocab];
        if let Some(tap) = tap {
            tap.tensor("result_output", None, logits, n_out, c.n_vocab);
        }
        Ok(logits)
    }

    /// Hints what follows layer `l`: the next layer's Q, K and V.
    fn hint_after_layer(&self, pool: &ThreadPool, n: usize, l: usize) {
        if let Some(next) = self.layers.get(l + 1) {
            hint(
                pool,
                n,
                &[next.wq.bytes(), next.wk.bytes(), next.wv.bytes()],
            );
        }
    }

    fn check_batch(&self, kv: &KvCache, s: &Scratch, b: &Batch) -> Result<(), ModelError> {
        kv.ty()
            .check_heads(self.config.head_dim, self.config.head_dim_v)?;
        let n = b.tokens.len();
        if n == 0 || b.pos.len() != n || b.seq.len() != n || b.logits.len() != n {
            return Err(ModelError::Batch(format!(
                "{n} tokens with {} positions, {} sequence ids and {} logit flags",
                b.pos.len(),
                b.seq.len(),
                b.logits.len()
            )));
        }
        if n > s.max_tokens {
            return Err(ModelError::Batch(format!(
                "{n} tokens exceed the batch capacity {}",
                s.max_tokens
            )));
        }
        for t in 0..n {
            if b.tokens[t] as usize >= self.config.n_vocab {
                return Err(ModelError::Batch(format!(
                    "token id {} is outside the vocabulary of {}",
                    b.tokens[t], self.config.n_vocab
                )));
            }
            kv.check(b.seq[t], b.pos[t])?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        s: &mut Scratch,
        b: &Batch,
        l: usize,
        layer: &Layer,
        tap: &mut Option<&mut dyn Tap>,
    ) {
        let c = &self.config;
        let n = b.tokens.len();
        let d = c.n_embd;
        let (qd, kd, vd, hd) = (c.q_dim(), c.k_dim(), c.v_dim(), c.head_dim);
        norm_rows(
            pool,
            &mut s.xn[..n * d],
            &s.x[..n * d],
            &layer.attn_norm,
            c.rms_eps,
        );
        emit(tap, "attn_norm", l, &s.xn, n, d);

        // The keys and values of the block the (first) row writes and reads, for the K/V store
        // and the attention after this pass (checked to exist by `check_batch`).
        hint(pool, n, &kv.block_bytes_at(b.seq[0], l, b.pos[0]));
        if n > HINT_TOKENS && n <= STORE_PREFETCH_ROWS {
            for t in 0..n {
                kv.prefetch_store(b.seq[t], l, b.pos[t]);
            }
        }
        let all = [Group::all(n)];
        shared_input_products(
            pool,
            &mut s.acts,
            &s.xn,
            n,
            &all,
            &mut [
                Product {
                    w: &layer.wq,
                    out: &mut s.q,
                    out_stride: qd,
                },
                Product {
                    w: &layer.wk,
                    out: &mut s.k,
                    out_stride: kd,
                },
                Product {
                    w: &layer.wv,
                    out: &mut s.v,
                    out_stride: vd,
                },
            ],
        );
        for (buf, bias, width) in [
            (&mut s.q, &layer.bq, qd),
            (&mut s.k, &layer.bk, kd),
            (&mut s.v, &layer.bv, vd),
        ] {
            if let Some(bias) = bias {
                buf[..n * width]
                    .chunks_exact_mut(width)
                    .for_each(|row| add_assign(row, bias));
            }
        }
        emit(tap, "Qcur", l, &s.q, n, qd);
        emit(tap, "Kcur", l, &s.k, n, kd);
        emit(tap, "Vcur", l, &s.v, n, vd);

        // Qwen3: per-head RMSNorm of Q and K before RoPE, as HF Qwen3Attention.
        for (buf, norm, width, name) in [
            (&mut s.q, &layer.q_norm, qd, "Qcur_normed"),
            (&mut s.k, &layer.k_norm, kd, "Kcur_normed"),
        ] {
            if let Some(w) = norm {
                pool.for_rows(
                    &mut buf[..n * width],
                    width,
                    rows_per_task(pool, n, width),
                    &|rows, _| {
                        rows.chunks_exact_mut(hd)
                            .for_each(|h| rms_norm(h, w, c.rms_eps))
                    },
                );
                emit(tap, name, l, buf, n, width);
            }
        }
        let lc = &c.layers[l];
        let rope = &c.ropes[lc.rope];
        let half = rope.n_rot / 2;
        let table = lc.rope * s.max_tokens * half;
        let (cos, sin) = (&s.cos[table..], &s.sin[table..]);
        for (buf, width) in [(&mut s.q, qd), (&mut s.k, kd)] {
            pool.for_rows(
                &mut buf[..n * width],
                width,
                rows_per_task(pool, n, width),
                &|rows, r0| {
                    for (i, row) in rows.chunks_exact_mut(width).enumerate() {
                        let t = r0 + i;
                        let (cos, sin) = (
                            &cos[t * half..(t + 1) * half],
                            &sin[t * half..(t + 1) * half],
                        );
                        row.chunks_exact_mut(hd)
                            .for_each(|h| rope.rotate(h, cos, sin));
                    }
                },
            );
        }
        emit(tap, "Qcur", l, &s.q, n, qd);
        emit(tap, "Kcur", l, &s.k, n, kd);

        // A quantized cache holds K and V rotated, as llama.cpp's (see kv_rotate): Q and K alike,
        // so the scores are unchanged, and V here with the output rotated back below.
        let rot = Rotation::of(kv.ty(), hd, c.head_dim_v);
        for (buf, width, chunk) in [
            (&mut s.q, qd, rot.k),
            (&mut s.k, kd, rot.k),
            (&mut s.v, vd, rot.v),
        ] {
            if let Some(chunk) = chunk {
                rotate_rows(pool, &mut buf[..n * width], width, chunk);
            }
        }

        for t in 0..n {
            kv.store(
                b.seq[t],
                l,
                b.pos[t],
                &s.k[t * kd..(t + 1) * kd],
                &s.v[t * vd..(t + 1) * vd],
            );
        }
        // Each row's key range: the whole context, or the layer's window ending at the row.
        for (lo, &p) in s.lo.iter_mut().zip(b.pos) {
            *lo = lc.window.map_or(0, |w| (p + 1).saturating_sub(w));
        }
        let rows = AttnRows {
            q: &s.q,
            pos: b.pos,
            lo: &s.lo[..n],
            seq: b.seq,
            scale: lc.attn_scale,
            softcap: lc.attn_softcap,
        };
        hint(pool, n, &[layer.wo.bytes()]);
        attend(pool, c, kv, l, &rows, &mut s.attn_scratch, &mut s.attn);
        let od = c.n_head * c.head_dim_v;
        emit(tap, "kqv_out", l, &s.attn, n, od);
        if let Some(chunk) = rot.v {
            rotate_rows(pool, &mut s.attn[..n * od], od, chunk);
        }

        s.acts.quantize(pool, layer.wo.ty, &s.attn, n, od, od);
        match &layer.ffn {
            Ffn::Dense { gate, up, .. } => hint(pool, n, &[gate.bytes(), up.bytes()]),
            Ffn::Moe { gate_inp, .. } => hint(pool, n, &[gate_inp.bytes()]),
        }
        matmul(pool, &layer.wo, &s.acts, n, &mut s.proj, d);
        emit(tap, "attn_out", l, &s.proj, n, d);
        if let Some(w) = &layer.attn_post_norm {
            norm_rows_in_place(pool, &mut s.proj[..n * d], w, c.rms_eps);
            emit(tap, "attn_post_norm", l, &s.proj, n, d);
        }
        add_rows(pool, &mut s.x[..n * d], &s.proj[..n * d], d);
        emit(tap, "ffn_inp", l, &s.x, n, d);
    }

    fn ffn_block(
        &self,
        pool: &ThreadPool,
        s: &mut Scratch,
        n: usize,
        l: usize,
        layer: &Layer,
        tap: &mut Option<&mut dyn Tap>,
    ) {
        let c = &self.config;
        let d = c.n_embd;
        norm_rows(
            pool,
            &mut s.xn[..n * d],
            &s.x[..n * d],
            &layer.ffn_norm,
            c.rms_eps,
        );
        emit(tap, "ffn_norm", l, &s.xn, n, d);
        let act = c.arch.act;
        match &layer.ffn {
            Ffn::Dense { gate, up, down } if fusable(gate, up) => {
                let ff = gate.rows;
                s.acts.quantize(pool, gate.ty, &s.xn, n, d, d);
                let all = [Group::all(n)];
                let (q, acts) = (Some((&mut s.ffn_acts, down.ty)), &s.acts);
                hint(pool, n, &[down.bytes()]);
                matmul_swiglu(pool, act, gate, up, acts, &all, &mut s.ffn_a, ff, q);
                self.hint_after_layer(pool, n, l);
                matmul(pool, down, &s.ffn_acts, n, &mut s.proj, d);
            }
            Ffn::Dense { gate, up, down } => {
                let ff = gate.rows;
                let all = [Group::all(n)];
                shared_input_products(
                    pool,
                    &mut s.acts,
                    &s.xn,
                    n,
                    &all,
                    &mut [
                        Product {
                            w: gate,
                            out: &mut s.ffn_a,
                            out_stride: ff,
                        },
                        Product {
                            w: up,
                            out: &mut s.ffn_b,
                            out_stride: ff,
                        },
                    ],
                );
                glu_rows(pool, act, &mut s.ffn_a[..n * ff], &s.ffn_b[..n * ff], ff);
                s.acts.quantize(pool, down.ty, &s.ffn_a, n, ff, ff);
                self.hint_after_layer(pool, n, l);
                matmul(pool, down, &s.acts, n, &mut s.proj, d);
            }
            Ffn::Moe {
                gate_inp,
                gate_exps,
                up_exps,
                down_exps,
            } => {
                self.moe(
                    pool,
                    s,
                    n,
                    l,
                    [gate_inp, gate_exps, up_exps, down_exps],
                    tap,
                );
            }
        }
        emit(tap, "ffn_out", l, &s.proj, n, d);
        if let Some(w) = &layer.ffn_post_norm {
            norm_rows_in_place(pool, &mut s.proj[..n * d], w, c.rms_eps);
            emit(tap, "ffn_post_norm", l, &s.proj, n, d);
        }
        add_rows(pool, &mut s.x[..n * d], &s.proj[..n * d], d);
        emit(tap, "l_out", l, &s.x, n, d);
    }

    /// The routed FFN: softmax router, top-k, renormalised weights, each chosen expert's SwiGLU run once
    /// over all the batch's tokens routed to it, then the weighted sum in slot order (as llama.cpp's
    /// `build_moe_ffn`). Writes `s.proj`.
    fn moe(
        &self,
        pool: &ThreadPool,
        s: &mut Scratch,
        n: usize,
        l: usize,
        w: [&Weight; 4],
        tap: &mut Option<&mut dyn Tap>,
    ) {
        let [gate_inp, gate_exps, up_exps, down_exps] = w;
        let c = &self.config;
        let m = c.moe.as_ref().expect("MoE layers have a MoE config");
        let (d, ne, k, ff) = (c.n_embd, m.n_expert, m.n_expert_used, m.n_ff_exp);

        s.acts.quantize(pool, gate_inp.ty, &s.xn, n, d, d);
        matmul(pool, gate_inp, &s.acts, n, &mut s.router, ne);
        emit(tap, "ffn_moe_logits", l, &s.router, n, ne);
        for t in 0..n {
            let probs = &mut s.router[t * ne..(t + 1) * ne];
            softmax(probs);
            // Top-k by descending probability; ties go to the lower expert id.
            let sel = &mut s.sel[t * k..(t + 1) * k];
            let mut filled = 0;
            for e in 0..ne as u32 {
                let p = probs[e as usize];
                let mut i = filled.min(k);
                while i > 0 && probs[sel[i - 1] as usize] < p {
                    if i < k {
                        sel[i] = sel[i - 1];
                    }
                    i -= 1;
                }
                if i < k {
                    sel[i] = e;
                    filled = (filled + 1).min(k);
                }
            }
            let wts = &mut s.sel_w[t * k..(t + 1) * k];
            for (wt, &e) in wts.iter_mut().zip(sel.iter()) {
                *wt = probs[e as usize];
            }
            if m.norm_topk {
                let sum = wts.iter().map(|&x| x as f64).sum::<f64>() as f32;
                wts.iter_mut().for_each(|x| *x /= sum);
            }
            if m.weights_scale != 1.0 {
                wts.iter_mut().for_each(|x| *x *= m.weights_scale);
            }
        }
        emit(tap, "ffn_moe_probs", l, &s.router, n, ne);
        emit(tap, "ffn_moe_weights_norm", l, &s.sel_w, n, k);
        if let Some(tap) = tap.as_deref_mut() {
            tap.experts(l, &s.sel[..n * k], &s.sel_w[..n * k], k);
        }

        // Group the (token, slot) pairs by expert so each chosen expert runs once over all its tokens.
        // A counting sort: pairs of one expert keep their batch order.
        s.groups.clear();
        s.expert_at.clear();
        s.expert_at.resize(ne + 1, 0);
        for &e in &s.sel[..n * k] {
            s.expert_at[e as usize + 1] += 1;
        }
        for e in 0..ne {
            let (start, count) = (s.expert_at[e], s.expert_at[e + 1]);
            if count > 0 {
                s.expert_load[e] += count as u64;
                s.groups.push(Group {
                    mat: e,
                    start,
                    n: count,
                });
            }
            s.expert_at[e + 1] = start + count;
        }
        for p in 0..n * k {
            let e = s.sel[p] as usize;
            let at = s.expert_at[e];
            s.pair_tok[at] = (p / k) as u32;
            s.pair_id[at] = p as u32;
            s.expert_at[e] += 1;
        }

        // Each token's input row quantized once, then the quantized rows gathered in grouped
        // order, so each expert's tokens are consecutive rows of one matrix product (copying the
        // f32 rows and quantizing every pair cost k times the work).
        if fusable(gate_exps, up_exps) {
            s.tok_acts.quantize(pool, gate_exps.ty, &s.xn, n, d, d);
            s.acts.gather(pool, &s.tok_acts, &s.pair_tok[..n * k]);
            matmul_swiglu(
                pool,
                c.arch.act,
                gate_exps,
                up_exps,
                &s.acts,
                &s.groups,
                &mut s.ffn_a,
                ff,
                Some((&mut s.ffn_acts, down_exps.ty)),
            );
        } else {
            for (p, &t) in s.pair_tok[..n * k].iter().enumerate() {
                let t = t as usize;
                s.moe_out[p * d..(p + 1) * d].copy_from_slice(&s.xn[t * d..(t + 1) * d]);
            }
            let mut products = [
                Product {
                    w: gate_exps,
                    out: &mut s.ffn_a,
                    out_stride: ff,
                },
                Product {
                    w: up_exps,
                    out: &mut s.ffn_b,
                    out_stride: ff,
                },
            ];
            shared_input_products(
                pool,
                &mut s.acts,
                &s.moe_out,
                n * k,
                &s.groups,
                &mut products,
            );
            glu_rows(
                pool,
                c.arch.act,
                &mut s.ffn_a[..n * k * ff],
                &s.ffn_b[..n * k * ff],
                ff,
            );
            s.ffn_acts
                .quantize(pool, down_exps.ty, &s.ffn_a, n * k, ff, ff);
        }
        self.hint_after_layer(pool, n, l);
        matmul_gather(
            pool,
            down_exps,
            &s.ffn_acts,
            &s.groups,
            Some(&s.pair_id),
            &mut s.moe_out,
            d,
        );

        let (moe_out, sel_w) = (&s.moe_out, &s.sel_w);
        pool.for_rows(
            &mut s.proj[..n * d],
            d,
            rows_per_task(pool, n, d),
            &|rows, r0| {
                for (i, out) in rows.chunks_exact_mut(d).enumerate() {
                    let t = r0 + i;
                    for slot in 0..k {
                        let wt = sel_w[t * k + slot];
                        let e_out = &moe_out[(t * k + slot) * d..(t * k + slot + 1) * d];
                        if slot == 0 {
                            out.iter_mut().zip(e_out).for_each(|(o, v)| *o = v * wt);
                        } else {
                            out.iter_mut().zip(e_out).for_each(|(o, v)| *o += v * wt);
                        }
                    }
                }
            },
        );
    }
}

fn emit(
    tap: &mut Option<&mut dyn Tap>,
    name: &str,
    layer: usize,
    data: &[f32],
    rows: usize,
    cols: usize,
) {
    if let Some(tap) = tap.as_deref_mut() {
        tap.tensor(name, Some(layer), &data[..rows * cols], rows, cols);
    }
}

/// Whether an FFN's gate and up run as one pass with the gated unit ([`matmul_swiglu`]): the same
/// shape and one activation type for both (their weight types may differ, e.g. Q4_K and Q6_K).
fn fusable(gate: &Weight, up: &Weight) -> bool {
    vec_dot_type(gate.ty) == vec_dot_type(up.ty) && gate.rows == up.rows && gate.cols == up.cols
}

/// Rows per batch up to which a pass hints the weights of the next one to the pool
/// ([`ThreadPool::prefetch_after`]): decode, whose passes stream their weights from memory.
const HINT_TOKENS: usize = 1;

/// Rows per batch up to which the lines their K/V stores write are prefetched before the Q/K/V
/// pass ([`KvCache::prefetch_store`]): a server step of several sequences.
const STORE_PREFETCH_ROWS: usize = 16;

/// Bytes of a hint per thread: a share of the next weights that the L2 cache holds beside what
/// the pass in between reads.
const HINT_BYTES: usize = 128 << 10;

/// Hints `ranges` (single matrices' bytes, a K/V block) to the pool's next run when the batch has
/// at most [`HINT_TOKENS`] rows.
fn hint(pool: &ThreadPool, n: usize, ranges: &[&[u8]]) {
    if n <= HINT_TOKENS {
        pool.prefetch_after(ranges, HINT_BYTES);
    }
}

/// [`fwht`] of every `chunk` elements of `rows` (`[n, width]`), rows spread over the threads.
fn rotate_rows(pool: &ThreadPool, rows: &mut [f32], width: usize, chunk: usize) {
    let n = rows.len() / width;
    pool.for_rows(rows, width, rows_per_task(pool, n, width), &|rows, _| {
        fwht(rows, chunk)
    });
}

/// Elements of a row-wise pass up to which it is one task, run in place on the calling thread
/// (as the quantization of activations, `matmul::INLINE_ELEMENTS`).
///
/// A pass costs a hand-off and a wait for the slowest thread, a few microseconds on two cores,
/// more than the norm, RoPE or residual add of a few rows. A server step of 8 sequences ran 14
/// passes a layer, 9 of them over 8 rows (norms, RoPE, residual adds, quantizations); done in
/// place (5 passes a layer), `hearth bench SmolLM2 -p 0 -n 64 --parallel 8 -d 16`, AVX-512, two
/// sets of 8 alternating pairs on a noisy host: medians 531 -> 562 and 522 -> 531 t/s.
const INLINE_ELEMENTS: usize = 16 << 10;

/// Rows per task for a row-wise pass over `n` rows of `width` elements: about four tasks per
/// thread, or one (run in place) for a pass of at most [`INLINE_ELEMENTS`].
fn rows_per_task(pool: &ThreadPool, n: usize, width: usize) -> usize {
    if n.saturating_mul(width) <= INLINE_ELEMENTS {
        return n.max(1);
    }
    n.div_ceil(4 * pool.n_threads()).max(1)
}

/// [`rms_norm_rows`], rows split over the pool's threads.
fn norm_rows(pool: &ThreadPool, dst: &mut [f32], src: &[f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    pool.for_rows(
        dst,
        d,
        rows_per_task(pool, dst.len() / d, d),
        &|rows, r0| rms_norm_rows(rows, &src[r0 * d..r0 * d + rows.len()], weight, eps),
    );
}

/// RMSNorm of every row of `x` in place (rows of `weight.len()`), rows split over the pool's threads.
fn norm_rows_in_place(pool: &ThreadPool, x: &mut [f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    pool.for_rows(x, d, rows_per_task(pool, x.len() / d, d), &|rows, _| {
        rows.chunks_exact_mut(d)
            .for_each(|row| rms_norm(row, weight, eps))
    });
}

/// `x[t] += y[t]` for every row `t` of width `d`, rows split over the pool's threads.
fn add_rows(pool: &ThreadPool, x: &mut [f32], y: &[f32], d: usize) {
    pool.for_rows(x, d, rows_per_task(pool, y.len() / d, d), &|rows, r0| {
        add_assign(rows, &y[r0 * d..r0 * d + rows.len()])
    });
}

/// [`glu`] of `[rows, ff]` matrices, rows split over the pool's threads.
fn glu_rows(pool: &ThreadPool, act: Activation, gate: &mut [f32], up: &[f32], ff: usize) {
    pool.for_rows(gate, ff, 8, &|rows, r0| {
        glu(act, rows, &up[r0 * ff..r0 * ff + rows.len()]);
    });
}
