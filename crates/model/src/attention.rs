//! Causal grouped-query attention over the KV cache, tiled for the caches.
//!
//! One task covers a block of up to [`rows_per_task`] consecutive batch rows of one sequence and one
//! KV head (with all the query heads that share it, or one of them when there would be too few tasks
//! to keep the threads busy), or, decoding at depth, the KV heads that fit [`TASK_BLOCK_BYTES`] over
//! some consecutive chunks (below). Keys and values are read in blocks of [`KEYS`] positions,
//! converted to f32 once per task and block and reused by every (row, head) of the task, or, when a task has
//! no more queries than one kernel call takes (decode), read by the kernel where the cache holds
//! them and widened as they are loaded (exact either way, so the same bits); the cache stores a
//! block's keys transposed (positions along a row, see [`crate::kv_cache`]), so the conversion is
//! a plain one and the scores of a query against a whole block are `head_dim` vector FMAs without
//! horizontal sums.
//!
//! Each row attends to its own key range `[lo, pos]` (`lo` is 0 for causal attention over the whole
//! context, `pos + 1 - window` in a sliding-window layer). The range is cut at the multiples of
//! [`CHUNK`]; each (row, head) runs an online softmax over each chunk, block by block in blocks
//! aligned at multiples of [`KEYS`], so a block's keys before `lo` are masked and the blocks before
//! it are never loaded: a sliding window costs nothing outside it. The chunks' states are merged
//! in chunk order, by the task itself (prefill) or after all chunks of a long context ran as tasks
//! of their own on every thread (decode at depth). An element's operations and their order depend
//! only on that row's query, key range and cache: not on the other rows of the task, the batch,
//! the chunking of a prefill, which tasks the chunks ran in, the thread count or the SIMD level.
//! The arithmetic is f32 with fused multiply-adds (`mul_add`, exactly rounded on every target) and
//! a polynomial `exp`, so the AVX-512, AVX2 and scalar builds of the block kernel agree bit for
//! bit. As llama.cpp's flash attention, Q is rounded to the cache's type for the K·Q products when
//! the cache holds f16.
//!
//! A quantized cache (q8_0, q4_0) takes the same path with the raw scores from
//! [`crate::kv_quant`]: each query quantized to Q8_0 once per task, a block's scores for all of the
//! task's queries in one integer product against the block's K rows, its V rows dequantized to f32;
//! the online softmax and the V accumulation are the f32 code above, unchanged.

use std::cell::{Cell, RefCell};
use std::ops::Range;

use half::f16;
use half::slice::HalfFloatSliceExt;
use hearth_quant::Level;

use crate::config::Config;
use crate::kv_cache::{KvCache, KvType, Rows, BLOCK};
use crate::kv_quant::{self, KeyRows, KvQuant};
use crate::ops::{exp, tanh};
use crate::threads::{SharedMut, ThreadPool};

/// Key positions per block (the score vector of one query against one block): one KV pool block.
pub(crate) const KEYS: usize = BLOCK;

/// A block's row of `KEYS` floats before it is written.
type Uninit = std::mem::MaybeUninit<[f32; KEYS]>;

/// Queries (rows × the query heads of a KV head) a task aims at: each block's keys and values are
/// converted once per task, so a task of few queries spends its time converting (SmolLM2's 3 heads
/// per KV head in 16 rows: 12% of a prefill at depth 4096 was that conversion). 256 rather than
/// 128: the 64-row attention bench of the 12-layer MoE shape (8 heads per KV head) at depth 4096
/// 44.9 / 44.2 / 44.3 ms against 45.5 / 45.8 / 46.2, alternating.
const QUERIES_PER_TASK: usize = 256;

/// Batch rows of one sequence per task, for `group` query heads per KV head: 16 to 64.
fn rows_per_task(group: usize) -> usize {
    (QUERIES_PER_TASK / group.max(1)).clamp(16, 64)
}

/// Largest head dimension the attention buffers hold.
pub(crate) const MAX_HEAD_DIM: usize = 512;

/// Per-thread buffers of a task, grown on first use and reused after.
#[derive(Default)]
struct TaskBufs {
    kt: Vec<f32>,    // [head_dim, KEYS] the block's keys, transposed
    vals: Vec<f32>,  // [KEYS, head_dim_v] the block's values
    q: Vec<f32>,     // [rows * heads, head_dim] queries (rounded to the cache type)
    state: Vec<f32>, // [rows * heads, head_dim_v + 2] a chunk's accumulator, running max, running sum
    fold: Vec<f32>,  // [rows * heads, head_dim_v + 2] the chunks so far, merged
    q8: Vec<u8>,     // [rows * heads, q8_row_bytes(head_dim)] queries as Q8_0 (quantized cache)
    sc: Vec<f32>,    // [rows * heads, KEYS] a block's raw scores (quantized cache)
}

thread_local! {
    static BUFS: RefCell<TaskBufs> = RefCell::new(TaskBufs::default());
}

fn grow(v: &mut Vec<f32>, len: usize) {
    if v.len() < len {
        v.resize(len, 0.0);
    }
}

/// Where the rows of one attention call come from.
pub(crate) struct AttnRows<'a> {
    /// Queries `[n, n_head * head_dim]`.
    pub q: &'a [f32],
    /// Position of each row: its last key.
    pub pos: &'a [usize],
    /// First key of each row (`<= pos`).
    pub lo: &'a [usize],
    /// Sequence of each row.
    pub seq: &'a [usize],
    /// The scale of the scores `q · k`.
    pub scale: f32,
    /// Soft-capping of the scaled scores, `cap * tanh(s / cap)` (Gemma 2).
    pub softcap: Option<f32>,
}

/// How a block's raw scores `q · k` become the softmax's inputs: `s * scale`, or, with a cap,
/// `cap * tanh(s * scale)` where `scale` has been divided by the cap (ggml's flash attention).
#[derive(Clone, Copy, Debug)]
struct Scale {
    scale: f32,
    /// 0: no capping.
    cap: f32,
}

impl Scale {
    fn new(scale: f32, softcap: Option<f32>) -> Scale {
        match softcap {
            None => Scale { scale, cap: 0.0 },
            Some(cap) => Scale {
                scale: scale / cap,
                cap,
            },
        }
    }
}

/// Keys per chunk of the depth split (a multiple of [`KEYS`]). Every row's key range is cut at the
/// multiples of `CHUNK`; each chunk gets its own online-softmax state, and the states are merged in
/// chunk order. A task covers some consecutive chunks, a state each (decode at depth: the chunks
/// of a long context run on all threads), or all of them, folding each into the running state as it
/// finishes: the same merges in the same order, so the same bits either way.
pub(crate) const CHUNK: usize = 4 * KEYS;

/// Split contexts by chunk when the calls' rows and KV heads alone give fewer tasks than this many
/// per thread.
const SPLIT_BELOW_PER_THREAD: usize = 4;

/// Tasks per thread a split call aims at, each of as many consecutive chunks as that leaves. A
/// task prefetches every next block while it computes one, but reads its first block cold; fewer
/// tasks balance worse. One decoding row at depth 4096, 2 threads, 5 rounds, medians of the
/// rounds' medians (`bench_attention_at_depth`): SmolLM2 (16 tasks of one chunk, 8 of two, 4 of
/// four) 6.10 / 5.50 / 6.23 ms; the 12-layer MoE shape (32, 16, 8 tasks) 9.59 / 9.25 / 8.10 ms.
const TASKS_PER_THREAD: usize = 4;

/// Most bytes of a block (keys and values) a task's KV heads take, where a task could take all
/// of them: its next block is prefetched into L2 while it computes this one.
const TASK_BLOCK_BYTES: usize = 64 << 10;

/// Most queries per task for which the block kernel reads the cache's f16 or f32 rows in place
/// (at most two calls of [`heads`] per block, each widening the block as it loads it); more
/// convert each block into f32 scratch once. Decode at depth 4096, 2 threads, Zen 4: SmolLM2 (3
/// query heads per KV head) 53.4 -> 63.5 t/s (AVX2 53.5 -> 64.6); the 12-layer Qwen3-MoE (8 per
/// KV head) 24.4 / 22.1 -> 25.7 / 26.7, where a limit of 4 (its blocks still converted) gave 23.2
/// / 20.3.
const DIRECT_QUERIES: usize = 8;

/// The chunk states of a split call are bounded by this many floats (16 MiB: one 16-row run of
/// 32 heads of 128 at a depth of 16k); past it the call runs unsplit, which computes the same bits.
const MAX_PARTS: usize = 4 << 20;

/// A run of consecutive rows of one sequence, at most [`rows_per_task`].
#[derive(Clone, Copy)]
struct Run {
    t0: u32,
    t1: u32,
    /// The first chunk any row of the run reads, and how many chunks from it the run spans.
    c0: u32,
    nc: u32,
    /// Where the run's chunk states start in [`AttnScratch::parts`] (split calls).
    part: usize,
}

/// One task: a run, KV heads from `kvh` (one, or all of them), a share of their query heads, some
/// chunks each with a state of its own, or all of them folded.
#[derive(Clone, Copy)]
struct Task {
    run: u32,
    kvh: u32,
    nkvh: u32,
    share: u32,
    /// `ALL`, or the first chunk this task computes the states of.
    chunk: u32,
    /// How many chunks from `chunk` (split calls).
    nch: u32,
}

const ALL: u32 = u32::MAX;

/// Scratch of [`attend`], kept between calls.
#[derive(Default)]
pub(crate) struct AttnScratch {
    runs: Vec<Run>,
    tasks: Vec<Task>,
    /// `[row, head, chunk, head_dim_v + 2]` per split run: each chunk's online-softmax state.
    parts: Vec<f32>,
}

