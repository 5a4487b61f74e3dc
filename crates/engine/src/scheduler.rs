//! Continuous batching: one engine thread advances every active sequence together, one batched forward
//! pass per step.
//!
//! Each step holds one token of every decoding sequence and, in the budget left, a chunk of one or more
//! prompts being prefilled, so new requests start without stalling running streams. Every sequence
//! owns a slot of the KV cache; a finished slot keeps its tokens as a prefix cache, and a new request
//! takes the slot whose cached tokens share the longest prefix with its prompt (copying a longer
//! prefix from another slot when one exists), so a multi-turn chat only prefills what is new.
//! Because the model is batch-invariant, a request's tokens do not depend on what else runs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hearth_constrain::Constraint;
use hearth_model::{Batch, KvCache, KvType, Model, Scratch, Tap, ThreadPool};
use hearth_tokenizer::Tokenizer;

use crate::generate::FinishReason;
use crate::sampler::{logprob, top_logprobs, Sampler};
use crate::service::{Backend, Event, ModelInfo, Request, Sink, Stats, SubmitError, TokenLogprob};
use crate::stop::{StopMatcher, StopResult};
use crate::utf8::Utf8Buffer;

/// How the scheduler runs.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Sequences decoded together (KV cache slots).
    pub parallel: usize,
    /// Context per sequence, in tokens.
    pub n_ctx: usize,
    /// Requests that may wait for a slot before new ones are refused.
    pub queue: usize,
    /// KV cache element type.
    pub kv_type: KvType,
    /// Threads of the forward pass.
    pub threads: usize,
    /// Tokens per forward pass (decode rows plus prefill chunks).
    pub n_batch: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            parallel: 4,
            n_ctx: 4096,
            queue: 64,
            kv_type: KvType::F16,
            threads: 2,
            n_batch: 512,
        }
    }
}

/// Prompt tokens per step while other sequences are decoding.
const PREFILL_CHUNK_WHILE_DECODING: usize = 128;

struct Pending {
    req: Request,
    sink: Sink,
}

struct Shared {
    info: ModelInfo,
    tokenizer: Arc<Tokenizer>,
    cfg: SchedulerConfig,
    queue: Mutex<VecDeque<Pending>>,
    wake: Condvar,
    stats: Mutex<Stats>,
    shutdown: AtomicBool,
    in_flight: AtomicUsize,
}

