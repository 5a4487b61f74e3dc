//! Continuous batching: one engine thread advances every active sequence together, one batched forward
//! pass per step.
//!
//! Each step holds one token of every decoding sequence and, in the budget left, a chunk of one or more
//! prompts being prefilled, so new requests start without stalling running streams. The KV cache is
//! one pool of blocks shared by every sequence ([`crate::kv_pool`]): `parallel` bounds how many run at
//! once, not the memory each may use, and any of them may grow to the whole context. A request starts
//! from the longest prefix of its prompt found in the pool, whichever conversation computed it and
//! whether that sequence is still running (shared blocks) or finished (the prefix cache), so a
//! multi-turn chat only prefills what is new. A request waits in the queue while the pool cannot hold
//! its prompt. Because the model is batch-invariant, a request's tokens do not depend on what else
//! runs or where its prefix came from.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hearth_constrain::Constraint;
use hearth_model::{Batch, KvCache, KvType, Model, Scratch, ThreadPool, KV_BLOCK};
use hearth_tokenizer::Tokenizer;

use crate::disk_cache::{cache_namespace, DiskCache, DiskCacheConfig};
use crate::kv_pool::{chain, chain_all, BlockPool};
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
    /// Token positions in the KV pool shared by all sequences (rounded up to whole blocks);
    /// 0: `parallel * n_ctx`. At least one context's worth is always kept.
    pub pool_tokens: usize,
    /// The disk tier of the prefix cache (`--cache-dir`), or None for none.
    pub disk: Option<DiskCacheConfig>,
    /// [`model_identity`](crate::disk_cache::model_identity) of the model file, part of the disk
    /// cache's namespace; 0 when unknown (then the disk tier stays off).
    pub model_identity: u128,
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
            pool_tokens: 0,
            disk: None,
            model_identity: 0,
        }
    }
}

/// Prompt tokens per step while other sequences are decoding.
const PREFILL_CHUNK_WHILE_DECODING: usize = 128;

/// Bytes of blocks a finishing sequence hands to the disk tier inside a step (a copy each); the
/// rest go when the engine is idle, or when they are evicted.
const DISK_PUT_PER_RETIRE: usize = 64 << 20;

/// How long a shutdown goes on writing cached blocks to the disk tier.
const SHUTDOWN_SAVE: Duration = Duration::from_secs(10);

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
        let kv_capacity = pool_blocks(&cfg) * KV_BLOCK;
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
                    // Marked dead under the queue's lock, which `submit` holds from its own check
                    // to its push: a request is either refused or in the queue drained here,
                    // never queued after the drain with nothing left to run it.
                    let waiting: Vec<Sequence> = {
                        let mut q = sh.queue.lock().unwrap_or_else(|e| e.into_inner());
                        *sh.dead.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
                        q.drain(..).collect()
                    };
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
        check_request(&req, sh.cfg.n_ctx, sh.info.n_vocab)?;
        // Both checks under the queue's lock: the engine thread takes it to mark itself dead and
        // drain the queue, and to see an empty queue at shutdown before it exits, so a request
        // racing either is refused here rather than queued where nothing will run it.
        let mut q = sh.queue.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = sh.dead() {
            return Err(SubmitError::Unavailable(why));
        }
        if sh.shutdown.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
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

    /// Waits for the engine thread to end (after [`Backend::shutdown`] and the last request).
    fn join(&self) {
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
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

/// Blocks of the KV pool for a configuration: its token budget, and never less than one full
/// context plus a block of headroom per sequence.
fn pool_blocks(cfg: &SchedulerConfig) -> usize {
    let tokens = if cfg.pool_tokens == 0 {
        cfg.parallel * cfg.n_ctx
    } else {
        cfg.pool_tokens
    };
    tokens
        .div_ceil(KV_BLOCK)
        .max(cfg.n_ctx.div_ceil(KV_BLOCK) + cfg.parallel)
}

struct Slot {
    /// Tokens whose K/V are in this slot's blocks (`kv.table(slot)`), in order.
    tokens: Vec<u32>,
    /// Hash chain of the full blocks of `tokens`.
    hashes: Vec<u128>,
    active: Option<Sequence>,
    /// Step at which the slot was last used (prefill order: oldest first).
    used: u64,
}

impl Slot {
    fn parent(&self, block: usize) -> u128 {
        if block == 0 {
            0
        } else {
            self.hashes[block - 1]
        }
    }
}

struct Engine<'a> {
    model: &'a Model,
    sh: &'a Shared,
    pool: ThreadPool,
    kv: KvCache,
    /// Who holds which block of `kv`, and the prefix cache.
    blocks: BlockPool,
    /// The disk tier of the prefix cache.
    disk: Option<DiskCache>,
    /// A block's bytes on their way to the disk tier.
    export: Vec<u8>,
    /// Blocks the disk tier did not take when idle (a failed write, a full disk): not retried.
    unsaved: std::collections::HashSet<u128>,
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
}

