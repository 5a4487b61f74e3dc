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
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hearth_constrain::Constraint;
use hearth_model::{Batch, KvCache, KvType, Model, Scratch, ThreadPool};
use hearth_tokenizer::Tokenizer;

use crate::sequence::{Sequence, Ticket};
use crate::service::{Backend, ModelInfo, Request, Sink, Stats, SubmitError};

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

struct Shared {
    info: ModelInfo,
    tokenizer: Arc<Tokenizer>,
    cfg: SchedulerConfig,
    queue: Mutex<VecDeque<Sequence>>,
    wake: Condvar,
    stats: Mutex<Stats>,
    shutdown: AtomicBool,
    /// Requests queued or running (see [`Ticket`]).
    in_flight: Arc<AtomicUsize>,
    /// Why the engine thread stopped, once it has died; new requests are refused after that.
    dead: Mutex<Option<String>>,
}

impl Shared {
    fn dead(&self) -> Option<String> {
        self.dead.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
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
            in_flight: Arc::new(AtomicUsize::new(0)),
            dead: Mutex::new(None),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("hearth-engine".into())
            .spawn(move || {
                let run =
                    std::panic::catch_unwind(AssertUnwindSafe(|| Engine::new(&model, &sh).run()));
                if let Err(panic) = run {
                    // The engine cannot go on: refuse new requests and fail the waiting ones.
                    let why = format!("the engine stopped: {}", panic_message(&*panic));
                    tracing::error!("{why}");
                    *sh.dead.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
                    let waiting: Vec<Sequence> = sh
                        .queue
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .drain(..)
                        .collect();
                    for mut seq in waiting {
                        seq.fail(why.clone());
                    }
                }
            })
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

/// The text of a panic payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
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
        if let Some(why) = sh.dead() {
            return Err(SubmitError::Unavailable(why));
        }
        if sh.shutdown.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        check_request(&req, sh.cfg.n_ctx, sh.info.n_vocab)?;
        let mut q = sh.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= sh.cfg.queue {
            return Err(SubmitError::QueueFull { queued: q.len() });
        }
        let seq = Sequence::new(req, sink, sh.cfg.n_ctx).with_ticket(Ticket::new(&sh.in_flight));
        q.push_back(seq);
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

    fn health(&self) -> Result<(), String> {
        match self.shared.dead() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

/// Refuses what no sequence could serve: an empty prompt, one that leaves no room to generate in
/// a context of `n_ctx`, token ids outside the vocabulary.
pub fn check_request(req: &Request, n_ctx: usize, n_vocab: usize) -> Result<(), SubmitError> {
    let n_ctx = req.n_ctx.map_or(n_ctx, |c| c.min(n_ctx));
    if req.prompt.is_empty() {
        return Err(SubmitError::Invalid("the prompt is empty".into()));
    }
    if req.prompt.len() >= n_ctx {
        return Err(SubmitError::PromptTooLong {
            prompt: req.prompt.len(),
            n_ctx,
        });
    }
    if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(SubmitError::Invalid(format!(
            "token id {bad} is outside the vocabulary of {n_vocab}"
        )));
    }
    Ok(())
}

struct Slot {
    /// Tokens whose K/V are in this slot's cache, in order.
    tokens: Vec<u32>,
    active: Option<Sequence>,
    /// Step at which the slot was last used (least recently used slots are reused first).
    used: u64,
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
    rows: Vec<usize>,            // slot of each batch row with logits
    chunks: Vec<(usize, usize)>, // (slot, prompt tokens) prefilled this step
    order: Vec<usize>,           // slots prefilling this step, oldest first
    row_logits: Vec<f32>,        // [n_vocab] one row's logits, modified by sampling
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
            rows: Vec::with_capacity(n_batch),
            chunks: Vec::with_capacity(cfg.parallel),
            order: Vec::with_capacity(cfg.parallel),
            row_logits: vec![0.0; c.n_vocab],
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
            // A failed step (a panic in the forward pass or in sampling) fails the sequences it
            // held, whose caches may be half written; the others go on.
            let step = std::panic::catch_unwind(AssertUnwindSafe(|| self.step()));
            if let Err(panic) = step {
                let why = format!("internal error: {}", panic_message(&*panic));
                tracing::error!("engine step failed: {why}");
                for &i in &self.seq {
                    let slot = &mut self.slots[i];
                    slot.tokens.clear();
                    if let Some(mut seq) = slot.active.take() {
                        seq.fail(why.clone());
                    }
                }
            }
        }
    }

    /// Moves waiting requests into free slots, reusing cached prefixes.
    fn admit(&mut self) {
        loop {
            let Some(free) = self.slots.iter().position(|s| s.active.is_none()) else {
                return;
            };
            let Some(mut seq) = self
                .sh
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
            else {
                return;
            };
            // A request whose KV memory cannot be had fails alone.
            fail::fail_point!("kv::alloc", |_| {
                seq.fail("the KV cache could not be allocated for this request".into());
            });
            let prompt = seq.prompt();
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
            {
                let mut st = self.sh.stats.lock().unwrap_or_else(|e| e.into_inner());
                st.cached_tokens += common as u64;
                st.prefix_queries += 1;
                st.prefix_query_tokens += limit as u64;
            }
            seq.admitted();
            seq.set_cached(common);
            let slot = &mut self.slots[dst];
            slot.tokens.truncate(common);
            slot.used = self.step;
            slot.active = Some(seq);
        }
    }