/// The continuous-batching [`Backend`] over a real model.
pub struct Scheduler {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Scheduler {
    /// Starts the engine thread.
    pub fn start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        info: ModelInfo,
        cfg: SchedulerConfig,
    ) -> Arc<Scheduler> {
        let c = &model.config;
        let kv_capacity = cfg.parallel * cfg.n_ctx;
        let n_expert = c.moe.as_ref().map_or(0, |m| m.n_expert);
        let shared = Arc::new(Shared {
            info,
            tokenizer,
            cfg,
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            stats: Mutex::new(Stats {
                kv_capacity,
                expert_load: vec![0; n_expert],
                ..Stats::default()
            }),
            shutdown: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("hearth-engine".into())
            .spawn(move || Engine::new(&model, &sh).run())
            .expect("spawning the engine thread");
        Arc::new(Scheduler {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Waits for the engine thread to end (after [`Backend::shutdown`] and the last request).
    pub fn join(&self) {
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Backend for Scheduler {
    fn info(&self) -> &ModelInfo {
        &self.shared.info
    }

    fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.shared.tokenizer
    }

    fn submit(&self, req: Request, sink: Sink) -> Result<(), SubmitError> {
        let sh = &self.shared;
        if sh.shutdown.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        if req.prompt.is_empty() {
            return Err(SubmitError::Invalid("the prompt is empty".into()));
        }
        if req.prompt.len() >= sh.cfg.n_ctx {
            return Err(SubmitError::PromptTooLong {
                prompt: req.prompt.len(),
                n_ctx: sh.cfg.n_ctx,
            });
        }
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= sh.info.n_vocab) {
            return Err(SubmitError::Invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                sh.info.n_vocab
            )));
        }
        let mut q = sh.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= sh.cfg.queue {
            return Err(SubmitError::QueueFull { queued: q.len() });
        }
        q.push_back(Pending { req, sink });
        sh.in_flight.fetch_add(1, Ordering::AcqRel);
        sh.wake.notify_one();
        Ok(())
    }

    fn stats(&self) -> Stats {
        let mut s = self
            .shared
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.queued = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        // From the in-flight count, which drops before a request's last event is sent, so a client
        // that has seen `Done` never sees its sequence still counted as active.
        s.active = self.in_flight().saturating_sub(s.queued);
        s
    }

    fn shutdown(&self) {
        self.shared.shutdown.store(true, Ordering::Release);
        let _q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.wake.notify_all();
    }

    fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }
}

/// A request being served in a slot.
struct Active {
    req: Request,
    sink: Sink,
    n_cached: usize,
    /// Next prompt index to prefill; `== prompt.len()` once decoding.
    next_prompt: usize,
    /// The sampled token not yet fed to the model.
    last: Option<u32>,
    sampler: Sampler,
    text: Utf8Buffer,
    stop: StopMatcher,
    n_gen: usize,
    /// Where the output stands in the request's grammar, when it has one.
    constraint: Option<Constraint>,
}

struct Slot {
    /// Tokens whose K/V are in this slot's cache, in order.
    tokens: Vec<u32>,
    active: Option<Active>,
    /// Step at which the slot was last used (least recently used slots are reused first).
    used: u64,
}

/// Counts expert choices for `/metrics`.
struct ExpertCounter<'a>(&'a mut [u64]);

impl Tap for ExpertCounter<'_> {
    fn tensor(&mut self, _: &str, _: Option<usize>, _: &[f32], _: usize, _: usize) {}
    fn experts(&mut self, _layer: usize, selected: &[u32], _weights: &[f32], _k: usize) {
        for &e in selected {
            if let Some(c) = self.0.get_mut(e as usize) {
                *c += 1;
            }
        }
    }
}

struct Engine<'a> {
    model: &'a Model,
    sh: &'a Shared,
    pool: ThreadPool,
    kv: KvCache,
    scratch: Scratch,
    slots: Vec<Slot>,
    step: u64,
    // Per-step batch, reused.
    tokens: Vec<u32>,
    pos: Vec<usize>,
    seq: Vec<usize>,
    want: Vec<bool>,
    row_logits: Vec<f32>,
    expert_load: Vec<u64>,
}

/// What a batch row with logits belongs to.
#[derive(Clone, Copy)]
struct OutRow {
    slot: usize,
}