/// Attention of every row over its own key range `[lo, pos]` of its sequence's cache at layer `l`,
/// written to `out` (`[n, n_head * head_dim_v]`).
pub(crate) fn attend(
    pool: &ThreadPool,
    c: &Config,
    kv: &KvCache,
    l: usize,
    r: &AttnRows,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let n = r.pos.len();
    let (hd, hdv) = (c.head_dim, c.head_dim_v);
    let od = c.n_head * hdv;
    let group = c.n_head / c.n_head_kv;
    let sw = hdv + 2;
    assert!(hd <= MAX_HEAD_DIM && hdv <= MAX_HEAD_DIM);
    debug_assert!((0..n).all(|t| r.lo[t] <= r.pos[t]));
    // Runs of consecutive rows of one sequence, cut every `rows_per_task` rows.
    let AttnScratch { runs, tasks, parts } = scratch;
    runs.clear();
    let run_rows = rows_per_task(group);
    let mut t = 0;
    while t < n {
        let mut e = t + 1;
        while e < n && r.seq[e] == r.seq[t] && e - t < run_rows {
            e += 1;
        }
        let c0 = (t..e).map(|t| r.lo[t]).min().unwrap_or(0) / CHUNK;
        let c1 = (t..e).map(|t| r.pos[t]).max().unwrap_or(0) / CHUNK;
        runs.push(Run {
            t0: t as u32,
            t1: e as u32,
            c0: c0 as u32,
            nc: (c1 + 1 - c0) as u32,
            part: 0,
        });
        t = e;
    }
    // Split by chunk when rows and KV heads give too few tasks, within the parts' bound.
    let mut n_parts = 0;
    for run in runs.iter_mut() {
        run.part = n_parts;
        n_parts += (run.t1 - run.t0) as usize * c.n_head * run.nc as usize * sw;
    }
    let threads = pool.n_threads();
    // One decoding row always (not only with few KV heads): its chunks then run as tasks of as
    // many KV heads as fit `TASK_BLOCK_BYTES`. Qwen3-0.6B's shape (8 KV heads of 128, 2 queries
    // each, 28 layers) at depth 4096, 2 threads, AVX2: a task per KV head over the whole context
    // 40-47 ms of attention a token; split, with the prefetch and value chains below, 26-32 ms.
    let split_depth = (runs.len() * c.n_head_kv < SPLIT_BELOW_PER_THREAD * threads || n == 1)
        && runs.iter().any(|run| run.nc > 1)
        && n_parts <= MAX_PARTS;
    let per_kvh: usize = if split_depth {
        runs.iter().map(|run| run.nc as usize).sum()
    } else {
        runs.len()
    };
    // Split a KV head's query heads over tasks only when there would be fewer tasks than threads
    // otherwise, and no more than that needs: every task converts its KV head's keys and values.
    let mut split = 1;
    while per_kvh * c.n_head_kv * split < threads && split < group {
        split += 1;
        while !group.is_multiple_of(split) {
            split += 1;
        }
    }
    // Query heads per task.
    let hpt = group / split;
    // Decode at depth with chunks enough for every thread: a task takes all KV heads of its
    // chunk, so the next block it prefetches is two runs of memory (all heads' keys, all heads'
    // values), spread over the block kernel's steps (see [`Prefetch`]), rather than a head's
    // share of each: its keys and a short piece of every value row.
    // The same when many sequences decode a token each (the server's step): a task per sequence
    // reads its block's keys and values as two runs of memory, the next block prefetched as it
    // goes. SmolLM2, 8 sequences at depth 256-384 (`hearth bench --parallel 8 -d 256 -n 128`, Zen
    // 3, 3 alternating pairs): the attention's share of the samples 15.7-18.0% -> 13.3-13.7%, the
    // step's throughput 312-423 -> 405-448 t/s.
    let decode_many = runs.iter().all(|run| run.t1 - run.t0 == 1)
        && runs.len() >= SPLIT_BELOW_PER_THREAD * threads;
    let kpt = if (split_depth && per_kvh >= SPLIT_BELOW_PER_THREAD * threads) || decode_many {
        // As many KV heads as keep a block's share within `TASK_BLOCK_BYTES` (a divisor of the
        // KV heads).
        let head = KEYS * (kv.ty().row_bytes(hd) + kv.ty().row_bytes(hdv));
        (1..=c.n_head_kv)
            .rev()
            .find(|&k| c.n_head_kv.is_multiple_of(k) && k * head <= TASK_BLOCK_BYTES)
            .unwrap_or(1)
    } else {
        1
    };
    // Chunks per task in a split call: as many as leave `TASKS_PER_THREAD` tasks a thread. A task
    // prefetches each next block as it computes one, but the first block of a task comes from
    // memory unannounced.
    let per_task = if split_depth {
        let chunk_tasks = per_kvh * c.n_head_kv.div_ceil(kpt) * split;
        (chunk_tasks / (TASKS_PER_THREAD * threads)).max(1) as u32
    } else {
        1
    };
    tasks.clear();
    // Later runs of a prefill see more keys: hand them out first.
    for (ri, run) in runs.iter().enumerate().rev() {
        for k in (0..if split_depth { run.nc } else { 1 }).step_by(per_task as usize) {
            let chunk = if split_depth { run.c0 + k } else { ALL };
            let nch = per_task.min(run.nc - k);
            for kvh in (0..c.n_head_kv).step_by(kpt) {
                for share in 0..split {
                    tasks.push(Task {
                        run: ri as u32,
                        kvh: kvh as u32,
                        nkvh: kpt as u32,
                        share: share as u32,
                        chunk,
                        nch,
                    });
                }
            }
        }
    }
    if split_depth {
        grow(parts, n_parts);
    }
    let scale = Scale::new(r.scale, r.softcap);
    let (runs, tasks) = (&runs[..], &tasks[..]);
    let level = hearth_quant::kernel_level();
    let geo = Geometry {
        hd,
        hdv,
        n_head: c.n_head,
        group,
        hpt,
    };
    {
        let out = SharedMut::new(&mut out[..n * od]);
        let parts = SharedMut::new(&mut parts[..if split_depth { n_parts } else { 0 }]);
        pool.run(tasks.len(), &|i| {
            let task = tasks[i];
            let run = runs[task.run as usize];
            BUFS.with(|bufs| {
                run_task(
                    level,
                    kv,
                    l,
                    r,
                    &geo,
                    scale,
                    run,
                    task,
                    &mut bufs.borrow_mut(),
                    &out,
                    &parts,
                )
            });
        });
    }
    if split_depth {
        // Each (row, head): its chunks' states merged in chunk order. A task per run, or per
        // (run, head) when there are fewer runs than threads (one decoding row).
        let out = SharedMut::new(&mut out[..n * od]);
        let parts = &parts[..n_parts];
        let per_head = runs.len() < threads;
        let n_tasks = runs.len() * if per_head { c.n_head } else { 1 };
        pool.run(n_tasks, &|i| {
            let (run, heads) = if per_head {
                (runs[i / c.n_head], i % c.n_head..i % c.n_head + 1)
            } else {
                (runs[i], 0..c.n_head)
            };
            let mut st = [0f32; MAX_HEAD_DIM + 2];
            for t in run.t0 as usize..run.t1 as usize {
                let (c_lo, c_hi) = (r.lo[t] / CHUNK, r.pos[t] / CHUNK);
                for h in heads.clone() {
                    let at = |ch: usize| {
                        let row = t - run.t0 as usize;
                        let off = run.part + ((row * c.n_head + h) * run.nc as usize + ch) * sw;
                        &parts[off..off + sw]
                    };
                    let st = &mut st[..sw];
                    st.copy_from_slice(at(c_lo - run.c0 as usize));
                    for ch in c_lo + 1..=c_hi {
                        merge(level, st, at(ch - run.c0 as usize));
                    }
                    // SAFETY: each (row, head) output slice is written by exactly one task.
                    let o = unsafe { out.slice(t * od + h * hdv, hdv) };
                    finish(st, o);
                }
            }
        });
    }
}

/// The shapes one attention call's tasks share.
struct Geometry {
    hd: usize,
    hdv: usize,
    n_head: usize,
    group: usize,
    /// Query heads per task.
    hpt: usize,
}

