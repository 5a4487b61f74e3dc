//! Token sampling: logit bias, repetition / presence / frequency penalties, greedy or temperature
//! sampling truncated by top-k, top-p and min-p, with a seeded generator (same seed and settings,
//! same tokens).

use std::collections::HashMap;

/// Sampling settings. The defaults are llama.cpp's (`temp 0.8, top_k 40, top_p 0.95, min_p 0.05`).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1 = all).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top one's (0 = off).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this (1 = off), as llama.cpp.
    pub repeat_penalty: f32,
    /// Subtract from the logits of tokens already seen (OpenAI `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtract `count ×` this from the logits of tokens already seen (OpenAI `frequency_penalty`).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at (0 = none, usize::MAX = all).
    pub penalty_last_n: usize,
    /// Added to the logits of the given tokens (`-inf` bans a token).
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: Vec::new(),
            seed: 0x5EED,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding (temperature 0).
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

/// A small, fast, seedable generator (SplitMix64): stable across platforms and crate versions.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Samples tokens from logits under a [`SamplerConfig`]; holds the random state and scratch.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    cand: Vec<(u32, f32)>, // [n_vocab] candidates, reused between steps
    probs: Vec<f64>,       // [candidates] unnormalised probabilities, reused
    counts: HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler with its generator seeded from the config.
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = Rng::new(cfg.seed);
        Sampler {
            cfg,
            rng,
            cand: Vec::new(),
            probs: Vec::new(),
            counts: HashMap::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Applies bias and penalties to `logits` in place, given the tokens so far (`history`).
    pub fn adjust(&mut self, logits: &mut [f32], history: &[u32]) {
        for &(id, b) in &self.cfg.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        let c = &self.cfg;
        let penalize =
            c.repeat_penalty != 1.0 || c.presence_penalty != 0.0 || c.frequency_penalty != 0.0;
        if !penalize || c.penalty_last_n == 0 {
            return;
        }
        self.counts.clear();
        let start = history.len().saturating_sub(c.penalty_last_n);
        for &t in &history[start..] {
            *self.counts.entry(t).or_insert(0) += 1;
        }
        for (&t, &n) in &self.counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            // As llama.cpp's penalties sampler: repetition divides/multiplies, then the OpenAI terms.
            if *l <= 0.0 {
                *l *= c.repeat_penalty;
            } else {
                *l /= c.repeat_penalty;
            }
            *l -= n as f32 * c.frequency_penalty + c.presence_penalty;
        }
    }

    /// Picks the next token from (already adjusted) logits.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        let c = &self.cfg;
        if c.temperature <= 0.0 || !c.temperature.is_finite() {
            return argmax(logits);
        }
        self.cand.clear();
        self.cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l)),
        );
        if self.cand.is_empty() {
            return argmax(logits);
        }
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if c.top_k > 0 && c.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(c.top_k - 1, by_logit);
            self.cand.truncate(c.top_k);
        }
        self.cand.sort_unstable_by(by_logit);
        // Probabilities at temperature 1 decide top-p and min-p, as llama.cpp's chain does before `temp`.
        let max = self.cand[0].1;
        let probs = &mut self.probs;
        probs.clear();
        probs.extend(self.cand.iter().map(|&(_, l)| ((l - max) as f64).exp()));
        let total: f64 = probs.iter().sum();
        let mut keep = self.cand.len();
        if c.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, p) in probs.iter().enumerate() {
                acc += p / total;
                if acc >= c.top_p as f64 {
                    keep = keep.min(i + 1);
                    break;
                }
            }
        }
        if c.min_p > 0.0 {
            let floor = c.min_p as f64; // relative to the top token, whose unnormalised prob is 1
            keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
        }
        self.cand.truncate(keep);
        let t = c.temperature as f64;
        // The temperature weights replace the probabilities in the same buffer.
        probs.clear();
        probs.extend(
            self.cand
                .iter()
                .map(|&(_, l)| (((l - max) as f64) / t).exp()),
        );
        let sum: f64 = probs.iter().sum();
        let mut r = self.rng.next_f64() * sum;
        for (i, w) in probs.iter().enumerate() {
            if r < *w {
                return self.cand[i].0;
            }
            r -= w;
        }
        self.cand[self.cand.len() - 1].0
    }

    /// Adjusts and picks in one step.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.adjust(logits, history);
        self.pick(logits)
    }
}

