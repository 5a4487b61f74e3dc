//! The parity report of `hearth logits`: for one prompt, the top logits after every position, the
//! top-10 after the last, and a greedy continuation — the golden format of llama.cpp's fixtures.

use hearth_model::{Batch, KvCache, KvType, Model, ModelError, Scratch, ThreadPool};
use serde::Serialize;

/// One line of `hearth logits` output.
#[derive(Debug, Serialize)]
pub struct LogitsReport {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Top-5 `(id, logit)` after every prompt position (only when asked for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_per_pos: Option<Vec<Vec<(u32, f32)>>>,
    /// Top-10 after the last prompt token.
    pub top: Vec<(u32, f32)>,
    /// Greedy continuation of exactly the requested length (end-of-generation does not stop it).
    pub greedy: Vec<u32>,
    /// Top-5 at each greedy step.
    pub greedy_top: Vec<Vec<(u32, f32)>>,
}

/// The `k` largest logits, by descending value (ties: lower id first).
pub fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &v) in logits.iter().enumerate() {
        if best.len() == k && best.last().is_some_and(|&(_, w)| v <= w) {
            continue;
        }
        let at = best.partition_point(|&(_, w)| w >= v);
        best.insert(at, (i as u32, v));
        best.truncate(k);
    }
    best
}

/// Runs the prompt (prefilled in chunks of the scratch's capacity) and `n_gen` greedy steps.
pub fn logits_report(
    model: &Model,
    pool: &ThreadPool,
    scratch: &mut Scratch,
    kv_type: KvType,
    prompt: &[u32],
    all: bool,
    n_gen: usize,
) -> Result<LogitsReport, ModelError> {
    let c = &model.config;
    if prompt.is_empty() {
        return Err(ModelError::Batch("empty prompt".into()));
    }
    let mut kv = KvCache::new(1, c.n_layer, prompt.len() + n_gen + 1, c.kv_dims(), kv_type);
    let chunk = scratch.max_tokens();
    let mut per_pos = Vec::new();
    let mut last = Vec::new();
    for start in (0..prompt.len()).step_by(chunk) {
        let end = (start + chunk).min(prompt.len());
        let pos: Vec<usize> = (start..end).collect();
        let seq = vec![0; end - start];
        let want: Vec<bool> = (start..end).map(|p| all || p == prompt.len() - 1).collect();
        let batch = Batch {
            tokens: &prompt[start..end],
            pos: &pos,
            seq: &seq,
            logits: &want,
        };
        let logits = model.forward(pool, &mut kv, scratch, &batch, None)?;
        for row in logits.chunks_exact(c.n_vocab) {
            if all {
                per_pos.push(top_k(row, 5));
            }
            last = row.to_vec();
        }
    }
    let top = top_k(&last, 10);
    let mut greedy = Vec::with_capacity(n_gen);
    let mut greedy_top = Vec::with_capacity(n_gen);
    for step in 0..n_gen {
        let t5 = top_k(&last, 5);
        let next = t5[0].0;
        greedy.push(next);
        greedy_top.push(t5);
        if step + 1 == n_gen {
            break;
        }
        let pos = [prompt.len() + step];
        let batch = Batch {
            tokens: &[next],
            pos: &pos,
            seq: &[0],
            logits: &[true],
        };
        last.copy_from_slice(model.forward(pool, &mut kv, scratch, &batch, None)?);
    }
    Ok(LogitsReport {
        prompt: prompt.to_vec(),
        top_per_pos: all.then_some(per_pos),
        top,
        greedy,
        greedy_top,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_and_breaks_ties_by_id() {
        let v = [1.0, 3.0, 2.0, 3.0, -1.0];
        assert_eq!(top_k(&v, 3), vec![(1, 3.0), (3, 3.0), (2, 2.0)]);
        assert_eq!(top_k(&v, 10).len(), 5);
    }
}
