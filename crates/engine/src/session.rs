//! One sequence with its own KV cache: prefill (reusing the cached prefix) and decode.

use hearth_model::{Batch, KvCache, KvType, Model, ModelError, Scratch, ThreadPool};

/// A single sequence on a model: the tokens in its cache and the buffers to extend it.
pub struct Session<'m> {
    model: &'m Model,
    pool: &'m ThreadPool,
    kv: KvCache,
    scratch: Scratch,
    tokens: Vec<u32>, // [n_past] tokens whose K/V are in the cache
    logits: Vec<f32>, // [n_vocab] after the last token
    pos: Vec<usize>,  // [n_batch] scratch for batch positions
    seq: Vec<usize>,  // [n_batch] all zeros: the one sequence slot
    want: Vec<bool>,  // [n_batch] logits only after the last token of a chunk
}

impl<'m> Session<'m> {
    /// A session of up to `n_ctx` tokens, prefilling `n_batch` tokens per forward pass.
    pub fn new(
        model: &'m Model,
        pool: &'m ThreadPool,
        n_ctx: usize,
        n_batch: usize,
        kv_type: KvType,
    ) -> Session<'m> {
        let c = &model.config;
        Session {
            model,
            pool,
            kv: KvCache::new(1, c.n_layer, n_ctx, c.kv_dims(), kv_type),
            scratch: Scratch::new(model, n_batch),
            tokens: Vec::with_capacity(n_ctx),
            logits: vec![0.0; c.n_vocab],
            pos: Vec::with_capacity(n_batch),
            seq: vec![0; n_batch],
            want: Vec::with_capacity(n_batch),
        }
    }

    /// The model.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Context capacity in tokens.
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    /// Tokens in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Logits after the last token.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.tokens.clear();
    }

    /// Makes the cache hold exactly `prompt`, reusing the longest common prefix already cached and
    /// prefilling the rest in batches; returns how many tokens were computed. At least the last token
    /// is always recomputed, so the logits after it are fresh.
    pub fn set_prompt(&mut self, prompt: &[u32]) -> Result<usize, ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Batch("empty prompt".into()));
        }
        if prompt.len() > self.n_ctx() {
            return Err(ModelError::Batch(format!(
                "the prompt has {} tokens, the context {}",
                prompt.len(),
                self.n_ctx()
            )));
        }
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        self.tokens.truncate(common);
        self.extend(&prompt[common..])?;
        Ok(prompt.len() - common)
    }

    /// Appends tokens to the sequence, computing the logits after the last one.
    pub fn extend(&mut self, new: &[u32]) -> Result<&[f32], ModelError> {
        if self.tokens.len() + new.len() > self.n_ctx() {
            return Err(ModelError::Batch(format!(
                "{} more tokens do not fit the context of {}",
                new.len(),
                self.n_ctx()
            )));
        }
        let n_batch = self.scratch.max_tokens();
        for chunk in new.chunks(n_batch) {
            let start = self.tokens.len();
            self.pos.clear();
            self.pos.extend(start..start + chunk.len());
            self.want.clear();
            self.want.resize(chunk.len(), false);
            self.want[chunk.len() - 1] = true;
            let batch = Batch {
                tokens: chunk,
                pos: &self.pos,
                seq: &self.seq[..chunk.len()],
                logits: &self.want,
            };
            let out =
                self.model
                    .forward(self.pool, &mut self.kv, &mut self.scratch, &batch, None)?;
            self.logits.copy_from_slice(out);
            self.tokens.extend_from_slice(chunk);
        }
        Ok(&self.logits)
    }
}