/// `a` becomes the state of `a`'s keys and `b`'s together (both `[head_dim_v + 2]`, each with at
/// least one key): the accumulators and sums rescaled to the larger maximum. The same operations
/// at every kernel level (with the FMA instruction where the level has it, libm's exact `fmaf`
/// otherwise), so the same bits.
fn merge(level: Level, a: &mut [f32], b: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if level != Level::Scalar {
        // SAFETY: the AVX2 and AVX-512 levels imply FMA (hearth_quant checks the CPU).
        return unsafe { merge_fma(a, b) };
    }
    let _ = level;
    merge_body(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn merge_fma(a: &mut [f32], b: &[f32]) {
    merge_body(a, b)
}

#[inline(always)]
fn merge_body(a: &mut [f32], b: &[f32]) {
    let hdv = a.len() - 2;
    let m = a[hdv].max(b[hdv]);
    let (fa, fb) = (exp(a[hdv] - m), exp(b[hdv] - m));
    for e in 0..hdv {
        a[e] = a[e].mul_add(fa, b[e] * fb);
    }
    a[hdv] = m;
    a[hdv + 1] = a[hdv + 1].mul_add(fa, b[hdv + 1] * fb);
}

/// The attention output of a finished state: the accumulator over the sum.
fn finish(st: &[f32], o: &mut [f32]) {
    let hdv = o.len();
    let inv = 1.0 / st[hdv + 1];
    for (o, x) in o.iter_mut().zip(&st[..hdv]) {
        *o = x * inv;
    }
}

/// One task of [`attend`]: its rows' query heads over one chunk (writing the chunk states to
/// `parts`) or over all chunks (folding them, and writing the output).
#[allow(clippy::too_many_arguments)]
fn run_task(
    level: Level,
    kv: &KvCache,
    l: usize,
    r: &AttnRows,
    g: &Geometry,
    scale: Scale,
    run: Run,
    task: Task,
    bufs: &mut TaskBufs,
    out: &SharedMut<f32>,
    parts: &SharedMut<f32>,
) {
    let (hd, hdv, hpt) = (g.hd, g.hdv, g.hpt);
    let (qd, od) = (g.n_head * hd, g.n_head * hdv);
    let sw = hdv + 2;
    let (kvh0, nk) = (task.kvh as usize, task.nkvh as usize);
    // The first query head of the task's `kl`-th KV head.
    let h0 = |kl: usize| (kvh0 + kl) * g.group + task.share as usize * hpt;
    let (t0, t1) = (run.t0 as usize, run.t1 as usize);
    let s = r.seq[t0];
    let quant = kv.ty().quant();
    if quant.is_some() {
        assert!(hd.is_multiple_of(kv_quant::QK) && hdv.is_multiple_of(kv_quant::QK));
    }
    let q8b = kv_quant::q8_row_bytes(hd.next_multiple_of(kv_quant::QK));
    // Queries per KV head; the buffers hold the task's KV heads one after another.
    let nq = (t1 - t0) * hpt;
    grow(&mut bufs.kt, hd * KEYS);
    grow(&mut bufs.vals, KEYS * hdv);
    grow(&mut bufs.q, nk * nq * hd);
    grow(&mut bufs.state, nk * nq * sw);
    grow(&mut bufs.fold, nk * nq * sw);
    if quant.is_some() {
        grow(&mut bufs.sc, nq * KEYS);
        if bufs.q8.len() < nk * nq * q8b {
            bufs.q8.resize(nk * nq * q8b, 0);
        }
    }
    let TaskBufs {
        kt,
        vals,
        q: qs,
        state,
        fold,
        q8,
        sc,
    } = bufs;
    for kl in 0..nk {
        for (i, t) in (t0..t1).enumerate() {
            for j in 0..hpt {
                let h = h0(kl) + j;
                let src = &r.q[t * qd + h * hd..t * qd + (h + 1) * hd];
                let qi = kl * nq + i * hpt + j;
                let dst = &mut qs[qi * hd..][..hd];
                if quant.is_some() {
                    // llama.cpp: Q converted to K's vec_dot_type (Q8_0) by its from_float.
                    let q8 = &mut q8[qi * q8b..(qi + 1) * q8b];
                    kv_quant::store_row(level, KvQuant::Q8_0, src, q8);
                } else if kv.ty() == KvType::F16 {
                    let mut h = [f16::ZERO; MAX_HEAD_DIM];
                    h[..hd].convert_from_f32_slice(src);
                    h[..hd].convert_to_f32_slice(dst);
                } else {
                    dst.copy_from_slice(src);
                }
            }
        }
    }
    let max_len = (t0..t1).map(|t| r.pos[t] + 1).max().unwrap_or(0);
    let first = (t0..t1).map(|t| r.lo[t]).min().unwrap_or(0);
    // Few queries (decode: one row's query heads of this KV head): the block kernel reads an f16
    // or f32 cache's rows where they are, widening as it loads, instead of the block converted
    // into f32 scratch first and read back (35% of SmolLM2's decode at depth 4096). Many queries
    // (prefill) convert a block once for all of them.
    let direct = quant.is_none() && nq <= DIRECT_QUERIES;
    // The block kernel's prefetch steps per block and group of queries (every `EVERY` positions
    // of a key chain; every `EVERY` keys of the AVX2 value chains, else once per value pass),
    // over which the next block is prefetched; and where the task's keys end (a task that runs
    // all chunks prefetches the next chunk's first block too).
    let most = if kv.ty() == KvType::F32 {
        queries_per_call::<f32>(level)
    } else {
        queries_per_call::<f16>(level)
    };
    let per_group = |n: usize| {
        if level == Level::Avx2 && n == 3 && hdv.is_multiple_of(8) {
            // `Avx2Soft::score_block` and `value_block`.
            let chunks = |w| chunks_of_three(w).count();
            return chunks(KEYS) * hd.div_ceil(Prefetch::EVERY)
                + chunks(hdv) * KEYS / Prefetch::EVERY;
        }
        let lanes = key_lanes(level, n);
        let value_steps = if level == Level::Avx2 && n <= AVX2_VALUE_CHAINS {
            KEYS / Prefetch::EVERY
        } else {
            1
        };
        KEYS / lanes * hd.div_ceil(Prefetch::EVERY) + hdv / lanes * value_steps
    };
    let steps = nk
        * (nq / most * per_group(most)
            + if nq % most > 0 {
                per_group(nq % most)
            } else {
                0
            });
    let shape = (hd, hdv);
    let chunks = if task.chunk == ALL {
        run.c0 as usize..(run.c0 + run.nc) as usize
    } else {
        task.chunk as usize..(task.chunk + task.nch) as usize
    };
    let k_end = (chunks.end * CHUNK).min(max_len);
    for ch in chunks {
        // Rows live in this chunk start a fresh state.
        let live = |t: usize| r.lo[t] / CHUNK <= ch && ch <= r.pos[t] / CHUNK;
        for kl in 0..nk {
            for (i, t) in (t0..t1).enumerate() {
                if live(t) {
                    let at = (kl * nq + i * hpt) * sw;
                    for st in state[at..at + hpt * sw].chunks_exact_mut(sw) {
                        st.fill(0.0);
                        st[hdv] = f32::NEG_INFINITY;
                    }
                }
            }
        }
        // The chunk's blocks that any row reads, aligned so a row's blocks do not depend on the
        // other rows.
        let k_from = (ch * CHUNK).max(first / KEYS * KEYS);
        let k_to = ((ch + 1) * CHUNK).min(max_len);
        for k0 in (k_from..k_to).step_by(KEYS) {
            let kn = KEYS.min(max_len - k0);
            // One attention block is one pool block: its rows start at the block's first row.
            let (keys, values) = kv.block_rows(s, l, k0 / KEYS);
            // The next block's share of the task's KV heads: over the block kernel's steps when it
            // reads an f16 or f32 cache in place; for a quantized cache each head's rows as its
            // scores go (`kv_quant::Ahead`); else at once.
            let mut pf = None;
            let mut next = None;
            if k0 + KEYS < k_end {
                let (nk_rows, nv_rows) = kv.block_rows(s, l, k0 / KEYS + 1);
                let heads = kvh0..kvh0 + nk;
                pf = direct
                    .then(|| Prefetch::heads(&nk_rows, &nv_rows, heads.clone(), shape, steps))
                    .flatten()
                    .map(Cell::new);
                if quant.is_some() {
                    next = Some((nk_rows, nv_rows, KEYS.min(k_end - k0 - KEYS)));
                } else if pf.is_none() {
                    for kvh in heads {
                        prefetch_block(&nk_rows, &nv_rows, kvh, hd, hdv);
                    }
                }
            }
            for kl in 0..nk {
                let kvh = kvh0 + kl;
                let state = &mut state[kl * nq * sw..(kl + 1) * nq * sw];
                let blk = BlockRows {
                    level,
                    r,
                    rows: t0..t1,
                    k0,
                    hpt,
                    hd,
                    sw,
                    scale,
                    q: &qs[kl * nq * hd..(kl + 1) * nq * hd],
                    pf: pf.as_ref(),
                };
                if let (
                    Rows::Quant {
                        ty,
                        data: kb,
                        stride: ks,
                    },
                    Rows::Quant {
                        data: vb,
                        stride: vs,
                        ..
                    },
                ) = (&keys, &values)
                {
                    // The head's queries against the block's rows of this KV head, all at once.
                    let keys = KeyRows::head(*ty, kb, *ks, hd, kvh, kn);
                    let q8 = &q8[kl * nq * q8b..(kl + 1) * nq * q8b];
                    let ahead = match &next {
                        Some((
                            Rows::Quant { data, stride, .. },
                            Rows::Quant {
                                data: vd,
                                stride: vs,
                                ..
                            },
                            n,
                        )) => {
                            let rows = |d, s, dim| kv_quant::Ahead {
                                rows: KeyRows::head(*ty, d, s, dim, kvh, *n),
                                bytes: ty.row_bytes(dim),
                            };
                            Some([rows(data, *stride, hd), rows(vd, *vs, hdv)])
                        }
                        _ => None,
                    };
                    let ahead = ahead.as_ref().map_or(&[][..], |a| &a[..]);
                    kv_quant::scores(level, hd, &keys, q8, nq, &mut sc[..nq * KEYS], ahead);
                    let vrows = KeyRows::head(*ty, vb, *vs, hdv, kvh, kn);
                    kv_quant::values(level, hdv, &vrows, &mut vals[..kn * hdv]);
                    let v = Vals::packed(&vals[..kn * hdv], hdv);
                    blk.run(&kt[..hd * KEYS], v, Some(&sc[..nq * KEYS]), state);
                } else if direct {
                    blk.run_in_place(&keys, &values, kvh, hdv, state);
                } else {
                    let at = KvAt { k0: 0, kn, kvh };
                    load_block(
                        level,
                        &keys,
                        &values,
                        &at,
                        &mut kt[..hd * KEYS],
                        vals,
                        hd,
                        hdv,
                    );
                    let v = Vals::packed(&vals[..kn * hdv], hdv);
                    blk.run(&kt[..hd * KEYS], v, None, state);
                }
            }
        }
        for kl in 0..nk {
            for (i, t) in (t0..t1).enumerate() {
                if !live(t) {
                    continue;
                }
                for j in 0..hpt {
                    let qi = kl * nq + i * hpt + j;
                    let st = &state[qi * sw..(qi + 1) * sw];
                    if task.chunk == ALL {
                        let f = &mut fold[qi * sw..(qi + 1) * sw];
                        if ch == r.lo[t] / CHUNK {
                            f.copy_from_slice(st);
                        } else {
                            merge(level, f, st);
                        }
                    } else {
                        let row = t - t0;
                        let h = h0(kl) + j;
                        let at =
                            ((row * g.n_head + h) * run.nc as usize + ch - run.c0 as usize) * sw;
                        // SAFETY: each (row, head, chunk) state is written by exactly one task.
                        unsafe { parts.slice(run.part + at, sw) }.copy_from_slice(st);
                    }
                }
            }
        }
    }
    if task.chunk == ALL {
        for kl in 0..nk {
            for (i, t) in (t0..t1).enumerate() {
                for j in 0..hpt {
                    let st = &fold[(kl * nq + i * hpt + j) * sw..][..sw];
                    // SAFETY: each (row, head) output slice is written by exactly one task.
                    let o = unsafe { out.slice(t * od + (h0(kl) + j) * hdv, hdv) };
                    finish(st, o);
                }
            }
        }
    }
}

/// One block of keys (from `k0`) against a task's rows: what its calls share.
struct BlockRows<'a, 'r> {
    level: Level,
    r: &'a AttnRows<'r>,
    rows: Range<usize>,
    k0: usize,
    hpt: usize,
    hd: usize,
    sw: usize,
    scale: Scale,
    /// The task's queries, `[rows × hpt, hd]`.
    q: &'a [f32],
    /// Lines the block kernel prefetches as it goes (see [`Prefetch`]).
    pf: Option<&'a Cell<Prefetch>>,
}

impl BlockRows<'_, '_> {
    /// [`BlockRows::run`] on KV head `kvh` of an f16 or f32 pool block as the cache holds it:
    /// its transposed keys, and its value rows of `hdv` one after the other.
    fn run_in_place(&self, keys: &Rows, values: &Rows, kvh: usize, hdv: usize, state: &mut [f32]) {
        let kr = kvh * self.hd * KEYS..(kvh + 1) * self.hd * KEYS;
        let vr = kvh * hdv * KEYS..(kvh + 1) * hdv * KEYS;
        match (keys, values) {
            (Rows::F16T(k), Rows::F16H(v)) => {
                self.run(&k[kr], Vals::packed(&v[vr], hdv), None, state)
            }
            (Rows::F32T(k), Rows::F32H(v)) => {
                self.run(&k[kr], Vals::packed(&v[vr], hdv), None, state)
            }
            _ => unreachable!("f16 and f32 keys are stored transposed, values head by head"),
        }
    }

    /// The rows' online-softmax `state`s updated with the block: keys `kt` (`[hd, KEYS]`, or the
    /// raw scores `sc`, `[queries, KEYS]`, when given) and values `vals`.
    fn run<E: Elem>(&self, kt: &[E], vals: Vals<E>, sc: Option<&[f32]>, state: &mut [f32]) {
        let (r, k0, hpt, sw, scale) = (self.r, self.k0, self.hpt, self.sw, self.scale);
        let (t0, t1) = (self.rows.start, self.rows.end);
        // Each row's live keys of the block, `ks..kc` (none: `kc == 0`).
        let live_keys = |t: usize| {
            let (len, lo) = (r.pos[t] + 1, r.lo[t]);
            if len <= k0 || lo >= k0 + KEYS {
                (0, 0)
            } else {
                (lo.saturating_sub(k0), KEYS.min(len - k0))
            }
        };
        // Consecutive rows with the same live keys (all rows but the diagonal's in a
        // prefill) have consecutive queries: up to four at a time across their heads (six on
        // AVX2 where the blocks come converted, see `Elem::AVX2_QUERIES`).
        let mut i = 0;
        while i < t1 - t0 {
            let (ks, kc) = live_keys(t0 + i);
            let mut e = i + 1;
            while e < t1 - t0 && live_keys(t0 + e) == (ks, kc) {
                e += 1;
            }
            if kc > 0 {
                let mut qi = i * hpt;
                while qi < e * hpt {
                    let src = Src {
                        pf: self.pf,
                        kt,
                        q: self.q,
                        sc,
                        hd: self.hd,
                        qi,
                    };
                    let st = &mut state[qi * sw..];
                    qi += match (e * hpt - qi).min(queries_per_call::<E>(self.level)) {
                        1 => heads::<1, E>(self.level, &src, vals, ks..kc, scale, st, sw),
                        2 => heads::<2, E>(self.level, &src, vals, ks..kc, scale, st, sw),
                        3 => heads::<3, E>(self.level, &src, vals, ks..kc, scale, st, sw),
                        4 => heads::<4, E>(self.level, &src, vals, ks..kc, scale, st, sw),
                        5 => heads::<5, E>(self.level, &src, vals, ks..kc, scale, st, sw),
                        _ => heads::<6, E>(self.level, &src, vals, ks..kc, scale, st, sw),
                    };
                }
            }
            i = e;
        }
    }
}

/// The queries of a task and where their scores come from: query `qi` (and the next ones) of
/// `q` (`[nq, hd]`) against the transposed keys `kt`, or the quantized path's scores `sc`
/// (`[nq, KEYS]`).
struct Src<'a, E = f32> {
    pf: Option<&'a Cell<Prefetch>>,
    kt: &'a [E],
    q: &'a [f32],
    sc: Option<&'a [f32]>,
    hd: usize,
    qi: usize,
}

/// [`block_n`] for the `N` query heads from `src.qi` on (their states from `state`, `sw` floats
/// each); returns `N`.
fn heads<const N: usize, E: Elem>(
    level: Level,
    src: &Src<E>,
    vals: Vals<E>,
    live: Range<usize>,
    scale: Scale,
    state: &mut [f32],
    sw: usize,
) -> usize {
    let (qi, hd) = (src.qi, src.hd);
    let scores = match src.sc {
        Some(sc) => Scores::Given(std::array::from_fn(|n| {
            sc[(qi + n) * KEYS..(qi + n + 1) * KEYS]
                .try_into()
                .expect("KEYS scores")
        })),
        None => Scores::Keys {
            kt: src.kt,
            q: std::array::from_fn(|n| &src.q[(qi + n) * hd..(qi + n + 1) * hd]),
            pf: src.pf,
        },
    };
    let mut st = state[..N * sw].chunks_exact_mut(sw);
    let st: [&mut [f32]; N] = std::array::from_fn(|_| st.next().expect("N states"));
    block_n::<N, E>(level, scores, vals, live, scale, st);
    N
}

/// Where a block of keys and values sits in a layer's cache: positions `k0..k0 + kn`, KV head
/// `kvh` (the keys transposed, the values head by head).
struct KvAt {
    k0: usize,
    kn: usize,
    kvh: usize,
}

/// A block of the cache as f32: the keys into `kt` (`[hd, KEYS]`, zeros past `kn`) and the values
/// into `vals` (`[kn, hdv]`). The keys are stored transposed ([`Rows::F16T`], [`Rows::F32T`]):
/// head `kvh`'s rows `d` are already `kt`'s. Conversion is exact (`vcvtph2ps` where the level
/// has it), so every path writes the same bits.
#[allow(clippy::too_many_arguments)]
fn load_block(
    level: Level,
    keys: &Rows,
    values: &Rows,
    at: &KvAt,
    kt: &mut [f32],
    vals: &mut [f32],
    hd: usize,
    hdv: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if level != Level::Scalar {
        // SAFETY: the AVX2 and AVX-512 levels include F16C (hearth_quant checks the CPU).
        return unsafe { load_block_f16c(keys, values, at, kt, vals, hd, hdv) };
    }
    let _ = level;
    load_block_body(keys, values, at, kt, vals, hd, hdv, |x, d| {
        x.convert_to_f32_slice(d)
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load_block_f16c(
    keys: &Rows,
    values: &Rows,
    at: &KvAt,
    kt: &mut [f32],
    vals: &mut [f32],
    hd: usize,
    hdv: usize,
) {
    use std::arch::x86_64::*;
    // `half`'s slice conversion made a call per 8 elements: 37% of a decode step at depth 4096.
    load_block_body(keys, values, at, kt, vals, hd, hdv, |x, d| {
        let n8 = x.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            // SAFETY: `i + 8 <= len` of both; F16C is enabled here.
            unsafe {
                let h = _mm_loadu_si128(x.as_ptr().add(i).cast());
                _mm256_storeu_ps(d.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
        }
        for (y, h) in d[n8..].iter_mut().zip(&x[n8..]) {
            *y = h.to_f32();
        }
    })
}

/// [`load_block`] with `cvt` converting f16 slices to f32 of the same length.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn load_block_body(
    keys: &Rows,
    values: &Rows,
    at: &KvAt,
    kt: &mut [f32],
    vals: &mut [f32],
    hd: usize,
    hdv: usize,
    cvt: impl Fn(&[f16], &mut [f32]),
) {
    assert!(at.k0 == 0 && at.kn <= KEYS && kt.len() == hd * KEYS && vals.len() >= at.kn * hdv);
    for d in 0..hd {
        let src = (at.kvh * hd + d) * KEYS;
        let dst = &mut kt[d * KEYS..(d + 1) * KEYS];
        match keys {
            Rows::F16T(x) => cvt(&x[src..src + at.kn], &mut dst[..at.kn]),
            Rows::F32T(x) => dst[..at.kn].copy_from_slice(&x[src..src + at.kn]),
            _ => unreachable!("f16 and f32 keys are stored transposed"),
        }
        dst[at.kn..].fill(0.0);
    }
    for k in 0..at.kn {
        let src = (at.kvh * KEYS + k) * hdv;
        let dst = &mut vals[k * hdv..(k + 1) * hdv];
        match values {
            Rows::F16H(x) => cvt(&x[src..src + hdv], dst),
            Rows::F32H(x) => dst.copy_from_slice(&x[src..src + hdv]),
            _ => unreachable!("f16 and f32 values are stored head by head"),
        }
    }
}

/// Asks for KV head `kvh`'s keys and values of a block (all [`KEYS`] positions) to be brought into
/// the L2 cache while the block before it is computed. A block's rows are read once per task, in
/// the order of use, and at depth they come from memory: converting them on demand waited on
/// every miss (12-layer MoE decode at depth 4096 on Zen 4: the conversion 18% of the samples, the
/// arithmetic 7%). With the prefetch: 20.6 -> 22.3 t/s (AVX-512, medians of 3 alternating runs);
/// on the AVX2 path within the noise.
fn prefetch_block(keys: &Rows, values: &Rows, kvh: usize, hd: usize, hdv: usize) {
    // f16 and f32 keys and values are stored a run per head (keys transposed).
    for (rows, width) in [(keys, hd), (values, hdv)] {
        match *rows {
            Rows::F16T(x) | Rows::F16H(x) => {
                prefetch_runs(x, kvh * width * KEYS, width * KEYS, 0, 1)
            }
            Rows::F32T(x) | Rows::F32H(x) => {
                prefetch_runs(x, kvh * width * KEYS, width * KEYS, 0, 1)
            }
            Rows::Quant { ty, data, stride } => {
                let rb = ty.row_bytes(width);
                prefetch_runs(data, kvh * rb, rb, stride, KEYS)
            }
        }
    }
}

/// The next block's keys and values of a task's KV heads, prefetched into L2 a few lines per step
/// of the block kernel's key chains rather than all at once: a block's burst of prefetches (768
/// lines for SmolLM2) waited on the core's miss buffers, the kernel's work held up behind them
/// (AVX2, one thread, SmolLM2's 30 layers at depth 4096: 21-24 ms -> 16.9-17.2 ms per decode
/// step's attention, `bench_attention_at_depth`). The heads' keys are one run of memory (stored
/// transposed, head after head), their values another (head by head).
#[derive(Clone, Copy)]
struct Prefetch {
    /// What is left of the keys' run, then of the values'.
    keys: (*const u8, *const u8),
    vals: (*const u8, *const u8),
    per_step: usize,
}

impl Prefetch {
    /// KV heads `heads` of an f16 or f32 block as the cache holds it (keys `[kvh, hd, KEYS]`,
    /// values `[kvh, KEYS, hdv]`), over about `steps` steps; `None` for a quantized block.
    fn heads(
        keys: &Rows,
        values: &Rows,
        heads: Range<usize>,
        (hd, hdv): (usize, usize),
        steps: usize,
    ) -> Option<Prefetch> {
        match (keys, values) {
            (Rows::F16T(k), Rows::F16H(v)) => Some(Prefetch::of(k, v, heads, (hd, hdv), steps)),
            (Rows::F32T(k), Rows::F32H(v)) => Some(Prefetch::of(k, v, heads, (hd, hdv), steps)),
            _ => None,
        }
    }

    /// [`Prefetch::heads`] of keys `k` and values `v` (what lies past their ends is left out).
    fn of<T>(
        k: &[T],
        v: &[T],
        heads: Range<usize>,
        (hd, hdv): (usize, usize),
        steps: usize,
    ) -> Prefetch {
        let run = |x: &[T], width: usize| {
            let r =
                (heads.start * width * KEYS).min(x.len())..(heads.end * width * KEYS).min(x.len());
            let r = x[r].as_ptr_range();
            (r.start.cast::<u8>(), r.end.cast::<u8>())
        };
        let (keys, vals) = (run(k, hd), run(v, hdv));
        let lines = |(a, b): (*const u8, *const u8)| (b as usize - a as usize).div_ceil(64) + 1;
        Prefetch {
            keys: (align_line(keys.0), keys.1),
            vals: (align_line(vals.0), vals.1),
            per_step: (lines(keys) + lines(vals)).div_ceil(steps.max(1)),
        }
    }

    /// Positions of the key chains per step: a step every few of them keeps the bookkeeping
    /// out of the FMA-bound chains of many queries (the 12-layer MoE's 8 per KV head).
    const EVERY: usize = 8;

    /// Prefetches the next lines, if any are left.
    #[inline(always)]
    fn step(&mut self) {
        for _ in 0..self.per_step {
            let Some(_at) = self.next_line() else {
                return;
            };
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch never faults.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(_at.cast());
            }
        }
    }

    /// The next line to prefetch (the keys' run, then the values'), if any is left.
    #[inline(always)]
    fn next_line(&mut self) -> Option<*const u8> {
        let at = if self.keys.0 < self.keys.1 {
            &mut self.keys.0
        } else if self.vals.0 < self.vals.1 {
            &mut self.vals.0
        } else {
            return None;
        };
        let line = *at;
        *at = at.wrapping_add(64);
        Some(line)
    }
}

/// The start of the 64-byte line holding `p`.
fn align_line(p: *const u8) -> *const u8 {
    p.wrapping_sub(p as usize % 64)
}

/// Prefetches `count` runs of `run` elements of `x`, the first at `first`, `stride` apart (what
/// lies past the end of `x` is left out).
fn prefetch_runs<T>(x: &[T], first: usize, run: usize, stride: usize, count: usize) {
    for k in 0..count {
        let from = first + k * stride;
        if let Some(r) = x.get(from..(from + run).min(x.len())) {
            hearth_quant::prefetch_l2(r);
        }
    }
}

/// Where a block's raw scores `q · k` come from, for `N` queries.
#[derive(Clone, Copy)]
enum Scores<'a, const N: usize, E = f32> {
    /// Computed in the block kernel: each query (`[head_dim]`) against the block's keys
    /// transposed (`kt`: `[head_dim, KEYS]`), one FMA chain per key over the head dimension.
    Keys {
        kt: &'a [E],
        q: [&'a [f32]; N],
        /// Lines to prefetch, a share per step of the chain.
        pf: Option<&'a Cell<Prefetch>>,
    },
    /// Computed already, one `[KEYS]` vector per query (a quantized cache: [`kv_quant::scores`]).
    Given([&'a [f32; KEYS]; N]),
}

/// A block's values: row `k` (`[head_dim_v]`) at `x[k * stride..]`.
#[derive(Clone, Copy)]
struct Vals<'a, E = f32> {
    x: &'a [E],
    stride: usize,
}

impl<'a, E> Vals<'a, E> {
    /// Rows of `hdv` one after the other.
    fn packed(x: &'a [E], hdv: usize) -> Vals<'a, E> {
        Vals { x, stride: hdv }
    }
}

/// An element of the keys and values the block kernel reads: f32, or the cache's f16 widened to
/// f32 as it is loaded (exact, so the same bits as a block converted beforehand).
trait Elem: Copy {
    /// Queries the AVX2 block kernel takes at a time (its 16 registers: `2 × N` accumulators,
    /// the two key or value vectors and a broadcast). Six where blocks come converted to f32
    /// (prefill: every key and value loaded serves six queries, 12 FMAs per 8 loads; the 64-row
    /// attention bench of the 12-layer MoE shape at depth 4096 45.4 / 46.8 / 45.9 ms against
    /// 53.2 / 52.7 / 52.8 with four, alternating); four where the kernel widens f16 as it loads
    /// (decode: one row's eight heads as six and two took 1.0-1.2 ms against 0.7-1.0).
    const AVX2_QUERIES: usize;
    /// `x` as f32, through level `S`'s instructions.
    ///
    /// # Safety
    /// The CPU must have `S`'s features.
    unsafe fn widen<S: Soft, const W: usize>(x: &[Self; W]) -> [f32; W];
    /// One element as f32.
    fn f32(self) -> f32;
    /// The 8 elements from `x` as f32 lanes.
    ///
    /// # Safety
    /// The 8 elements lie within one allocation; the CPU has AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn ymm(x: *const Self) -> std::arch::x86_64::__m256;
}

impl Elem for f32 {
    const AVX2_QUERIES: usize = 6;
    #[inline(always)]
    unsafe fn widen<S: Soft, const W: usize>(x: &[f32; W]) -> [f32; W] {
        *x
    }
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn ymm(x: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(x) }
    }
}

impl Elem for f16 {
    const AVX2_QUERIES: usize = 4;
    #[inline(always)]
    unsafe fn widen<S: Soft, const W: usize>(x: &[f16; W]) -> [f32; W] {
        // SAFETY: the caller's CPU has `S`'s features.
        unsafe { S::f16s(x) }
    }
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn ymm(x: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(x.cast())) }
    }
}

/// One block of keys for one query: the scores `q · k * scale` of the block's live keys `live`
/// (lanes `ks..kc` of the scores; `ks` > 0 where a sliding window starts inside the block), then
/// the online-softmax update of `state` (`[head_dim_v]` output accumulator, running max, running
/// sum) with their values (`vals`: `[kc, head_dim_v]`, the rows before `ks` unread).
#[cfg(test)]
fn block(
    level: Level,
    src: Scores<1>,
    vals: &[f32],
    live: Range<usize>,
    scale: Scale,
    state: &mut [f32],
) {
    let hdv = state.len() - 2;
    block_n::<1, f32>(level, src, Vals::packed(vals, hdv), live, scale, [state])
}

/// [`block`] for `N` queries at once (query heads of one row, so the same keys): every key and
/// value loaded serves the `N` of them. Each query's operations are those of [`block`], in the
/// same order, so the results are the same bits.
fn block_n<const N: usize, E: Elem>(
    level: Level,
    src: Scores<N, E>,
    vals: Vals<E>,
    live: Range<usize>,
    scale: Scale,
    state: [&mut [f32]; N],
) {
    #[cfg(target_arch = "x86_64")]
    {
        match level {
            // SAFETY: the level is at most what the CPU supports (hearth_quant checks).
            Level::Avx512 => return unsafe { block_avx512::<N, E>(src, vals, live, scale, state) },
            Level::Avx2 => return unsafe { block_avx2::<N, E>(src, vals, live, scale, state) },
            Level::Scalar => {}
        }
    }
    let _ = level;
    block_body::<N, E, ScalarSoft, KEYS, OUT_CHUNK>(src, vals, live, scale, state)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn block_avx512<const N: usize, E: Elem>(
    src: Scores<N, E>,
    vals: Vals<E>,
    live: Range<usize>,
    scale: Scale,
    state: [&mut [f32]; N],
) {
    block_body::<N, E, Avx512Soft, KEYS, OUT_CHUNK>(src, vals, live, scale, state)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2<const N: usize, E: Elem>(
    src: Scores<N, E>,
    vals: Vals<E>,
    live: Range<usize>,
    scale: Scale,
    state: [&mut [f32]; N],
) {
    match avx2_lanes(N) {
        64 => block_body::<N, E, Avx2Soft, 64, 64>(src, vals, live, scale, state),
        32 => block_body::<N, E, Avx2Soft, 32, 32>(src, vals, live, scale, state),
        _ => block_body::<N, E, Avx2Soft, 16, 16>(src, vals, live, scale, state),
    }
}

/// Key lanes (and output elements) the AVX2 block kernel keeps in registers at a time for `n`
/// queries: 8 FMA chains at least (two FMAs a cycle of four cycles' latency) within the 16 ymm
/// registers. Four queries of 16 keys and 16 outputs take 8 accumulators; 64 of each, as on
/// AVX-512, spilled the accumulators to the stack on every FMA, and three queries of 32 (12
/// accumulators, 3 broadcasts, a key or value vector) spilled too.
const fn avx2_lanes(n: usize) -> usize {
    match n {
        1 => 64,
        2 => 32,
        _ => 16,
    }
}

/// Queries the block kernel of `level` takes per call, reading elements `E`.
fn queries_per_call<E: Elem>(level: Level) -> usize {
    if level == Level::Avx2 {
        E::AVX2_QUERIES
    } else {
        4
    }
}

/// Most queries whose value chains the AVX2 level runs as [`chains_avx2`].
const AVX2_VALUE_CHAINS: usize = 2;

/// Key lanes the block kernel of `level` keeps in registers at a time for `n` queries.
fn key_lanes(level: Level, n: usize) -> usize {
    if level == Level::Avx2 {
        avx2_lanes(n)
    } else {
        KEYS
    }
}

/// A block's softmax steps, per kernel level; every level gives the same bits (the scalar code's
/// operations lane by lane; a maximum does not depend on the order it is taken in).
trait Soft {
    /// Scales (and caps) the scores `ks..kc` and returns their maximum (`-inf` if none); the
    /// others are left as they are.
    ///
    /// # Safety
    /// The CPU must have the level's features.
    unsafe fn scale_max(s: &mut [f32; KEYS], ks: usize, kc: usize, sc: Scale) -> f32;
    /// `p[k] = exp(s[k] - m)` for the live keys `ks..kc`, 0 for the others, and the block's sum
    /// of `p`: 16 lanes summed over the key chunks of 16 in order (`lane[l] = ((0 + p[l]) +
    /// p[16 + l]) + ...`), then halved pairwise (`lane[j] += lane[j + w]` for `w` = 8, 4, 2, 1).
    /// Every lane of `p` is written, so it may come uninitialised (the block kernel's weights are
    /// not zeroed first: a `memset` per call that was ~1% of a prefill at depth).
    ///
    /// # Safety
    /// As [`Soft::scale_max`].
    unsafe fn exp_sum(s: &[f32; KEYS], ks: usize, kc: usize, m: f32, p: &mut Uninit) -> f32;
    /// `x` widened to f32 (exact).
    ///
    /// # Safety
    /// As [`Soft::scale_max`].
    unsafe fn f16s<const W: usize>(x: &[f16; W]) -> [f32; W];
    /// All `KEYS` lanes of the block's raw scores of `N` queries into `s`, uninitialised on entry
    /// (the chains of the generic steps, lane by lane over the head dimension in order, each
    /// starting at zero; the lanes of dead keys too), a prefetch step every [`Prefetch::EVERY`]
    /// positions of each group of lanes. `false` (nothing written) where the level leaves them to
    /// the generic steps.
    ///
    /// # Safety
    /// As [`Soft::scale_max`]; `kt` holds `hd * KEYS` keys, `hd` the queries' length.
    #[inline(always)]
    unsafe fn score_block<const N: usize, E: Elem>(
        _kt: &[E],
        _q: &[&[f32]; N],
        _s: &mut [Uninit; N],
        _pf: &mut Option<Prefetch>,
    ) -> bool {
        false
    }
    /// The whole value update of `N` queries: `state[n][e] = state[n][e] * alpha[n]`, then the
    /// value chains of the generic steps over the keys `keys` for every element `e < hdv` (rows
    /// `vs` apart in `vx`). `false` (nothing done) where the level leaves it to the generic
    /// steps.
    ///
    /// # Safety
    /// As [`Soft::scale_max`]; row `k`'s `hdv` elements lie within `vx` for every key, and each
    /// state holds at least `hdv` elements.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn value_block<const N: usize, E: Elem>(
        _vx: &[E],
        _vs: usize,
        _hdv: usize,
        _keys: Range<usize>,
        _p: &[[f32; KEYS]; N],
        _alpha: &[f32; N],
        _state: &mut [&mut [f32]; N],
        _pf: &mut Option<Prefetch>,
    ) -> bool {
        false
    }
    /// The value chains of `N` queries over the keys `keys` for the `OC` output elements of
    /// each value row from `vx` (rows `vs` apart): `acc[n][i] = fma(p[n][k], v[k][i],
    /// acc[n][i])` key by key in order, a prefetch step every [`Prefetch::EVERY`] keys. `false`
    /// (nothing done) where the level leaves them to the block kernel's plain loop.
    ///
    /// # Safety
    /// As [`Soft::scale_max`]; row `k`'s `OC` elements lie within `vx` for every key.
    #[inline(always)]
    unsafe fn value_chains<const N: usize, E: Elem, const OC: usize>(
        _vx: &[E],
        _vs: usize,
        _keys: Range<usize>,
        _p: &[[f32; KEYS]; N],
        _acc: &mut [[f32; OC]; N],
        _pf: &mut Option<Prefetch>,
    ) -> bool {
        false
    }
}

/// The plain code (auto-vectorised as far as the compiler manages).
struct ScalarSoft;

impl Soft for ScalarSoft {
    #[inline(always)]
    unsafe fn scale_max(s: &mut [f32; KEYS], ks: usize, kc: usize, sc: Scale) -> f32 {
        let mut bmax = f32::NEG_INFINITY;
        if sc.cap == 0.0 {
            for x in &mut s[ks..kc] {
                *x *= sc.scale;
                bmax = bmax.max(*x);
            }
        } else {
            for x in &mut s[ks..kc] {
                *x = sc.cap * tanh(*x * sc.scale);
                bmax = bmax.max(*x);
            }
        }
        bmax
    }

    #[inline(always)]
    unsafe fn exp_sum(s: &[f32; KEYS], ks: usize, kc: usize, m: f32, p: &mut Uninit) -> f32 {
        for (k, &sk) in s.iter().enumerate() {
            let x = if (ks..kc).contains(&k) {
                exp(sk - m)
            } else {
                0.0
            };
            // SAFETY: `k < KEYS`, within the row.
            unsafe { p.as_mut_ptr().cast::<f32>().add(k).write(x) };
        }
        // SAFETY: every lane was written above.
        let p = unsafe { p.assume_init_ref() };
        let mut lanes = [0f32; 16];
        for c in 0..KEYS / 16 {
            for (l, x) in lanes.iter_mut().zip(&p[16 * c..16 * c + 16]) {
                *l += x;
            }
        }
        let mut w = 16;
        while w > 1 {
            w /= 2;
            for j in 0..w {
                lanes[j] += lanes[j + w];
            }
        }
        lanes[0]
    }

    #[inline(always)]
    unsafe fn f16s<const W: usize>(x: &[f16; W]) -> [f32; W] {
        std::array::from_fn(|i| x[i].to_f32())
    }
}

/// AVX-512: 16 keys per register ([`exp`]'s operations in every lane); was scalar code, a
/// serial maximum and 64 scalar `exp`s per query and block.
#[cfg(target_arch = "x86_64")]
struct Avx512Soft;

#[cfg(target_arch = "x86_64")]
impl Soft for Avx512Soft {
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    unsafe fn scale_max(s: &mut [f32; KEYS], ks: usize, kc: usize, sc: Scale) -> f32 {
        use std::arch::x86_64::*;
        let (capped, cap) = (sc.cap != 0.0, _mm512_set1_ps(sc.cap));
        let sc = _mm512_set1_ps(sc.scale);
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        for c in 0..KEYS / 16 {
            // Lanes `ks..kc` of this chunk of 16.
            let (lo, hi) = (
                ks.saturating_sub(16 * c).min(16),
                kc.saturating_sub(16 * c).min(16),
            );
            if hi == 0 {
                break;
            }
            if lo == hi {
                continue;
            }
            let mask = mask16(lo, hi);
            let ptr = s.as_mut_ptr().add(16 * c);
            let mut v = _mm512_mul_ps(_mm512_loadu_ps(ptr), sc);
            if capped {
                v = _mm512_mul_ps(cap, tanh16(v));
            }
            _mm512_mask_storeu_ps(ptr, mask, v);
            mx = _mm512_mask_max_ps(mx, mask, mx, v);
        }
        _mm512_reduce_max_ps(mx)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    unsafe fn exp_sum(s: &[f32; KEYS], ks: usize, kc: usize, m: f32, p: &mut Uninit) -> f32 {
        use std::arch::x86_64::*;
        // Every chunk below is stored, live or not.
        let p = p.as_mut_ptr().cast::<f32>();
        let mv = _mm512_set1_ps(m);
        // The 16 lanes' sums; adding a dead chunk's zeros changes nothing (the sums are >= +0).
        let mut acc = _mm512_setzero_ps();
        if ks == 0 && kc == KEYS {
            // Every key live (all blocks but a row's last and a window's first): no masks.
            for c in 0..KEYS / 16 {
                let x = _mm512_sub_ps(_mm512_loadu_ps(s.as_ptr().add(16 * c)), mv);
                let e = exp16(x);
                _mm512_storeu_ps(p.add(16 * c), e);
                acc = _mm512_add_ps(acc, e);
            }
            return halve16(acc);
        }
        for c in 0..KEYS / 16 {
            let (lo, hi) = (
                ks.saturating_sub(16 * c).min(16),
                kc.saturating_sub(16 * c).min(16),
            );
            let ptr = p.add(16 * c);
            if lo == hi {
                _mm512_storeu_ps(ptr, _mm512_setzero_ps());
                continue;
            }
            let mask = mask16(lo, hi);
            let x = _mm512_sub_ps(_mm512_loadu_ps(s.as_ptr().add(16 * c)), mv);
            let e = _mm512_maskz_mov_ps(mask, exp16(x));
            _mm512_storeu_ps(ptr, e);
            acc = _mm512_add_ps(acc, e);
        }
        halve16(acc)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    unsafe fn f16s<const W: usize>(x: &[f16; W]) -> [f32; W] {
        use std::arch::x86_64::*;
        const { assert!(W.is_multiple_of(16)) };
        let mut y = [0f32; W];
        for i in (0..W).step_by(16) {
            let h = _mm256_loadu_si256(x.as_ptr().add(i).cast());
            _mm512_storeu_ps(y.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
        y
    }
}

/// AVX2: 8 keys per register, the lanes of [`Avx512Soft`] (masks as blends).
#[cfg(target_arch = "x86_64")]
struct Avx2Soft;

#[cfg(target_arch = "x86_64")]
impl Soft for Avx2Soft {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn scale_max(s: &mut [f32; KEYS], ks: usize, kc: usize, sc: Scale) -> f32 {
        use std::arch::x86_64::*;
        let (capped, cap) = (sc.cap != 0.0, _mm256_set1_ps(sc.cap));
        let sc = _mm256_set1_ps(sc.scale);
        let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
        if ks == 0 && kc == KEYS {
            // Every key live: plain stores. The masked form below compiles to `vmaskmovps`,
            // which AMD cores run microcoded (~9% of an AVX2 prefill's attention on Zen 4).
            for c in 0..KEYS / 8 {
                let ptr = s.as_mut_ptr().add(8 * c);
                let mut v = _mm256_mul_ps(_mm256_loadu_ps(ptr), sc);
                if capped {
                    v = _mm256_mul_ps(cap, tanh8(v));
                }
                _mm256_storeu_ps(ptr, v);
                mx = _mm256_max_ps(mx, v);
            }
            return max8(mx);
        }
        for c in 0..KEYS / 8 {
            // Lanes `ks..kc` of this chunk of 8.
            let (lo, hi) = (
                ks.saturating_sub(8 * c).min(8),
                kc.saturating_sub(8 * c).min(8),
            );
            if hi == 0 {
                break;
            }
            if lo == hi {
                continue;
            }
            let mask = mask8(lo, hi);
            let ptr = s.as_mut_ptr().add(8 * c);
            let old = _mm256_loadu_ps(ptr);
            let mut v = _mm256_mul_ps(old, sc);
            if capped {
                v = _mm256_mul_ps(cap, tanh8(v));
            }
            _mm256_storeu_ps(ptr, _mm256_blendv_ps(old, v, mask));
            mx = _mm256_blendv_ps(mx, _mm256_max_ps(mx, v), mask);
        }
        max8(mx)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_sum(s: &[f32; KEYS], ks: usize, kc: usize, m: f32, p: &mut Uninit) -> f32 {
        use std::arch::x86_64::*;
        // Every chunk below is stored, live or not.
        let p = p.as_mut_ptr().cast::<f32>();
        let mv = _mm256_set1_ps(m);
        // Lanes 0..8 and 8..16 of the 16 lanes' sums.
        let mut acc = [_mm256_setzero_ps(); 2];
        if ks == 0 && kc == KEYS {
            // Every key live (all blocks but a row's last and a window's first): no masks.
            for c in 0..KEYS / 16 {
                let x0 = _mm256_sub_ps(_mm256_loadu_ps(s.as_ptr().add(16 * c)), mv);
                let x1 = _mm256_sub_ps(_mm256_loadu_ps(s.as_ptr().add(16 * c + 8)), mv);
                let (e0, e1) = (exp8(x0), exp8(x1));
                _mm256_storeu_ps(p.add(16 * c), e0);
                _mm256_storeu_ps(p.add(16 * c + 8), e1);
                acc[0] = _mm256_add_ps(acc[0], e0);
                acc[1] = _mm256_add_ps(acc[1], e1);
            }
            return halve8(_mm256_add_ps(acc[0], acc[1]));
        }
        for c in 0..KEYS / 8 {
            let (lo, hi) = (
                ks.saturating_sub(8 * c).min(8),
                kc.saturating_sub(8 * c).min(8),
            );
            let ptr = p.add(8 * c);
            if lo == hi {
                _mm256_storeu_ps(ptr, _mm256_setzero_ps());
                continue;
            }
            let mask = mask8(lo, hi);
            let x = _mm256_sub_ps(_mm256_loadu_ps(s.as_ptr().add(8 * c)), mv);
            let e = _mm256_and_ps(mask, exp8(x));
            _mm256_storeu_ps(ptr, e);
            acc[c % 2] = _mm256_add_ps(acc[c % 2], e);
        }
        halve8(_mm256_add_ps(acc[0], acc[1]))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16s<const W: usize>(x: &[f16; W]) -> [f32; W] {
        use std::arch::x86_64::*;
        const { assert!(W.is_multiple_of(8)) };
        let mut y = [0f32; W];
        for i in (0..W).step_by(8) {
            let h = _mm_loadu_si128(x.as_ptr().add(i).cast());
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        y
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn score_block<const N: usize, E: Elem>(
        kt: &[E],
        q: &[&[f32]; N],
        s: &mut [Uninit; N],
        pf: &mut Option<Prefetch>,
    ) -> bool {
        if N != 3 {
            return false;
        }
        // The chains add to what `out` holds.
        for row in s.iter_mut() {
            row.write([0.0; KEYS]);
        }
        let (out, hd) = (s.as_mut_ptr().cast::<f32>(), q[0].len());
        for (at, lanes) in chunks_of_three(KEYS) {
            // SAFETY: lanes `at..at + lanes` of every key row lie within the block (the caller's
            // contract) and within each query's `KEYS` scores; `w` reads `d < hd`, every query's
            // length.
            unsafe {
                let (kt, out) = (kt.as_ptr().add(at), out.add(at));
                let w = |n: usize, d: usize| *q[n].get_unchecked(d);
                chunk_chains::<N, E>(lanes, kt, KEYS, 0..hd, w, out, KEYS, pf);
            }
        }
        true
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn value_block<const N: usize, E: Elem>(
        vx: &[E],
        vs: usize,
        hdv: usize,
        keys: Range<usize>,
        p: &[[f32; KEYS]; N],
        alpha: &[f32; N],
        state: &mut [&mut [f32]; N],
        pf: &mut Option<Prefetch>,
    ) -> bool {
        if N != 3 || !hdv.is_multiple_of(8) {
            return false;
        }
        for (e0, lanes) in chunks_of_three(hdv) {
            let mut acc = [[0f32; 24]; N];
            for n in 0..N {
                for (a, x) in acc[n].iter_mut().zip(&state[n][e0..e0 + lanes]) {
                    *a = x * alpha[n];
                }
            }
            let (a, w) = (acc.as_mut_ptr().cast::<f32>(), |n: usize, k: usize| p[n][k]);
            // SAFETY: every key's elements `e0..e0 + lanes` lie within `vx` (the caller's
            // contract); `acc` is `N` rows of 24 floats.
            unsafe {
                let vx = vx.as_ptr().add(e0);
                chunk_chains::<N, E>(lanes, vx, vs, keys.clone(), w, a, 24, pf);
            }
            for n in 0..N {
                state[n][e0..e0 + lanes].copy_from_slice(&acc[n][..lanes]);
            }
        }
        true
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn value_chains<const N: usize, E: Elem, const OC: usize>(
        vx: &[E],
        vs: usize,
        keys: Range<usize>,
        p: &[[f32; KEYS]; N],
        acc: &mut [[f32; OC]; N],
        pf: &mut Option<Prefetch>,
    ) -> bool {
        // Three or four queries: LLVM's steps (over the keys once per 8 lanes, 6 or 8 chains)
        // ran as fast or faster (the 12-layer Qwen3-MoE shape's 4-query calls: 1155 against
        // 1275 us a layer at depth 4096, one thread; again with a head's values in one run,
        // 1076-1092 against 1269-1278 us); one or two queries had 1 or 2 chains.
        if N > AVX2_VALUE_CHAINS {
            return false;
        }
        let (a, w) = (acc.as_mut_ptr().cast::<f32>(), |n: usize, k: usize| p[n][k]);
        // SAFETY: the caller's contract; `acc` is `N` rows of `OC` floats.
        unsafe {
            match OC {
                16 => chains_avx2::<N, 2, E>(vx.as_ptr(), vs, keys, w, a, OC, pf),
                32 => chains_avx2::<N, 4, E>(vx.as_ptr(), vs, keys, w, a, OC, pf),
                64 => chains_avx2::<N, 8, E>(vx.as_ptr(), vs, keys, w, a, OC, pf),
                _ => return false,
            }
        }
        true
    }
}

/// The chunks (first lane, lanes) the AVX2 kernels of three queries cut `w` lanes into (`w` a
/// multiple of 8): 24 at a time while 40 or more (or exactly 24) are left, then 16, then 8. Three
/// queries of 24 lanes keep 9 FMA chains in registers (with 3 broadcasts and one key or value
/// vector, 13 of the 16), enough for both FMA pipes; of 16 lanes, the generic steps' width, only
/// 6, one FMA latency per position for 6 FMAs; of 32, 12 chains, which with the broadcasts and a
/// vector take every register and LLVM spilled one.
fn chunks_of_three(w: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let rest = w - at;
        let lanes = match rest {
            24 => 24,
            r if r >= 40 => 24,
            r if r >= 16 => 16,
            r if r >= 8 => 8,
            _ => return None,
        };
        let chunk = (at, lanes);
        at += lanes;
        Some(chunk)
    })
}

/// [`chains_avx2`] over one chunk of [`chunks_of_three`]: 24, 16 or 8 lanes.
///
/// # Safety
/// As [`chains_avx2`] for `lanes` lanes.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn chunk_chains<const N: usize, E: Elem>(
    lanes: usize,
    x: *const E,
    xs: usize,
    at: Range<usize>,
    w: impl Fn(usize, usize) -> f32,
    acc: *mut f32,
    stride: usize,
    pf: &mut Option<Prefetch>,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match lanes {
            24 => chains_avx2::<N, 3, E>(x, xs, at, w, acc, stride, pf),
            16 => chains_avx2::<N, 2, E>(x, xs, at, w, acc, stride, pf),
            _ => chains_avx2::<N, 1, E>(x, xs, at, w, acc, stride, pf),
        }
    }
}

/// The AVX2 chains of [`Soft::value_chains`] and [`Soft::score_block`] for `8 * R` lanes, `acc`
/// being `N` rows of them (row `n` at `acc + n * stride`): for each position `i` of `at` in
/// order, `acc[n][l] = fma(w(n, i), x[i][l], acc[n][l])`, row `x[i]` at `x + i * xs` (value rows
/// over the keys; for scores the transposed keys' rows over the head dimension). The `N * R`
/// chains stay in registers, each position's `R` vectors are loaded once and each weight
/// broadcast once; a prefetch step every [`Prefetch::EVERY`] positions. The generic steps left
/// the values to LLVM, which went over the keys once per 8 output lanes with `N` chains each,
/// four of the FMAs' four cycles of latency for a 4-query call.
///
/// # Safety
/// `acc` holds `(N - 1) * stride + 8 * R` floats, row `i`'s `8 * R` elements lie within one
/// allocation for every `i` in `at`, `w` may be called with any `n < N` and `i` in `at`, and the
/// CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chains_avx2<const N: usize, const R: usize, E: Elem>(
    x: *const E,
    xs: usize,
    at: Range<usize>,
    w: impl Fn(usize, usize) -> f32,
    acc: *mut f32,
    stride: usize,
    pf: &mut Option<Prefetch>,
) {
    use std::arch::x86_64::*;
    // SAFETY (all below): the caller's contract.
    let mut a = [[_mm256_setzero_ps(); R]; N];
    for (n, a) in a.iter_mut().enumerate() {
        for (r, a) in a.iter_mut().enumerate() {
            *a = unsafe { _mm256_loadu_ps(acc.add(n * stride + r * 8)) };
        }
    }
    let step = |i: usize, a: &mut [[__m256; R]; N]| {
        let b: [__m256; N] = std::array::from_fn(|n| _mm256_set1_ps(w(n, i)));
        let row = unsafe { x.add(i * xs) };
        #[allow(clippy::needless_range_loop)]
        for r in 0..R {
            let v = unsafe { E::ymm(row.add(r * 8)) };
            for n in 0..N {
                a[n][r] = _mm256_fmadd_ps(b[n], v, a[n][r]);
            }
        }
    };
    // A count LLVM cannot see for three queries: unrolled, the loop's steps were interleaved and
    // their broadcasts and vectors held across them, spilling the chains to the stack.
    let every = if N == 3 {
        std::hint::black_box(Prefetch::EVERY)
    } else {
        Prefetch::EVERY
    };
    let mut i0 = at.start;
    while i0 + every <= at.end {
        if let Some(pf) = pf {
            pf.step();
        }
        for i in i0..i0 + every {
            step(i, &mut a);
        }
        i0 += every;
    }
    if i0 < at.end {
        if let Some(pf) = pf {
            pf.step();
        }
        for i in i0..at.end {
            step(i, &mut a);
        }
    }
    for (n, a) in a.iter().enumerate() {
        for (r, a) in a.iter().enumerate() {
            unsafe { _mm256_storeu_ps(acc.add(n * stride + r * 8), *a) };
        }
    }
}

/// The maximum of 8 lanes (order-free).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn max8(mx: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<0x55>(m2, m2));
    _mm_cvtss_f32(m1)
}

/// The lanes `lo..hi` of a chunk of 16 as a mask.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn mask16(lo: usize, hi: usize) -> std::arch::x86_64::__mmask16 {
    let upto: u32 = if hi == 16 { !0 } else { (1 << hi) - 1 };
    (upto & !((1u32 << lo) - 1)) as u16
}

/// The lanes `lo..hi` of a chunk of 8 as a blend mask (all bits set in those lanes).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mask8(lo: usize, hi: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    // lo <= lane < hi
    _mm256_castsi256_ps(_mm256_andnot_si256(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(lo as i32), lane),
        _mm256_cmpgt_epi32(_mm256_set1_epi32(hi as i32), lane),
    ))
}

/// `lane[j] += lane[j + w]` for `w` = 8, 4, 2, 1 over 16 lanes: lane 0 at the end.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn halve16(v: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    halve8(_mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    ))
}

/// `lane[j] += lane[j + w]` for `w` = 4, 2, 1 over 8 lanes: lane 0 at the end.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn halve8(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let h4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    let h1 = _mm_add_ss(h2, _mm_shuffle_ps::<0x55>(h2, h2));
    _mm_cvtss_f32(h1)
}

/// [`exp`] in each of 8 lanes: [`exp16`]'s operations.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const MAGIC: f32 = 12_582_912.0;
    let lo = _mm256_set1_ps(-87.3);
    let xc = _mm256_min_ps(_mm256_set1_ps(88.0), _mm256_max_ps(lo, x));
    let magic = _mm256_set1_ps(MAGIC);
    let shifted = _mm256_fmadd_ps(xc, _mm256_set1_ps(LOG2E), magic);
    let n = _mm256_sub_ps(shifted, magic);
    let ni = _mm256_sub_epi32(
        _mm256_castps_si256(shifted),
        _mm256_set1_epi32(MAGIC.to_bits() as i32),
    );
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), xc);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    y = _mm256_fmadd_ps(
        y,
        _mm256_mul_ps(r, r),
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        ni,
        _mm256_set1_epi32(127),
    )));
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
    _mm256_andnot_ps(under, _mm256_mul_ps(y, pow2))
}