impl<'a> Engine<'a> {
    fn new(model: &'a Model, sh: &'a Shared) -> Engine<'a> {
        let c = &model.config;
        let cfg = &sh.cfg;
        let n_batch = cfg.n_batch.max(cfg.parallel);
        let n_blocks = pool_blocks(cfg);
        Engine {
            model,
            sh,
            pool: ThreadPool::new(cfg.threads),
            kv: KvCache::pool(
                n_blocks,
                cfg.parallel,
                cfg.n_ctx,
                c.n_layer,
                c.kv_dims(),
                cfg.kv_type,
            ),
            blocks: BlockPool::new(n_blocks),
            disk: open_disk(cfg, c),
            export: Vec::new(),
            unsaved: Default::default(),
            scratch: Scratch::new(model, n_batch),
            slots: (0..cfg.parallel)
                .map(|_| Slot {
                    tokens: Vec::new(),
                    hashes: Vec::new(),
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
        }
    }

    fn run(mut self) {
        loop {
            // Outside the per-request containment below: a panic here is the engine itself
            // failing (tests use it to kill the engine thread).
            fail::fail_point!("engine::loop");
            // A panic while admitting fails that request alone (its sequence, dropped on the way
            // out, sends an error); blocks it had taken are given back by the recount.
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| self.admit())) {
                tracing::error!("admitting a request failed: {}", panic_message(&*panic));
                self.recover();
            }
            if self.slots.iter().all(|s| s.active.is_none()) {
                let q = self.sh.queue.lock().unwrap_or_else(|e| e.into_inner());
                if q.is_empty() {
                    if self.sh.shutdown.load(Ordering::Acquire) {
                        drop(q);
                        // Little lost at a restart: cached blocks go to disk, for a while.
                        let t0 = Instant::now();
                        while t0.elapsed() < SHUTDOWN_SAVE && self.save_cached(DISK_PUT_PER_RETIRE)
                        {
                        }
                        return;
                    }
                    drop(q);
                    // Idle: blocks that did not fit the disk tier's queue earlier go now.
                    if !self.save_cached(DISK_PUT_PER_RETIRE) {
                        let q = self.sh.queue.lock().unwrap_or_else(|e| e.into_inner());
                        if q.is_empty() && !self.sh.shutdown.load(Ordering::Acquire) {
                            let _ = self.sh.wake.wait_timeout(q, Duration::from_millis(200));
                        }
                    }
                }
                continue;
            }
            // A failed step (a panic in the forward pass or in sampling) fails the sequences it
            // held, whose blocks may be half written (they are freed, not cached); the others go on.
            let step = std::panic::catch_unwind(AssertUnwindSafe(|| self.step()));
            if let Err(panic) = step {
                let why = format!("internal error: {}", panic_message(&*panic));
                tracing::error!("engine step failed: {why}");
                let mut failed = self.seq.clone();
                failed.dedup();
                for i in failed {
                    if let Some(mut seq) = self.slots[i].active.take() {
                        seq.fail(why.clone());
                    }
                    self.retire(i, false);
                }
                self.recover();
            }
        }
    }

    /// After a panic: slots without a sequence hold nothing, and the pool's refcounts are
    /// recounted from the slots' block tables, so blocks taken by a change the panic cut short
    /// (an admission, a block added in `grow`) are not lost to the pool.
    fn recover(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i].active.is_none() {
                self.kv.table_mut(i).clear();
                self.slots[i].tokens.clear();
                self.slots[i].hashes.clear();
            }
        }
        let tables: Vec<&[u32]> = (0..self.slots.len()).map(|i| self.kv.table(i)).collect();
        self.blocks.reconcile(&tables);
        let mut st = self.sh.stats.lock().unwrap_or_else(|e| e.into_inner());
        self.publish(&mut st);
    }

    /// Lets go of a slot's blocks. With `cache`, its blocks stay in the pool as prefix cache
    /// (its last partial block too); without, only the full blocks already indexed stay.
    fn retire(&mut self, i: usize, cache: bool) {
        let slot = &mut self.slots[i];
        let n = slot.tokens.len();
        let table = std::mem::take(self.kv.table_mut(i));
        if cache {
            let mut budget = DISK_PUT_PER_RETIRE;
            for (&b, &h) in table.iter().zip(&slot.hashes) {
                if budget < self.kv.block_bytes() {
                    break;
                }
                if put_block(
                    &self.disk,
                    &self.kv,
                    &mut self.export,
                    b,
                    h,
                    self.blocks.tokens(b),
                ) {
                    budget -= self.kv.block_bytes();
                }
            }
        }
        let slot = &mut self.slots[i];
        if cache && !n.is_multiple_of(KV_BLOCK) && table.len() > n / KV_BLOCK {
            let b = n / KV_BLOCK;
            self.blocks
                .register_partial(table[b], slot.parent(b), &slot.tokens[b * KV_BLOCK..]);
        }
        self.blocks.release(&table);
        slot.tokens.clear();
        slot.hashes.clear();
        debug_assert!(self.slots[i].active.is_none());
    }

    /// A block to write. None when every block is held. An evicted full block goes to the disk
    /// tier first (a copy; the write happens on the tier's thread).
    fn alloc(&mut self) -> Option<u32> {
        let (b, evicted) = self.blocks.alloc()?;
        if let Some(ev) = evicted {
            if let Some(h) = ev.hash {
                put_block(&self.disk, &self.kv, &mut self.export, b, h, &ev.tokens);
            }
        }
        Some(b)
    }

    /// Hands cached full blocks not yet on disk to the disk tier, up to `budget` bytes, and waits
    /// for them to be written. Returns whether any were.
    fn save_cached(&mut self, budget: usize) -> bool {
        let Some(disk) = &self.disk else {
            return false;
        };
        let todo: Vec<(u32, u128)> = self
            .blocks
            .full_blocks()
            .filter(|&(_, h)| !disk.contains(h) && !self.unsaved.contains(&h))
            .take((budget / self.kv.block_bytes().max(1)).max(1))
            .collect();
        for &(b, h) in &todo {
            put_block(
                &self.disk,
                &self.kv,
                &mut self.export,
                b,
                h,
                self.blocks.tokens(b),
            );
        }
        if let Some(disk) = &self.disk {
            disk.flush();
            for &(_, h) in &todo {
                if !disk.contains(h) {
                    self.unsaved.insert(h);
                }
            }
        }
        !todo.is_empty()
    }

    /// Extends a prompt's cached prefix with the blocks found on disk after the first `have`
    /// blocks (`table` holds them): each is read into a new block and indexed. Returns the blocks
    /// read.
    fn load_from_disk(
        &mut self,
        prompt: &[u32],
        hashes: &[u128],
        limit: usize,
        table: &mut Vec<u32>,
    ) -> usize {
        let mut n = 0;
        while let Some(disk) = &self.disk {
            let i = table.len();
            if (i + 1) * KV_BLOCK > limit || !disk.contains(hashes[i]) {
                break;
            }
            let tokens = &prompt[i * KV_BLOCK..(i + 1) * KV_BLOCK];
            let Some(bytes) = disk.get(hashes[i], tokens) else {
                break;
            };
            let Some(b) = self.alloc() else {
                break;
            };
            if let Err(e) = self.kv.import_block(b, &bytes) {
                tracing::warn!("disk cache: block {:032x} does not fit: {e}", hashes[i]);
                self.blocks.release(&[b]);
                break;
            }
            let parent = if i == 0 { 0 } else { hashes[i - 1] };
            self.blocks.register_full(b, parent, hashes[i], tokens);
            table.push(b);
            n += 1;
        }
        n
    }

    /// Moves waiting requests into free slots, reusing the longest cached prefix in the pool. A
    /// request waits while the pool cannot hold its prompt; one the whole pool could not hold is
    /// refused.
    fn admit(&mut self) {
        loop {
            let Some(free) = self.slots.iter().position(|s| s.active.is_none()) else {
                return;
            };
            let mut queue = self.sh.queue.lock().unwrap_or_else(|e| e.into_inner());
            let Some(seq) = queue.front() else {
                return;
            };
            let prompt = seq.prompt().to_vec();
            // Keep at least the last prompt token to compute: its logits start the generation.
            let limit = prompt.len() - 1;
            let hashes = chain_all(&prompt);
            let found = self.blocks.lookup(&prompt, &hashes, limit);
            // Blocks for the rest of the prompt and the first generated token, beside those shared.
            let need = (prompt.len() + 1).div_ceil(KV_BLOCK) - found.full.len();
            let revived = found
                .full
                .iter()
                .filter(|f| self.blocks.refs(f.0) == 0)
                .count();
            let running = self.slots.iter().filter(|s| s.active.is_some()).count();
            let available = self.blocks.available() - revived;
            if available < need + running {
                if running > 0 {
                    // Wait for running sequences to give blocks back.
                    return;
                }
                let mut seq = queue.pop_front().expect("peeked");
                drop(queue);
                seq.fail(format!(
                    "the prompt needs {} tokens of KV cache but the pool holds {} tokens",
                    (need + found.full.len()) * KV_BLOCK,
                    self.blocks.len() * KV_BLOCK
                ));
                continue;
            }
            let mut seq = queue.pop_front().expect("peeked");
            drop(queue);
            // A request whose KV memory cannot be had fails alone.
            fail::fail_point!("kv::alloc", |_| {
                seq.fail("the KV cache could not be allocated for this request".into());
            });
            let mut table: Vec<u32> = found.full.iter().map(|f| f.0).collect();
            table.iter().for_each(|&b| self.blocks.retain(b));
            let from_disk = self.load_from_disk(&prompt, &hashes, limit, &mut table);
            let mut cached = table.len() * KV_BLOCK;
            let partial = if from_disk == 0 {
                found.partial
            } else {
                let rest = &prompt[cached..limit.max(cached)];
                self.blocks.best_partial(hashes[table.len() - 1], rest)
            };
            if let Some((src, rows)) = partial {
                // Copy-on-write: the shared partial block is never written again; this sequence
                // continues in a copy of its first rows. Held meanwhile so it is not the block evicted.
                self.blocks.retain(src);
                let dst = self.alloc().expect("counted available");
                self.kv.copy_block(src, dst, rows);
                self.blocks.release(&[src]);
                table.push(dst);
                cached += rows;
            }
            while table.len() < (prompt.len() + 1).div_ceil(KV_BLOCK) {
                table.push(self.alloc().expect("counted available"));
            }
            {
                let mut st = self.sh.stats.lock().unwrap_or_else(|e| e.into_inner());
                st.cached_tokens += cached as u64;
                st.prefix_queries += 1;
                st.prefix_query_tokens += limit as u64;
                st.disk_cached_tokens += (from_disk * KV_BLOCK) as u64;
                self.publish(&mut st);
            }
            seq.admitted();
            seq.set_cached(cached);
            *self.kv.table_mut(free) = table;
            let slot = &mut self.slots[free];
            slot.tokens.clear();
            slot.tokens.extend_from_slice(&prompt[..cached]);
            slot.hashes.clear();
            slot.hashes.extend_from_slice(&hashes[..cached / KV_BLOCK]);
            slot.used = self.step;
            slot.active = Some(seq);
        }
    }

    /// Gives every decoding sequence about to write into a new block that block; one that cannot
    /// have it (the pool is full of other sequences' blocks) ends with an error, and nothing else
    /// is touched.
    fn grow(&mut self) {
        for i in 0..self.slots.len() {
            let Some(seq) = self.slots[i].active.as_ref() else {
                continue;
            };
            if seq.pending().is_none() {
                continue;
            }
            let pos = self.slots[i].tokens.len();
            if pos / KV_BLOCK < self.kv.table(i).len() {
                continue;
            }
            match self.alloc() {
                Some(b) => self.kv.table_mut(i).push(b),
                None => {
                    if let Some(mut seq) = self.slots[i].active.take() {
                        seq.fail(format!(
                            "the KV cache pool ({} tokens) is full: generation stopped after {} tokens",
                            self.blocks.len() * KV_BLOCK,
                            seq.n_gen()
                        ));
                    }
                    self.retire(i, true);
                }
            }
        }
    }

    /// After a step: the slot's tokens are in its blocks; blocks it has just filled join the
    /// prefix index, so concurrent and later requests can share them.
    fn extend(&mut self, i: usize, t: u32) {
        let slot = &mut self.slots[i];
        slot.tokens.push(t);
        let n = slot.tokens.len();
        if n.is_multiple_of(KV_BLOCK) {
            let b = n / KV_BLOCK - 1;
            let parent = slot.parent(b);
            let h = chain(parent, &slot.tokens[b * KV_BLOCK..]);
            slot.hashes.push(h);
            let block = self.kv.table(i)[b];
            self.blocks
                .register_full(block, parent, h, &slot.tokens[b * KV_BLOCK..]);
        }
    }

    /// One batched forward pass over every active sequence.
    fn step(&mut self) {
        self.step += 1;
        self.grow();
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
        if let Err(e) = result {
            let msg = e.to_string();
            let mut failed = self.seq.clone();
            failed.dedup();
            for i in failed {
                if let Some(mut seq) = self.slots[i].active.take() {
                    seq.fail(msg.clone());
                }
                self.retire(i, false);
            }
            return;
        }
        let dt = t0.elapsed().as_secs_f64();
        // The batch's tokens are now in the cache.
        for r in 0..self.tokens.len() {
            self.extend(self.seq[r], self.tokens[r]);
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
            st.expert_load.clear();
            st.expert_load.extend_from_slice(self.scratch.expert_load());
        }
        compute_masks(&self.pool, &mut self.slots, &self.rows);
        let n_vocab = self.model.config.n_vocab;
        // Each row is sampled in place: nothing reads the logits after its row's sampling, and a
        // copy of each row (196 KB for a 49152-token vocabulary) was the engine thread's alone.
        let logits = self.scratch.logits_mut();
        let tok = &*self.sh.tokenizer;
        // The counters are held for the whole loop and bumped as each token is sampled, so a
        // client that has just received its Done event (sent inside `sample`) and reads them waits
        // for them to include its tokens and its released blocks.
        let sh = self.sh;
        let mut st = sh.stats.lock().unwrap_or_else(|e| e.into_inner());
        let mut over = Vec::new();
        for (r, &i) in self.rows.iter().enumerate() {
            let slot = &mut self.slots[i];
            let Some(seq) = slot.active.as_mut() else {
                continue;
            };
            let before = seq.n_gen();
            let row = &mut logits[r * n_vocab..(r + 1) * n_vocab];
            let outcome = seq.sample(row, &slot.tokens, tok);
            st.generated_tokens += (seq.n_gen() - before) as u64;
            if outcome.is_over() {
                slot.active = None;
                slot.used = self.step;
                over.push(i);
            }
        }
        for i in over {
            self.retire(i, true);
        }
        self.publish(&mut st);
    }

    /// The pool's state into the counters.
    fn publish(&self, st: &mut Stats) {
        st.kv_used = self.slots.iter().map(|s| s.tokens.len()).sum();
        st.kv_cached_blocks = self.blocks.cached();
        st.kv_held_blocks = self.blocks.len() - self.blocks.available();
    }
}