    /// One batched forward pass over every active sequence.
    fn step(&mut self) {
        self.step += 1;
        let n_batch = self.scratch.max_tokens();
        self.tokens.clear();
        self.pos.clear();
        self.seq.clear();
        self.want.clear();
        self.rows.clear();
        self.chunks.clear();
        // Decoding sequences first: one token each.
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(t) = slot.active.as_ref().and_then(Sequence::pending) {
                self.tokens.push(t);
                self.pos.push(slot.tokens.len());
                self.seq.push(i);
                self.want.push(true);
                self.rows.push(i);
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
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend((0..self.slots.len()).filter(|&i| {
            self.slots[i]
                .active
                .as_ref()
                .is_some_and(Sequence::is_prefilling)
        }));
        order.sort_by_key(|&i| self.slots[i].used);
        for &i in &order {
            let budget = n_batch - self.tokens.len();
            if budget == 0 {
                break;
            }
            let seq = self.slots[i].active.as_ref().expect("filtered active");
            let (start, rest) = (seq.prefilled(), seq.remaining_prompt());
            let n = rest.len().min(budget);
            for (j, &t) in rest[..n].iter().enumerate() {
                self.tokens.push(t);
                self.pos.push(start + j);
                self.seq.push(i);
                let last = j + 1 == rest.len();
                self.want.push(last);
                if last {
                    self.rows.push(i);
                }
            }
            self.chunks.push((i, n));
        }
        self.order = order;
        if self.tokens.is_empty() {
            return;
        }
        fail::fail_point!("engine::step", |_| {});
        let t0 = Instant::now();
        let batch = Batch {
            tokens: &self.tokens,
            pos: &self.pos,
            seq: &self.seq,
            logits: &self.want,
        };
        let result = self
            .model
            .forward(&self.pool, &mut self.kv, &mut self.scratch, &batch, None);
        match result {
            Ok(_) => {}
            Err(e) => {
                let msg = e.to_string();
                for &i in &self.seq {
                    if let Some(mut seq) = self.slots[i].active.take() {
                        seq.fail(msg.clone());
                    }
                }
                return;
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        // The batch's tokens are now in the cache.
        for (t, &i) in self.tokens.iter().zip(&self.seq) {
            self.slots[i].tokens.push(*t);
        }
        for &(i, n) in &self.chunks {
            if let Some(seq) = self.slots[i].active.as_mut() {
                seq.advance(n);
            }
        }
        for &i in &self.seq[..n_decode] {
            if let Some(seq) = self.slots[i].active.as_mut() {
                seq.fed();
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
            st.expert_load.clear();
            st.expert_load.extend_from_slice(self.scratch.expert_load());
        }
        compute_masks(&self.pool, &mut self.slots, &self.rows);
        let n_vocab = self.model.config.n_vocab;
        let logits = self.scratch.logits();
        let tok = &*self.sh.tokenizer;
        // The generated-token counter is held for the whole loop and bumped as each token is
        // sampled, so a client that has just received its Done event (sent inside `sample`) and
        // reads the counters waits for them to include its tokens.
        let mut st = self.sh.stats.lock().unwrap_or_else(|e| e.into_inner());
        for (r, &i) in self.rows.iter().enumerate() {
            let slot = &mut self.slots[i];
            let Some(seq) = slot.active.as_mut() else {
                continue;
            };
            self.row_logits
                .copy_from_slice(&logits[r * n_vocab..(r + 1) * n_vocab]);
            let before = seq.n_gen();
            let outcome = seq.sample(&mut self.row_logits, &slot.tokens, tok);
            st.generated_tokens += (seq.n_gen() - before) as u64;
            if outcome.is_over() {
                slot.active = None;
                slot.used = self.step;
            }
        }
    }
}

/// Computes the allowed-token masks of the constrained sequences about to sample, spread over the
/// forward pass's threads (idle between passes): each sequence's grammar state is its own, so they
/// run side by side and the serial sampling loop only applies ready masks.
fn compute_masks(pool: &ThreadPool, slots: &mut [Slot], rows: &[usize]) {
    let mut pending: Vec<Mutex<&mut Constraint>> = Vec::new();
    for (i, slot) in slots.iter_mut().enumerate() {
        if !rows.contains(&i) {
            continue;
        }
        if let Some(seq) = slot.active.as_mut().filter(|s| !s.is_prefilling()) {
            if let Some(c) = seq.constraint_mut() {
                pending.push(Mutex::new(c));
            }
        }
    }
    match pending.len() {
        0 => {}
        1 => {
            // Errors surface again when the mask is applied, and end that request there.
            let _ = pending[0].get_mut().map(|c| c.compute_mask());
        }
        n => pool.run(n, &|k| {
            if let Ok(mut c) = pending[k].lock() {
                let _ = c.compute_mask();
            }
        }),
    }
}