/// [`tanh`] in each of 8 lanes, the same operations in the same order.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tanh8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let one = _mm256_set1_ps(1.0);
    let e = exp8(_mm256_mul_ps(_mm256_set1_ps(2.0), x));
    _mm256_sub_ps(
        one,
        _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, one)),
    )
}

/// [`exp`] in each lane, the same operations in the same order (so the same bits, NaN included:
/// `vmaxps` / `vminps` return their second operand when either is NaN, as `clamp` returns NaN).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn exp16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const MAGIC: f32 = 12_582_912.0;
    let lo = _mm512_set1_ps(-87.3);
    let xc = _mm512_min_ps(_mm512_set1_ps(88.0), _mm512_max_ps(lo, x));
    let magic = _mm512_set1_ps(MAGIC);
    let shifted = _mm512_fmadd_ps(xc, _mm512_set1_ps(LOG2E), magic);
    let n = _mm512_sub_ps(shifted, magic);
    let ni = _mm512_sub_epi32(
        _mm512_castps_si512(shifted),
        _mm512_set1_epi32(MAGIC.to_bits() as i32),
    );
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), xc);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
    let mut y = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
    }
    y = _mm512_fmadd_ps(
        y,
        _mm512_mul_ps(r, r),
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    let pow2 = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_add_epi32(ni, _mm512_set1_epi32(127)),
        23,
    ));
    let under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    _mm512_maskz_mov_ps(!under, _mm512_mul_ps(y, pow2))
}