/// Index of the largest logit (the first one on ties; NaNs never win, and 0 when nothing else
/// does).
///
/// The largest value first, in 16 lanes the compiler vectorizes (a maximum is exact in any order),
/// then its first index, 16 at a time: a branch per element and a reload of the best made the
/// one-pass loop ~30 µs over a 49152-token vocabulary, which the engine thread spends alone once
/// per sequence and step.
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    let mut m = [f32::NEG_INFINITY; LANES];
    for c in chunks {
        for (m, &x) in m.iter_mut().zip(c) {
            *m = m.max(x);
        }
    }
    let max = m
        .into_iter()
        .chain(tail.iter().copied())
        .fold(f32::NEG_INFINITY, f32::max);
    let mut at = 0;
    for c in logits.chunks(LANES) {
        if c.contains(&max) {
            return (at + c.iter().position(|&x| x == max).unwrap_or(0)) as u32;
        }
        at += c.len();
    }
    0
}

/// `(id, log-probability)` of the `k` most likely tokens under a softmax of `logits`.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max as f64
        + logits
            .iter()
            .map(|&l| ((l - max) as f64).exp())
            .sum::<f64>()
            .ln();
    crate::logits::top_k(logits, k)
        .into_iter()
        .map(|(i, l)| (i, (l as f64 - lse) as f32))
        .collect()
}

/// Log-probability of token `id` under a softmax of `logits`.
pub fn logprob(logits: &[f32], id: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max as f64
        + logits
            .iter()
            .map(|&l| ((l - max) as f64).exp())
            .sum::<f64>()
            .ln();
    (logits
        .get(id as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY) as f64
        - lse) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_is_the_first_largest_non_nan() {
        fn naive(l: &[f32]) -> u32 {
            let mut best: Option<usize> = None;
            for (i, &x) in l.iter().enumerate() {
                if !x.is_nan() && best.is_none_or(|b| x > l[b]) {
                    best = Some(i);
                }
            }
            best.unwrap_or(0) as u32
        }
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for n in [0, 1, 5, 16, 17, 33, 49152] {
            for case in 0..6 {
                let l: Vec<f32> = (0..n)
                    .map(|_| match (case, next() % 8) {
                        // Few distinct values: many ties.
                        (0, r) => r as f32,
                        (1, 0) => f32::NAN,
                        (2, _) => f32::NEG_INFINITY,
                        (3, 0) => f32::INFINITY,
                        (4, _) => f32::NAN,
                        _ => next() as f32 / 1e6 - 2000.0,
                    })
                    .collect();
                assert_eq!(argmax(&l), naive(&l), "n {n} case {case}");
            }
        }
        assert_eq!(argmax(&[f32::NAN, 1.0, 3.0, 3.0]), 2);
    }

    #[test]
    fn greedy_takes_argmax() {
        let mut s = Sampler::new(SamplerConfig::greedy());
        assert_eq!(s.sample(&mut [0.1, 2.0, 1.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..Default::default()
            });
            (0..50).map(|_| s.pick(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(SamplerConfig {
            top_k: 1,
            temperature: 5.0,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.pick(&[0.0, 0.5, 3.0, 2.9]), 2);
        }
    }

    #[test]
    fn min_p_and_top_p_truncate() {
        let logits = [10.0, 9.9, 0.0, -5.0];
        let mut s = Sampler::new(SamplerConfig {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            temperature: 1.0,
            ..Default::default()
        });
        for _ in 0..50 {
            assert!(s.pick(&logits) < 2);
        }
        let mut s = Sampler::new(SamplerConfig {
            top_k: 0,
            top_p: 0.1,
            min_p: 0.0,
            temperature: 1.0,
            ..Default::default()
        });
        for _ in 0..50 {
            assert_eq!(s.pick(&logits), 0);
        }
    }

    #[test]
    fn penalties_and_bias() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            presence_penalty: 1.0,
            frequency_penalty: 0.5,
            ..SamplerConfig::greedy()
        });
        let mut l = [4.0, -2.0, 1.0];
        s.adjust(&mut l, &[0, 0, 1]);
        assert_eq!(l, [4.0 / 2.0 - 1.0 - 1.0, -4.0 - 1.0 - 0.5, 1.0]);
        let mut s = Sampler::new(SamplerConfig {
            logit_bias: vec![(2, f32::NEG_INFINITY)],
            ..SamplerConfig::greedy()
        });
        assert_eq!(s.sample(&mut [0.0, 1.0, 5.0], &[]), 1);
    }
}