/// The disk tier of a configuration, when it has one and it opens; a tier that cannot open is
/// logged and the server runs without it.
fn open_disk(cfg: &SchedulerConfig, c: &hearth_model::Config) -> Option<DiskCache> {
    let dc = cfg.disk.as_ref()?;
    if cfg.model_identity == 0 {
        tracing::warn!("the disk cache is off: the model file's identity is unknown");
        return None;
    }
    let layout = KvCache::block_layout(cfg.kv_type, c.n_layer, c.kv_dims());
    let ns = cache_namespace(cfg.model_identity, cfg.kv_type.name(), &layout);
    match DiskCache::open(dc, ns) {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!("the disk cache is off: {e}");
            None
        }
    }
}

/// Hands block `b` (full, hash `h`) to the disk tier unless it is there already. Returns whether it
/// was handed over.
fn put_block(
    disk: &Option<DiskCache>,
    kv: &KvCache,
    buf: &mut Vec<u8>,
    b: u32,
    h: u128,
    tokens: &[u32],
) -> bool {
    let Some(disk) = disk else {
        return false;
    };
    if disk.contains(h) || tokens.len() != KV_BLOCK {
        return false;
    }
    buf.clear();
    kv.export_block(b, buf);
    disk.put(h, tokens, std::mem::take(buf));
    true
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