/// [`tanh`] in each lane, the same operations in the same order.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn tanh16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let one = _mm512_set1_ps(1.0);
    let e = exp16(_mm512_mul_ps(_mm512_set1_ps(2.0), x));
    _mm512_sub_ps(
        one,
        _mm512_div_ps(_mm512_set1_ps(2.0), _mm512_add_ps(e, one)),
    )
}

/// Output elements accumulated in registers at a time (AVX-512 and scalar).
const OUT_CHUNK: usize = 64;

/// Position `d` of the score chains of key lanes `kb..kb + KS`: `acc[n][k] += q[n][d] * kt[d][kb +
/// k]`, one FMA each.
///
/// # Safety
/// `d < hd`, where `kt` holds `hd * KEYS` keys and each `q[n]` `hd` elements, and `kb + KS <=
/// KEYS`; the CPU has `S`'s level.
#[inline(always)]
unsafe fn chain_step<const N: usize, E: Elem, S: Soft, const KS: usize>(
    kt: &[E],
    q: &[&[f32]; N],
    kb: usize,
    d: usize,
    acc: &mut [[f32; KS]; N],
) {
    // SAFETY: the `KS` elements at `d * KEYS + kb` lie within `kt` (the caller's contract).
    let col = unsafe { &*kt.as_ptr().add(d * KEYS + kb).cast::<[E; KS]>() };
    // SAFETY: the caller's CPU has `S`'s level.
    let col = unsafe { E::widen::<S, KS>(col) };
    for n in 0..N {
        // SAFETY: `d < hd == q[n].len()`.
        let qd = unsafe { *q[n].get_unchecked(d) };
        for k in 0..KS {
            acc[n][k] = qd.mul_add(col[k], acc[n][k]);
        }
    }
}