impl<'a> Engine<'a> {
    fn new(model: &'a Model, sh: &'a Shared) -> Engine<'a> {
        let c = &model.config;
        let cfg = &sh.cfg;
        let n_batch = cfg.n_batch.max(cfg.parallel);
        Engine {
            model,
            sh,
            pool: ThreadPool::new(cfg.threads),
            kv: KvCache::new(
                cfg.parallel,
                c.n_layer,
                cfg.n_ctx,
                c.k_dim(),
                c.v_dim(),
                cfg.kv_type,
            ),
            scratch: Scratch::new(model, n_batch),
            slots: (0..cfg.parallel)
                .map(|_| Slot {
                    tokens: Vec::new(),
                    active: None,
                    used: 0,
                })
                .collect(),
            step: 0,
            tokens: Vec::with_capacity(n_batch),
            pos: Vec::with_capacity(n_batch),
            seq: Vec::with_capacity(n_batch),
            want: Vec::with_capacity(n_batch),
            row_logits: vec![0.0; c.n_vocab],
            expert_load: vec![0; c.moe.as_ref().map_or(0, |m| m.n_expert)],
        }
    }

    fn run(mut self) {
        loop {
            self.admit();
            if self.slots.iter().all(|s| s.active.is_none()) {
                let q = self.sh.queue.lock().unwrap_or_else(|e| e.into_inner());
                if q.is_empty() {
                    if self.sh.shutdown.load(Ordering::Acquire) {
                        return;
                    }
                    let _ = self.sh.wake.wait_timeout(q, Duration::from_millis(200));
                }
                continue;
            }
            self.step();
        }
    }

    /// Moves waiting requests into free slots, reusing cached prefixes.
    fn admit(&mut self) {
        loop {
            let Some(free) = self.pick_free_slot() else {
                return;
            };
            let Some(p) = self
                .sh
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
            else {
                return;
            };
            let prompt = &p.req.prompt;
            // The idle slot sharing the longest prefix (LRU among equals); then maybe a longer prefix elsewhere.
            let lcp = |t: &[u32]| {
                t.iter()
                    .zip(prompt.iter())
                    .take_while(|(a, b)| a == b)
                    .count()
            };
            let dst = (0..self.slots.len())
                .filter(|&i| self.slots[i].active.is_none())
                .max_by_key(|&i| {
                    (
                        lcp(&self.slots[i].tokens),
                        std::cmp::Reverse(self.slots[i].used),
                    )
                })
                .unwrap_or(free);
            let own = lcp(&self.slots[dst].tokens);
            let (src, best) = (0..self.slots.len())
                .map(|i| (i, lcp(&self.slots[i].tokens)))
                .max_by_key(|&(_, l)| l)
                .unwrap_or((dst, 0));
            // Keep at least the last prompt token to compute: its logits start the generation.
            let limit = prompt.len() - 1;
            let mut common = own.min(limit);
            if src != dst && best.min(limit) > common + 16 {
                common = best.min(limit);
                self.kv.copy_prefix(src, dst, common);
                let prefix = self.slots[src].tokens[..common].to_vec();
                self.slots[dst].tokens = prefix;
            }
            self.sh
                .stats
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .cached_tokens += common as u64;
            let slot = &mut self.slots[dst];
            slot.tokens.truncate(common);
            slot.used = self.step;
            let sampler = Sampler::new(p.req.sampler.clone());
            let stop = StopMatcher::new(&p.req.stop);
            let constraint = p.req.constraint.as_ref().map(|g| g.start());
            slot.active = Some(Active {
                constraint,
                n_cached: common,
                next_prompt: common,
                last: None,
                sampler,
                text: Utf8Buffer::default(),
                stop,
                n_gen: 0,
                req: p.req,
                sink: p.sink,
            });
        }
    }

    fn pick_free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| s.active.is_none())
    }

    /// One batched forward pass over every active sequence.
    fn step(&mut self) {
        self.step += 1;
        let n_batch = self.scratch.max_tokens();
        self.tokens.clear();
        self.pos.clear();
        self.seq.clear();
        self.want.clear();
        let mut rows: Vec<OutRow> = Vec::new();
        // Decoding sequences first: one token each.
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(a) = &slot.active {
                if let Some(t) = a.last {
                    self.tokens.push(t);
                    self.pos.push(slot.tokens.len());
                    self.seq.push(i);
                    self.want.push(true);
                    rows.push(OutRow { slot: i });
                }
            }
        }
        let n_decode = self.tokens.len();
        // While streams are decoding, prefill in small chunks so each step stays short.
        let n_batch = if n_decode > 0 {
            n_batch.min(n_decode + PREFILL_CHUNK_WHILE_DECODING)
        } else {
            n_batch
        };
        // Prefill chunks in the budget left, oldest slot first.
        let mut order: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                self.slots[i]
                    .active
                    .as_ref()
                    .is_some_and(|a| a.last.is_none())
            })
            .collect();
        order.sort_by_key(|&i| self.slots[i].used);
        let mut chunks: Vec<(usize, usize)> = Vec::new(); // (slot, tokens)
        for i in order {
            let budget = n_batch - self.tokens.len();
            if budget == 0 {
                break;
            }
            let slot = &self.slots[i];
            let a = slot.active.as_ref().expect("filtered active");
            let n = (a.req.prompt.len() - a.next_prompt).min(budget);
            for j in 0..n {
                let p = a.next_prompt + j;
                self.tokens.push(a.req.prompt[p]);
                self.pos.push(p);
                self.seq.push(i);
                let last = p + 1 == a.req.prompt.len();
                self.want.push(last);
                if last {
                    rows.push(OutRow { slot: i });
                }
            }
            chunks.push((i, n));
        }
        if self.tokens.is_empty() {
            return;
        }
        let t0 = Instant::now();
        let batch = Batch {
            tokens: &self.tokens,
            pos: &self.pos,
            seq: &self.seq,
            logits: &self.want,
        };
        let mut counter = ExpertCounter(&mut self.expert_load);
        let tap: Option<&mut dyn Tap> = if counter.0.is_empty() {
            None
        } else {
            Some(&mut counter)
        };
        let result = self
            .model
            .forward(&self.pool, &mut self.kv, &mut self.scratch, &batch, tap);
        let logits = match result {
            Ok(l) => l.to_vec(),
            Err(e) => {
                let msg = e.to_string();
                for i in self.seq.clone() {
                    if let Some(mut a) = self.slots[i].active.take() {
                        self.sh.in_flight.fetch_sub(1, Ordering::AcqRel);
                        (a.sink)(Event::Error(msg.clone()));
                    }
                }
                return;
            }
        };
        let dt = t0.elapsed().as_secs_f64();
        // The batch's tokens are now in the cache.
        for (t, &i) in self.tokens.iter().zip(&self.seq) {
            self.slots[i].tokens.push(*t);
        }
        for &(i, n) in &chunks {
            if let Some(a) = self.slots[i].active.as_mut() {
                a.next_prompt += n;
            }
        }
        for i in 0..n_decode {
            if let Some(a) = self.slots[self.seq[i]].active.as_mut() {
                a.last = None;
            }
        }
        // Counters first: a client that has seen its last event finds them up to date.
        let n_prefill = self.tokens.len() - n_decode;
        {
            let mut st = self.sh.stats.lock().unwrap_or_else(|e| e.into_inner());
            st.prompt_tokens += n_prefill as u64;
            let total = self.tokens.len() as f64;
            st.prefill_seconds += dt * n_prefill as f64 / total;
            st.decode_seconds += dt * n_decode as f64 / total;
            st.kv_used = self.slots.iter().map(|s| s.tokens.len()).sum();
            st.expert_load.clone_from(&self.expert_load);
        }
        self.compute_masks(&rows);
        let n_vocab = self.model.config.n_vocab;
        for (r, row) in rows.iter().enumerate() {
            self.row_logits
                .copy_from_slice(&logits[r * n_vocab..(r + 1) * n_vocab]);
            self.sample(row.slot);
        }
    }

    /// Computes the allowed-token masks of the constrained sequences about to sample, spread over
    /// the forward pass's threads (idle between passes): each sequence's grammar state is its own,
    /// so they run side by side and the serial sampling loop only applies ready masks.
    fn compute_masks(&mut self, rows: &[OutRow]) {
        let mut pending: Vec<std::sync::Mutex<&mut Constraint>> = Vec::new();
        let mut seen = vec![false; self.slots.len()];
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let sampling = rows.iter().any(|r| r.slot == i);
            if let Some(a) = slot.active.as_mut() {
                if sampling && !seen[i] && a.next_prompt >= a.req.prompt.len() {
                    if let Some(c) = a.constraint.as_mut() {
                        seen[i] = true;
                        pending.push(std::sync::Mutex::new(c));
                    }
                }
            }
        }
        match pending.len() {
            0 => {}
            1 => {
                // Errors surface again when the mask is applied, and end that request there.
                let _ = pending[0].get_mut().map(|c| c.compute_mask());
            }
            n => self.pool.run(n, &|k| {
                if let Ok(mut c) = pending[k].lock() {
                    let _ = c.compute_mask();
                }
            }),
        }
    }

    /// Samples the next token of a slot from `row_logits`, emits it and decides whether to go on.
    fn sample(&mut self, i: usize) {
        let n_ctx = self.sh.cfg.n_ctx;
        let tok = &*self.sh.tokenizer;
        let slot = &mut self.slots[i];
        let Some(a) = slot.active.as_mut() else {
            return;
        };
        if a.next_prompt < a.req.prompt.len() {
            return; // mid-prompt: no sampling yet
        }
        let lp = a.req.logprobs.map(|k| (self.row_logits.clone(), k));
        // The grammar's mask comes before every other sampling step, so bias, penalties and
        // truncation only ever choose among tokens that keep the output valid.
        let mut failed = a
            .constraint
            .as_mut()
            .and_then(|c| c.apply(&mut self.row_logits).err());
        let next = a.sampler.sample(&mut self.row_logits, &slot.tokens);
        if failed.is_none() && !tok.is_eog(next) {
            failed = a.constraint.as_mut().and_then(|c| c.commit(next).err());
        }
        if let Some(e) = failed {
            let mut a = slot.active.take().expect("active");
            slot.used = self.step;
            self.sh.in_flight.fetch_sub(1, Ordering::AcqRel);
            (a.sink)(Event::Error(e.to_string()));
            return;
        }
        let mut finish = None;
        let mut text = String::new();
        if tok.is_eog(next) {
            finish = Some(FinishReason::Stop);
        } else {
            a.n_gen += 1;
            self.sh
                .stats
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .generated_tokens += 1;
            let piece = a.text.push(tok.token_to_piece(next, false));
            match a.stop.push(&piece) {
                StopResult::Stop(s) => {
                    text = s;
                    finish = Some(FinishReason::Stop);
                }
                StopResult::Continue(s) => text = s,
            }
            let logprob = lp.map(|(raw, k)| TokenLogprob {
                logprob: logprob(&raw, next),
                top: top_logprobs(&raw, k)
                    .into_iter()
                    .map(|(id, l)| {
                        (
                            id,
                            String::from_utf8_lossy(tok.token_to_piece(id, false)).into_owned(),
                            l,
                        )
                    })
                    .collect(),
            });
            let alive = (a.sink)(Event::Token {
                id: next,
                text: std::mem::take(&mut text),
                logprob,
            });
            if !alive {
                finish = Some(FinishReason::Cancelled);
            } else if finish.is_none() {
                if a.constraint.as_ref().is_some_and(Constraint::is_finished) {
                    // The output is complete and nothing may follow: end as the grammar says,
                    // without a step spent sampling the end-of-generation token.
                    finish = Some(FinishReason::Stop);
                } else if a.req.max_tokens.is_some_and(|m| a.n_gen >= m)
                    || slot.tokens.len() + 1 >= n_ctx
                {
                    finish = Some(FinishReason::Length);
                } else {
                    a.last = Some(next);
                }
            }
        }
        if let Some(f) = finish {
            let mut a = slot.active.take().expect("active");
            slot.used = self.step;
            // Counted out before the last event, so a client that sees `Done` sees the slot free.
            self.sh.in_flight.fetch_sub(1, Ordering::AcqRel);
            if f != FinishReason::Cancelled {
                let mut tail = a.text.finish();
                let rest = match a.stop.push(&std::mem::take(&mut tail)) {
                    StopResult::Stop(s) => s,
                    StopResult::Continue(s) => s + &a.stop.finish(),
                };
                let done = Event::Done {
                    finish: f,
                    text: text + &rest,
                    n_prompt: a.req.prompt.len(),
                    n_cached: a.n_cached,
                    n_gen: a.n_gen,
                };
                (a.sink)(done);
            }
        }
    }
}