/// The block kernel: `KS` key lanes of the scores and `OC` output elements are kept in registers
/// at a time (sized to the level's register file). Neither changes any element's operations or
/// their order, only which elements are computed together.
#[inline(always)]
fn block_body<const N: usize, E: Elem, S: Soft, const KS: usize, const OC: usize>(
    src: Scores<N, E>,
    vals: Vals<E>,
    live: Range<usize>,
    scale: Scale,
    mut state: [&mut [f32]; N],
) {
    let hdv = state[0].len() - 2;
    let (ks, kc) = (live.start, live.end);
    let (vx, vs) = (vals.x, vals.stride);
    assert!(ks < kc && kc <= KEYS && vs >= hdv && vx.len() >= (kc - 1) * vs + hdv);
    assert!(state.iter().all(|st| st.len() == hdv + 2));
    // The queries' raw scores, row `n` at `rows + n * KEYS`. Not zeroed up front (a `memset` per
    // call, ~1% of a prefill at depth): every lane is written before `s` is read, by the copy of
    // given scores, by the level's score block, or by the chains of a live group of `KS` lanes
    // and zeros for the dead ones.
    let mut s_rows = [const { Uninit::uninit() }; N];
    // The next block's lines, a share per step of the key chains and of the value chains.
    let src_pf = match src {
        Scores::Keys { pf, .. } => pf,
        Scores::Given(_) => None,
    };
    let mut pf = src_pf.map(Cell::get);
    match src {
        Scores::Keys { kt, q, .. } => {
            let hd = q[0].len();
            assert!(kt.len() == hd * KEYS && q.iter().all(|q| q.len() == hd));
            const { assert!(KEYS.is_multiple_of(KS)) };
            // SAFETY: `kt` and `q` have the lengths asserted above; `S` is the caller's level.
            let done = unsafe { S::score_block::<N, E>(kt, &q, &mut s_rows, &mut pf) };
            let rows = s_rows.as_mut_ptr().cast::<f32>();
            // For each key lane, one FMA chain over the head dimension in order; the groups of
            // `KS` lanes with no live key are not computed (their scores are never read) and
            // hold zeros.
            if !done {
                for kb in (0..KEYS).step_by(KS) {
                    if kb + KS <= ks || kb >= kc {
                        for n in 0..N {
                            // SAFETY: lanes `kb..kb + KS <= KEYS` of row `n < N`.
                            unsafe { std::ptr::write_bytes(rows.add(n * KEYS + kb), 0, KS) };
                        }
                        continue;
                    }
                    // A local array the compiler keeps in registers through the chain.
                    let mut acc = [[0f32; KS]; N];
                    // The prefetch step and the bounds once per `EVERY` positions, not per
                    // position: with 8 accumulators (AVX2) the per-position bookkeeping held the
                    // FMAs back. Whole steps of a constant `EVERY` positions, then the rest: an
                    // inner loop of variable length (`min(hd)`) kept the accumulators in two sets
                    // of registers, copied from one to the other at every position (7 moves per 8
                    // FMAs on AVX2; Zen 1 issues such a loop ~30% slower).
                    let mut d0 = 0;
                    while d0 + Prefetch::EVERY <= hd {
                        if let Some(pf) = &mut pf {
                            pf.step();
                        }
                        for d in d0..d0 + Prefetch::EVERY {
                            // SAFETY: `d < hd`; `kb + KS <= KEYS` (`kb` is a multiple of
                            // `KS`, which divides `KEYS`, below `kc <= KEYS`); `kt` and `q`
                            // have the lengths asserted above; `S` is the caller's kernel
                            // level, which the CPU has.
                            unsafe { chain_step::<N, E, S, KS>(kt, &q, kb, d, &mut acc) };
                        }
                        d0 += Prefetch::EVERY;
                    }
                    if d0 < hd {
                        if let Some(pf) = &mut pf {
                            pf.step();
                        }
                        for d in d0..hd {
                            // SAFETY: as above.
                            unsafe { chain_step::<N, E, S, KS>(kt, &q, kb, d, &mut acc) };
                        }
                    }
                    for (n, acc) in acc.iter().enumerate() {
                        // SAFETY: lanes `kb..kb + KS <= KEYS` of row `n < N`.
                        unsafe { rows.add(n * KEYS + kb).cast::<[f32; KS]>().write(*acc) };
                    }
                }
            }
        }
        Scores::Given(g) => {
            for (row, g) in s_rows.iter_mut().zip(g) {
                row.write(*g);
            }
        }
    }
    // SAFETY: every lane of every row is written above (`MaybeUninit<[f32; KEYS]>` has the
    // layout of `[f32; KEYS]`).
    let s = unsafe { &mut *s_rows.as_mut_ptr().cast::<[[f32; KEYS]; N]>() };
    // The block's weights, every lane written by `exp_sum` before they are read.
    let mut p_rows = [const { Uninit::uninit() }; N];
    let mut alpha = [0f32; N];
    for n in 0..N {
        // SAFETY: `S` is the caller's kernel level, which the CPU has.
        let bmax = unsafe { S::scale_max(&mut s[n], ks, kc, scale) };
        let st = &state[n];
        let (m, sum) = (st[hdv], st[hdv + 1]);
        let m_new = m.max(bmax);
        alpha[n] = exp(m - m_new);
        // SAFETY: as above.
        // The block's sum in lanes (a serial sum over the keys was one add latency per key).
        // SAFETY: as above.
        let bsum = unsafe { S::exp_sum(&s[n], ks, kc, m_new, &mut p_rows[n]) };
        let st = &mut *state[n];
        st[hdv] = m_new;
        st[hdv + 1] = sum.mul_add(alpha[n], bsum);
    }
    // SAFETY: `exp_sum` wrote every lane of every row.
    let p = unsafe { &*p_rows.as_ptr().cast::<[[f32; KEYS]; N]>() };
    // o = o * alpha + Σ_k p_k v_k, each element's chain over the keys in order.
    // SAFETY: every live row's `hdv` elements end by `(kc - 1) * vs + hdv`, within `vx`, and
    // each state holds `hdv + 2` (asserted above); `S` is the caller's level.
    if unsafe { S::value_block::<N, E>(vx, vs, hdv, ks..kc, p, &alpha, &mut state, &mut pf) } {
        if let (Some(c), Some(pf)) = (src_pf, pf) {
            c.set(pf);
        }
        return;
    }
    let mut e0 = 0;
    while e0 + OC <= hdv {
        let mut acc = [[0f32; OC]; N];
        for n in 0..N {
            acc[n].copy_from_slice(&state[n][e0..e0 + OC]);
            for x in &mut acc[n] {
                *x *= alpha[n];
            }
        }
        // The level's value chains (a prefetch step every `EVERY` keys), or the plain loop
        // after one prefetch step: its steps within the loop over the keys (whole groups of
        // `EVERY`, then the rest) had LLVM assemble six queries' weights lane by lane from the
        // stack (`vinsertps`), SmolLM2's pp512 at depth 1024 626 -> 151 t/s.
        // SAFETY: `e0 + OC <= hdv`, so every live row's chunk ends by `(kc - 1) * vs + hdv`,
        // within `vx` (asserted above); `S` is the caller's level.
        let done =
            unsafe { S::value_chains::<N, E, OC>(&vx[e0..], vs, ks..kc, p, &mut acc, &mut pf) };
        if !done {
            if let Some(pf) = &mut pf {
                pf.step();
            }
            // `k` indexes the values and every query's weights.
            #[allow(clippy::needless_range_loop)]
            for k in ks..kc {
                // SAFETY: `k < kc` and `e0 + OC <= hdv`, so the chunk ends by `(kc - 1) * vs +
                // hdv`, within `vx` (asserted above).
                let v = unsafe { &*vx.as_ptr().add(k * vs + e0).cast::<[E; OC]>() };
                // SAFETY: as above.
                let v = unsafe { E::widen::<S, OC>(v) };
                for n in 0..N {
                    let pk = p[n][k];
                    for i in 0..OC {
                        acc[n][i] = pk.mul_add(v[i], acc[n][i]);
                    }
                }
            }
        }
        for n in 0..N {
            state[n][e0..e0 + OC].copy_from_slice(&acc[n]);
        }
        e0 += OC;
    }
    for n in 0..N {
        for e in e0..hdv {
            let mut acc = state[n][e] * alpha[n];
            for k in ks..kc {
                acc = p[n][k].mul_add(vx[k * vs + e].f32(), acc);
            }
            state[n][e] = acc;
        }
    }
    if let (Some(c), Some(pf)) = (src_pf, pf) {
        c.set(pf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scores of `q` against transposed keys, in the block kernel's order.
    fn raw_scores(kt: &[f32], q: &[f32]) -> [f32; KEYS] {
        let mut s = [0f32; KEYS];
        for (d, &qd) in q.iter().enumerate() {
            for k in 0..KEYS {
                s[k] = qd.mul_add(kt[d * KEYS + k], s[k]);
            }
        }
        s
    }

    #[test]
    fn block_kernels_agree_bit_for_bit() {
        // Every level, one query or two to six at once, equals the scalar body on one query, bit
        // for bit; head_dim_v 136 has two full output chunks and a tail, 40 only a tail. Live keys
        // from the block's start, and from inside it (a sliding window's first block), within a
        // chunk of 16 lanes and across chunks.
        for (hd, hdv) in [(72, 40), (64, 136)] {
            let kt: Vec<f32> = (0..hd * KEYS).map(|i| ((i as f32) * 0.37).sin()).collect();
            let vals: Vec<f32> = (0..KEYS * hdv).map(|i| ((i as f32) * 0.11).cos()).collect();
            let qs: Vec<Vec<f32>> = (0..6)
                .map(|n| {
                    (0..hd)
                        .map(|i| ((i * (n + 1)) as f32 * 0.7).sin() * 2.0)
                        .collect()
                })
                .collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            // Plain and soft-capped scores (a cap that bites: scaled scores reach ~3).
            let scales = [Scale::new(0.125, None), Scale::new(0.125, Some(0.7))];
            let live = [
                (0, 1),
                (0, 5),
                (0, 17),
                (0, KEYS),
                (3, 5),
                (15, 17),
                (16, 33),
                (40, KEYS),
                (63, KEYS),
            ];
            for (sc, (ks, kc)) in scales.iter().flat_map(|&sc| live.map(|l| (sc, l))) {
                let vals = &vals[..kc * hdv];
                let fresh = || {
                    let mut st = vec![0f32; hdv + 2];
                    st[hdv] = f32::NEG_INFINITY;
                    st
                };
                let want: Vec<Vec<f32>> = qs
                    .iter()
                    .map(|q| {
                        let mut st = fresh();
                        let src = Scores::Keys {
                            kt: &kt,
                            q: [q],
                            pf: None,
                        };
                        block_body::<1, f32, ScalarSoft, KEYS, OUT_CHUNK>(
                            src,
                            Vals::packed(vals, hdv),
                            ks..kc,
                            sc,
                            [&mut st],
                        );
                        block_body::<1, f32, ScalarSoft, KEYS, OUT_CHUNK>(
                            src,
                            Vals::packed(vals, hdv),
                            ks..kc,
                            sc,
                            [&mut st],
                        );
                        st
                    })
                    .collect();
                for level in hearth_quant::simd::available_levels() {
                    let mut got = fresh();
                    let src = Scores::Keys {
                        kt: &kt,
                        q: [&qs[0]],
                        pf: None,
                    };
                    block(level, src, vals, ks..kc, sc, &mut got);
                    block(level, src, vals, ks..kc, sc, &mut got);
                    // The same raw scores given (a quantized cache's path): the same bits.
                    let mut given = fresh();
                    let raw = raw_scores(&kt, &qs[0]);
                    block(level, Scores::Given([&raw]), vals, ks..kc, sc, &mut given);
                    block(level, Scores::Given([&raw]), vals, ks..kc, sc, &mut given);
                    assert_eq!(bits(&given), bits(&want[0]), "given, level {level}");
                    assert_eq!(
                        bits(&got),
                        bits(&want[0]),
                        "level {level}, {sc:?}, keys {ks}..{kc}"
                    );
                    let mut four: Vec<Vec<f32>> = (0..4).map(|_| fresh()).collect();
                    for _ in 0..2 {
                        let q: [&[f32]; 4] = std::array::from_fn(|n| &qs[n][..]);
                        let mut it = four.iter_mut();
                        let st: [&mut [f32]; 4] =
                            std::array::from_fn(|_| &mut it.next().unwrap()[..]);
                        let (src, v) = (
                            Scores::Keys {
                                kt: &kt,
                                q,
                                pf: None,
                            },
                            Vals::packed(vals, hdv),
                        );
                        block_n::<4, f32>(level, src, v, ks..kc, sc, st);
                    }
                    for n in 0..4 {
                        assert_eq!(
                            bits(&four[n]),
                            bits(&want[n]),
                            "level {level}, {sc:?}, keys {ks}..{kc}, {n}"
                        );
                    }
                    // Two, three, five and six at once (GQA groups of 3, 6, ..., and the AVX2
                    // level's runs of six queries across rows), as the task loop runs them.
                    let src = Src {
                        pf: None,
                        kt: &kt,
                        q: &qs.concat(),
                        sc: None,
                        hd,
                        qi: 0,
                    };
                    for m in [2, 3, 5, 6] {
                        let mut st = vec![0f32; 6 * (hdv + 2)];
                        for s in st.chunks_exact_mut(hdv + 2) {
                            s[hdv] = f32::NEG_INFINITY;
                        }
                        for _ in 0..2 {
                            let f = match m {
                                2 => heads::<2, f32>,
                                3 => heads::<3, f32>,
                                5 => heads::<5, f32>,
                                _ => heads::<6, f32>,
                            };
                            let v = Vals::packed(vals, hdv);
                            assert_eq!(f(level, &src, v, ks..kc, sc, &mut st, hdv + 2), m);
                        }
                        for n in 0..m {
                            let got = &st[n * (hdv + 2)..(n + 1) * (hdv + 2)];
                            assert_eq!(bits(got), bits(&want[n]), "{m} at once, level {level}");
                        }
                    }
                }
            }
        }
    }

    /// KV heads per position in [`filled_cache`], and the one the tests read.
    const N_KV: usize = 2;
    const KVH: usize = 1;
    /// Positions [`filled_cache`] stores: a full block and 36 of the next.
    const FILLED: usize = KEYS + 36;

    /// A two-layer cache of `ty` with [`FILLED`] positions stored at layer 1 (sequence 0) for
    /// [`N_KV`] heads of `hd` / `hdv`, and the keys and values stored (`[FILLED, N_KV * hd]`,
    /// `[FILLED, N_KV * hdv]`, before any rounding to f16).
    fn filled_cache(hd: usize, hdv: usize, ty: KvType) -> (KvCache, Vec<f32>, Vec<f32>) {
        let (kd, vd) = (N_KV * hd, N_KV * hdv);
        let kf: Vec<f32> = (0..FILLED * kd)
            .map(|i| ((i as f32) * 0.37).sin())
            .collect();
        let vf: Vec<f32> = (0..FILLED * vd)
            .map(|i| ((i as f32) * 0.11).cos())
            .collect();
        let dims = crate::KvDims {
            n_kv: N_KV,
            head_dim: hd,
            head_dim_v: hdv,
        };
        let mut kv = KvCache::new(1, 2, 2 * KEYS, dims, ty);
        for p in 0..FILLED {
            let (k, v) = (&kf[p * kd..(p + 1) * kd], &vf[p * vd..(p + 1) * vd]);
            kv.store(0, 1, p, k, v);
        }
        (kv, kf, vf)
    }

    #[test]
    fn load_block_reads_what_the_cache_stored() {
        // f16 and f32 caches (keys stored transposed), head dimensions with odd tails, a full
        // block and a partial one: `kt` is each position's key as stored (zeros past the last
        // position), `vals` its value.
        for (hd, hdv) in [(72, 40), (68, 36)] {
            let (kvh, kd, vd) = (KVH, N_KV * hd, N_KV * hdv);
            for ty in [KvType::F16, KvType::F32] {
                let round = |x: f32| match ty {
                    KvType::F16 => f16::from_f32(x).to_f32(),
                    _ => x,
                };
                let (kv, kf, vf) = filled_cache(hd, hdv, ty);
                for (b, kn) in [(0, KEYS), (1, FILLED - KEYS)] {
                    let (keys, values) = kv.block_rows(0, 1, b);
                    let at = KvAt { k0: 0, kn, kvh };
                    let run = |level| {
                        let mut kt = vec![f32::NAN; hd * KEYS];
                        let mut vals = vec![f32::NAN; kn * hdv];
                        load_block(level, &keys, &values, &at, &mut kt, &mut vals, hd, hdv);
                        (kt, vals)
                    };
                    let (kt, vals) = run(Level::Scalar);
                    for level in hearth_quant::simd::available_levels() {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        let (k2, v2) = run(level);
                        assert!(
                            bits(&k2) == bits(&kt) && bits(&v2) == bits(&vals),
                            "{level}"
                        );
                    }
                    for k in 0..KEYS {
                        let p = b * KEYS + k;
                        for d in 0..hd {
                            let want = if k < kn {
                                round(kf[p * kd + kvh * hd + d])
                            } else {
                                0.0
                            };
                            assert_eq!(
                                kt[d * KEYS + k].to_bits(),
                                want.to_bits(),
                                "{ty:?} {p} {d}"
                            );
                        }
                        for e in 0..hdv {
                            if k < kn {
                                let want = round(vf[p * vd + kvh * hdv + e]);
                                assert_eq!(vals[k * hdv + e].to_bits(), want.to_bits());
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn direct_cache_reads_equal_converted_blocks() {
        // Decode's block kernel reading an f16 or f32 cache's rows in place (KV head 1 of 2, so
        // values past the first head's; a full block and a partial one, whose dead key lanes hold whatever the
        // pool has) gives the bits of the block converted into f32 scratch first, at every level,
        // for 1 to 8 query heads (up to two kernel calls) and a live range that starts inside the
        // block; values of 256 for the AVX2 value chains of 64 lanes.
        for (hd, hdv) in [(64, 64), (72, 40), (64, 256)] {
            let kvh = KVH;
            let q: Vec<f32> = (0..8 * hd).map(|i| ((i as f32) * 0.7).sin()).collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for ty in [KvType::F16, KvType::F32] {
                let (kv, _, _) = filled_cache(hd, hdv, ty);
                for ((b, kn), (lo, hpt)) in [(0, KEYS), (1, FILLED - KEYS)]
                    .into_iter()
                    .flat_map(|b| [(0, 1), (0, 3), (5, 4), (70, 2), (0, 8), (5, 6)].map(|x| (b, x)))
                {
                    let k0 = b * KEYS;
                    let (pos, lo, seq) = ([k0 + kn - 1], [lo], [0]);
                    let r = AttnRows {
                        q: &q[..hpt * hd],
                        pos: &pos,
                        lo: &lo,
                        seq: &seq,
                        scale: 0.125,
                        softcap: None,
                    };
                    let (keys, values) = kv.block_rows(0, 1, b);
                    // The kernel reading in place also prefetches the other block as it goes.
                    let (nk, nv) = kv.block_rows(0, 1, 1 - b);
                    let heads = 0..N_KV;
                    let pf = Prefetch::heads(&nk, &nv, heads, (hd, hdv), hd);
                    let pf = Cell::new(pf.expect("f16 and f32 caches"));
                    for level in hearth_quant::simd::available_levels() {
                        let blk = BlockRows {
                            level,
                            r: &r,
                            rows: 0..1,
                            k0,
                            hpt,
                            hd,
                            sw: hdv + 2,
                            scale: Scale::new(0.125, None),
                            q: &q[..hpt * hd],
                            pf: None,
                        };
                        let fresh = || {
                            let mut st = vec![0f32; hpt * (hdv + 2)];
                            for s in st.chunks_exact_mut(hdv + 2) {
                                s[hdv] = f32::NEG_INFINITY;
                            }
                            st
                        };
                        let mut want = fresh();
                        let (mut kt, mut vals) = (vec![0f32; hd * KEYS], vec![0f32; kn * hdv]);
                        let at = KvAt { k0: 0, kn, kvh };
                        load_block(level, &keys, &values, &at, &mut kt, &mut vals, hd, hdv);
                        blk.run(&kt, Vals::packed(&vals, hdv), None, &mut want);
                        let mut got = fresh();
                        let blk = BlockRows {
                            pf: Some(&pf),
                            ..blk
                        };
                        blk.run_in_place(&keys, &values, kvh, hdv, &mut got);
                        assert_eq!(bits(&got), bits(&want), "{ty:?}, {level}, block {b}, {hpt}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_prefetch_covers_its_heads_lines_and_no_others() {
        // Keys `[kvh, hd, KEYS]` and values `[kvh, KEYS, hdv]` as a pool block holds them (f16,
        // offset so that runs start inside lines): every line of the heads' keys, then of their
        // values, in that order, and nothing of the other heads.
        let (hd, hdv, n_kv) = (40, 24, 4);
        let k = vec![f16::ZERO; 3 + n_kv * hd * KEYS];
        let v = vec![f16::ZERO; 5 + n_kv * KEYS * hdv];
        let (k, v) = (&k[3..], &v[5..]);
        let line = |p: *const f16| p as usize / 64;
        for heads in [0..1, 1..3, 0..n_kv, 3..4] {
            let mut want = Vec::new();
            let mut push = |r: std::ops::Range<*const f16>| {
                let (a, b) = (line(r.start), line(r.end.wrapping_sub(1)));
                want.extend(a..=b);
            };
            push(k[heads.start * hd * KEYS..heads.end * hd * KEYS].as_ptr_range());
            push(v[heads.start * KEYS * hdv..heads.end * KEYS * hdv].as_ptr_range());
            let mut pf = Prefetch::of(k, v, heads.clone(), (hd, hdv), 10);
            let mut got = Vec::new();
            while let Some(p) = pf.next_line() {
                got.push(p as usize / 64);
            }
            assert_eq!(got, want, "heads {heads:?}");
            // The steps issue them all.
            assert!(pf.per_step * 10 >= got.len());
        }
    }

    #[test]
    fn block_is_softmax_attention() {
        // Blocks of one query against keys `lo..70` equal a direct softmax-weighted sum (f64):
        // the whole range, windows that start inside the first or the second block, capped scores.
        let (hd, hdv, n) = (16, 8, 70);
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|j| {
                (0..hd)
                    .map(|d| ((j * hd + d) as f32 * 0.29).sin())
                    .collect()
            })
            .collect();
        let vals: Vec<Vec<f32>> = (0..n)
            .map(|j| {
                (0..hdv)
                    .map(|e| ((j * hdv + e) as f32 * 0.13).cos())
                    .collect()
            })
            .collect();
        let q: Vec<f32> = (0..hd).map(|d| (d as f32 * 0.5).cos()).collect();
        let scale = 0.25;
        let cases = [
            (0, None),
            (9, None),
            (64, None),
            (69, None),
            (0, Some(0.5)),
            (9, Some(2.0)),
        ];
        for (lo, cap) in cases {
            let mut state = vec![0f32; hdv + 2];
            state[hdv] = f32::NEG_INFINITY;
            for k0 in (lo / KEYS * KEYS..n).step_by(KEYS) {
                let kc = KEYS.min(n - k0);
                let mut kt = vec![0f32; hd * KEYS];
                let mut vb = vec![0f32; kc * hdv];
                for k in 0..kc {
                    for d in 0..hd {
                        kt[d * KEYS + k] = keys[k0 + k][d];
                    }
                    vb[k * hdv..(k + 1) * hdv].copy_from_slice(&vals[k0 + k]);
                }
                let ks = lo.saturating_sub(k0);
                let level = hearth_quant::kernel_level();
                let src = Scores::Keys {
                    kt: &kt,
                    q: [&q],
                    pf: None,
                };
                block(level, src, &vb, ks..kc, Scale::new(scale, cap), &mut state);
            }
            let scores: Vec<f64> = keys[lo..]
                .iter()
                .map(|k| k.iter().zip(&q).map(|(a, b)| (a * b) as f64).sum::<f64>() * scale as f64)
                .map(|s| cap.map_or(s, |c: f32| c as f64 * (s / c as f64).tanh()))
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let z: f64 = w.iter().sum();
            for e in 0..hdv {
                let want: f64 = (lo..n).map(|j| w[j - lo] * vals[j][e] as f64).sum::<f64>() / z;
                let got = state[e] as f64 / state[hdv + 1] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "lo {lo}, cap {cap:?}, element {e}: {got} vs {want}"
                );
            }
        }
    }
}
