//! Causal grouped-query attention over the KV cache, tiled for the caches.
//!
//! One task covers a block of up to [`ROWS_PER_TASK`] consecutive batch rows of one sequence and one
//! KV head (with all the query heads that share it, or one of them when there would be too few tasks
//! to keep the threads busy). Keys and values are read in blocks of [`KEYS`] positions, converted to
//! f32 once per task and block and reused by every (row, head) of the task; keys are transposed, so
//! the scores of a query against a whole block are `head_dim` vector FMAs without horizontal sums.
//!
//! Each row attends to its own key range `[lo, pos]` (`lo` is 0 for causal attention over the whole
//! context, `pos + 1 - window` in a sliding-window layer). Each (row, head) runs an online softmax
//! over its range, block by block in blocks aligned at multiples of [`KEYS`], so a block's keys
//! before `lo` are masked and the blocks before it are never loaded: a sliding window costs nothing
//! outside it. An element's operations and their order depend only on that row's query, key range
//! and cache: not on the other rows of the task, the batch, the chunking of a prefill, the thread
//! count or the SIMD level. The arithmetic is f32 with fused multiply-adds (`mul_add`, exactly
//! rounded on every target) and a polynomial `exp`, so the AVX-512, AVX2 and scalar builds of the
//! block kernel agree bit for bit. As llama.cpp's flash attention, Q is rounded to the cache's type
//! for the K·Q products when the cache holds f16.
//!
//! A quantized cache (q8_0, q4_0) takes the same path with the raw scores from
//! [`crate::kv_quant`]: each query quantized to Q8_0 once per task, a block's scores for all of the
//! task's queries in one integer product against the block's K rows, its V rows dequantized to f32;
//! the online softmax and the V accumulation are the f32 code above, unchanged.

use std::cell::RefCell;
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

/// Batch rows of one sequence per task.
const ROWS_PER_TASK: usize = 16;

/// Largest head dimension the attention buffers hold.
pub(crate) const MAX_HEAD_DIM: usize = 512;

/// Per-thread buffers of a task, grown on first use and reused after.
#[derive(Default)]
struct TaskBufs {
    kt: Vec<f32>,    // [head_dim, KEYS] the block's keys, transposed
    vals: Vec<f32>,  // [KEYS, head_dim_v] the block's values
    q: Vec<f32>,     // [rows * heads, head_dim] queries (rounded to the cache type)
    state: Vec<f32>, // [rows * heads, head_dim_v + 2] output accumulator, running max, running sum
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

/// Attention of every row over its own key range `[lo, pos]` of its sequence's cache at layer `l`,
/// written to `out` (`[n, n_head * head_dim_v]`). `blocks` is scratch for the task list.
pub(crate) fn attend(
    pool: &ThreadPool,
    c: &Config,
    kv: &KvCache,
    l: usize,
    r: &AttnRows,
    blocks: &mut Vec<(u32, u32)>,
    out: &mut [f32],
) {
    let n = r.pos.len();
    let (hd, hdv) = (c.head_dim, c.head_dim_v);
    let (qd, od) = (c.q_dim(), c.n_head * hdv);
    let (kd, vd) = (c.k_dim(), c.v_dim());
    let group = c.n_head / c.n_head_kv;
    assert!(hd <= MAX_HEAD_DIM && hdv <= MAX_HEAD_DIM);
    // Runs of consecutive rows of one sequence, cut every ROWS_PER_TASK rows.
    blocks.clear();
    let mut t = 0;
    while t < n {
        let mut e = t + 1;
        while e < n && r.seq[e] == r.seq[t] && e - t < ROWS_PER_TASK {
            e += 1;
        }
        blocks.push((t as u32, e as u32));
        t = e;
    }
    // Split a KV head's query heads over tasks only when there would be fewer tasks than threads
    // otherwise, and no more than that needs: every task converts its KV head's keys and values.
    let mut split = 1;
    while blocks.len() * c.n_head_kv * split < pool.n_threads() && split < group {
        split += 1;
        while !group.is_multiple_of(split) {
            split += 1;
        }
    }
    let hpt = group / split; // query heads per task
    let n_tasks = blocks.len() * c.n_head_kv * split;
    debug_assert!((0..n).all(|t| r.lo[t] <= r.pos[t]));
    let scale = Scale::new(r.scale, r.softcap);
    let blocks = &blocks[..];
    let out = SharedMut::new(&mut out[..n * od]);
    let level = hearth_quant::kernel_level();
    let quant = kv.ty().quant();
    if quant.is_some() {
        assert!(hd.is_multiple_of(kv_quant::QK) && hdv.is_multiple_of(kv_quant::QK));
    }
    let q8b = kv_quant::q8_row_bytes(hd.next_multiple_of(kv_quant::QK));
    pool.run(n_tasks, &|task| {
        // Later blocks of a prefill see more keys: hand them out first.
        let b = blocks.len() - 1 - task / (c.n_head_kv * split);
        let kvh = task / split % c.n_head_kv;
        let h0 = kvh * group + task % split * hpt;
        let (t0, t1) = (blocks[b].0 as usize, blocks[b].1 as usize);
        let s = r.seq[t0];
        let max_len = (t0..t1).map(|t| r.pos[t] + 1).max().unwrap_or(0);
        // The first block any row of the task reads, aligned so a row's blocks do not depend on
        // the other rows.
        let first = (t0..t1).map(|t| r.lo[t]).min().unwrap_or(0) / KEYS * KEYS;
        BUFS.with(|bufs| {
            let bufs = &mut *bufs.borrow_mut();
            let nq = (t1 - t0) * hpt;
            let sw = hdv + 2;
            grow(&mut bufs.kt, hd * KEYS);
            grow(&mut bufs.vals, KEYS * hdv);
            grow(&mut bufs.q, nq * hd);
            grow(&mut bufs.state, nq * sw);
            if quant.is_some() {
                grow(&mut bufs.sc, nq * KEYS);
                if bufs.q8.len() < nq * q8b {
                    bufs.q8.resize(nq * q8b, 0);
                }
            }
            let TaskBufs {
                kt,
                vals,
                q: qs,
                state,
                q8,
                sc,
            } = bufs;
            for (i, t) in (t0..t1).enumerate() {
                for j in 0..hpt {
                    let h = h0 + j;
                    let src = &r.q[t * qd + h * hd..t * qd + (h + 1) * hd];
                    let qi = i * hpt + j;
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
                    let st = &mut state[(i * hpt + j) * sw..][..sw];
                    st.fill(0.0);
                    st[hdv] = f32::NEG_INFINITY;
                }
            }
            for k0 in (first..max_len).step_by(KEYS) {
                let kn = KEYS.min(max_len - k0);
                // One attention block is one pool block: its rows start at the block's first row.
                let (keys, values) = kv.block_rows(s, l, k0 / KEYS);
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
                    // The task's queries against the block's rows of this KV head, all at once.
                    let keys = KeyRows::head(*ty, kb, *ks, hd, kvh, kn);
                    kv_quant::scores(level, hd, &keys, q8, nq, &mut sc[..nq * KEYS]);
                    let vrows = KeyRows::head(*ty, vb, *vs, hdv, kvh, kn);
                    kv_quant::values(level, hdv, &vrows, &mut vals[..kn * hdv]);
                } else {
                    let at = KvAt {
                        k0: 0,
                        kn,
                        kd,
                        vd,
                        kvh,
                    };
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
                }
                for (i, t) in (t0..t1).enumerate() {
                    let (len, lo) = (r.pos[t] + 1, r.lo[t]);
                    if len <= k0 || lo >= k0 + KEYS {
                        continue;
                    }
                    // The row's live keys of the block: `ks..kc`.
                    let (ks, kc) = (lo.saturating_sub(k0), KEYS.min(len - k0));
                    // The row's query heads four at a time (same keys `ks..kc`), then one by one.
                    let mut j = 0;
                    while j < hpt {
                        let qi = i * hpt + j;
                        let (kt, vals) = (&kt[..hd * KEYS], &vals[..kc * hdv]);
                        let scores = |n: usize| -> &[f32; KEYS] {
                            sc[(qi + n) * KEYS..(qi + n + 1) * KEYS]
                                .try_into()
                                .expect("KEYS scores")
                        };
                        if j + 4 <= hpt {
                            let src = if quant.is_some() {
                                Scores::Given(std::array::from_fn(scores))
                            } else {
                                Scores::Keys {
                                    kt,
                                    q: std::array::from_fn(|n| {
                                        &qs[(qi + n) * hd..(qi + n + 1) * hd]
                                    }),
                                }
                            };
                            let mut st = state[qi * sw..(qi + 4) * sw].chunks_exact_mut(sw);
                            let st: [&mut [f32]; 4] =
                                std::array::from_fn(|_| st.next().expect("4 states"));
                            block_n::<4>(level, src, vals, ks..kc, scale, st);
                            j += 4;
                        } else {
                            let src = if quant.is_some() {
                                Scores::Given([scores(0)])
                            } else {
                                Scores::Keys {
                                    kt,
                                    q: [&qs[qi * hd..(qi + 1) * hd]],
                                }
                            };
                            let st = &mut state[qi * sw..(qi + 1) * sw];
                            block_n::<1>(level, src, vals, ks..kc, scale, [st]);
                            j += 1;
                        }
                    }
                }
            }
            for (i, t) in (t0..t1).enumerate() {
                for j in 0..hpt {
                    let st = &state[(i * hpt + j) * sw..][..sw];
                    let inv = 1.0 / st[hdv + 1];
                    // SAFETY: each (row, head) output slice is written by exactly one task.
                    let o = unsafe { out.slice(t * od + (h0 + j) * hdv, hdv) };
                    for (o, x) in o.iter_mut().zip(&st[..hdv]) {
                        *o = x * inv;
                    }
                }
            }
        });
    });
}

/// Where a block of keys and values sits in a layer's cache: positions `k0..k0 + kn`, row widths
/// `kd` (keys) and `vd` (values), KV head `kvh`.
struct KvAt {
    k0: usize,
    kn: usize,
    kd: usize,
    vd: usize,
    kvh: usize,
}

/// A block of the cache as f32: the keys transposed into `kt` (`[hd, KEYS]`, zeros past `kn`) and
/// the values into `vals` (`[kn, hdv]`). Conversion is exact, so every path writes the same bits.
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
    if level == Level::Avx512 {
        // SAFETY: the level is at most what the CPU supports (hearth_quant checks).
        return unsafe { load_block_avx512(keys, values, at, kt, vals, hd, hdv) };
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 {
        // SAFETY: as above.
        return unsafe { load_block_avx2(keys, values, at, kt, vals, hd, hdv) };
    }
    let _ = level;
    let mut row = [0f32; MAX_HEAD_DIM];
    for k in 0..KEYS {
        if k < at.kn {
            to_f32(keys, (at.k0 + k) * at.kd + at.kvh * hd, &mut row[..hd]);
        } else {
            row[..hd].fill(0.0);
        }
        for (d, x) in row[..hd].iter().enumerate() {
            kt[d * KEYS + k] = *x;
        }
    }
    for k in 0..at.kn {
        to_f32(
            values,
            (at.k0 + k) * at.vd + at.kvh * hdv,
            &mut vals[k * hdv..(k + 1) * hdv],
        );
    }
}

/// [`load_block`] with 16 × 16 tiles converted (`vcvtph2ps`) and transposed in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn load_block_avx512(
    keys: &Rows,
    values: &Rows,
    at: &KvAt,
    kt: &mut [f32],
    vals: &mut [f32],
    hd: usize,
    hdv: usize,
) {
    use std::arch::x86_64::*;
    /// 16 elements at `i` as f32 (`i + 16` within the rows).
    #[inline(always)]
    unsafe fn load16(rows: &Rows, i: usize) -> __m512 {
        match rows {
            Rows::F16(x) => {
                let s = &x[i..i + 16];
                _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().cast()))
            }
            Rows::F32(x) => _mm512_loadu_ps(x[i..i + 16].as_ptr()),
            Rows::Quant { .. } => unreachable!("quantized blocks are read by kv_quant"),
        }
    }
    assert!(kt.len() == hd * KEYS && vals.len() >= at.kn * hdv && at.kn <= KEYS);
    let hd16 = hd / 16 * 16;
    for kb in (0..KEYS).step_by(16) {
        for db in (0..hd16).step_by(16) {
            let mut r = [_mm512_setzero_si512(); 16];
            for (i, v) in r.iter_mut().enumerate() {
                if kb + i < at.kn {
                    let off = (at.k0 + kb + i) * at.kd + at.kvh * hd + db;
                    *v = _mm512_castps_si512(load16(keys, off));
                }
            }
            hearth_quant::simd::transpose16x16(&mut r);
            for (j, v) in r.iter().enumerate() {
                let dst = &mut kt[(db + j) * KEYS + kb..][..16];
                _mm512_storeu_ps(dst.as_mut_ptr(), _mm512_castsi512_ps(*v));
            }
        }
        // The dimensions past the last multiple of 16, one by one.
        for d in hd16..hd {
            for k in kb..kb + 16 {
                kt[d * KEYS + k] = if k < at.kn {
                    let mut x = [0f32; 1];
                    to_f32(keys, (at.k0 + k) * at.kd + at.kvh * hd + d, &mut x);
                    x[0]
                } else {
                    0.0
                };
            }
        }
    }
    let hdv16 = hdv / 16 * 16;
    for k in 0..at.kn {
        let src = (at.k0 + k) * at.vd + at.kvh * hdv;
        let dst = &mut vals[k * hdv..(k + 1) * hdv];
        for d in (0..hdv16).step_by(16) {
            _mm512_storeu_ps(dst[d..d + 16].as_mut_ptr(), load16(values, src + d));
        }
        if hdv16 < hdv {
            to_f32(values, src + hdv16, &mut dst[hdv16..]);
        }
    }
}

/// [`load_block`] with 8 × 8 tiles converted (`vcvtph2ps`) and transposed in registers (AVX2).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn load_block_avx2(
    keys: &Rows,
    values: &Rows,
    at: &KvAt,
    kt: &mut [f32],
    vals: &mut [f32],
    hd: usize,
    hdv: usize,
) {
    use std::arch::x86_64::*;
    /// 8 elements at `i` as f32 (`i + 8` within the rows).
    #[inline(always)]
    unsafe fn load8(rows: &Rows, i: usize) -> __m256 {
        match rows {
            Rows::F16(x) => {
                let s = &x[i..i + 8];
                _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast()))
            }
            Rows::F32(x) => _mm256_loadu_ps(x[i..i + 8].as_ptr()),
            Rows::Quant { .. } => unreachable!("quantized blocks are read by kv_quant"),
        }
    }
    /// Rows become columns.
    #[inline(always)]
    unsafe fn transpose8(r: &mut [__m256; 8]) {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        r[0] = _mm256_permute2f128_ps::<0x20>(u0, u4);
        r[1] = _mm256_permute2f128_ps::<0x20>(u1, u5);
        r[2] = _mm256_permute2f128_ps::<0x20>(u2, u6);
        r[3] = _mm256_permute2f128_ps::<0x20>(u3, u7);
        r[4] = _mm256_permute2f128_ps::<0x31>(u0, u4);
        r[5] = _mm256_permute2f128_ps::<0x31>(u1, u5);
        r[6] = _mm256_permute2f128_ps::<0x31>(u2, u6);
        r[7] = _mm256_permute2f128_ps::<0x31>(u3, u7);
    }
    assert!(kt.len() == hd * KEYS && vals.len() >= at.kn * hdv && at.kn <= KEYS);
    let hd8 = hd / 8 * 8;
    for kb in (0..KEYS).step_by(8) {
        for db in (0..hd8).step_by(8) {
            let mut r = [_mm256_setzero_ps(); 8];
            for (i, v) in r.iter_mut().enumerate() {
                if kb + i < at.kn {
                    *v = load8(keys, (at.k0 + kb + i) * at.kd + at.kvh * hd + db);
                }
            }
            transpose8(&mut r);
            for (j, v) in r.iter().enumerate() {
                let dst = &mut kt[(db + j) * KEYS + kb..][..8];
                _mm256_storeu_ps(dst.as_mut_ptr(), *v);
            }
        }
        // The dimensions past the last multiple of 8, one by one.
        for d in hd8..hd {
            for k in kb..kb + 8 {
                kt[d * KEYS + k] = if k < at.kn {
                    let mut x = [0f32; 1];
                    to_f32(keys, (at.k0 + k) * at.kd + at.kvh * hd + d, &mut x);
                    x[0]
                } else {
                    0.0
                };
            }
        }
    }
    let hdv8 = hdv / 8 * 8;
    for k in 0..at.kn {
        let src = (at.k0 + k) * at.vd + at.kvh * hdv;
        let dst = &mut vals[k * hdv..(k + 1) * hdv];
        for d in (0..hdv8).step_by(8) {
            _mm256_storeu_ps(dst[d..d + 8].as_mut_ptr(), load8(values, src + d));
        }
        if hdv8 < hdv {
            to_f32(values, src + hdv8, &mut dst[hdv8..]);
        }
    }
}

/// Elements `at..at + dst.len()` of a cache row set, as f32.
fn to_f32(rows: &Rows, at: usize, dst: &mut [f32]) {
    match rows {
        Rows::F16(x) => x[at..at + dst.len()].convert_to_f32_slice(dst),
        Rows::F32(x) => dst.copy_from_slice(&x[at..at + dst.len()]),
        Rows::Quant { .. } => unreachable!("quantized blocks are read by kv_quant"),
    }
}

/// Where a block's raw scores `q · k` come from, for `N` queries.
#[derive(Clone, Copy)]
enum Scores<'a, const N: usize> {
    /// Computed in the block kernel: each query (`[head_dim]`) against the block's keys
    /// transposed (`kt`: `[head_dim, KEYS]`), one FMA chain per key over the head dimension.
    Keys { kt: &'a [f32], q: [&'a [f32]; N] },
    /// Computed already, one `[KEYS]` vector per query (a quantized cache: [`kv_quant::scores`]).
    Given([&'a [f32; KEYS]; N]),
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
    block_n::<1>(level, src, vals, live, scale, [state])
}

/// [`block`] for `N` queries at once (query heads of one row, so the same keys): every key and
/// value loaded serves the `N` of them. Each query's operations are those of [`block`], in the
/// same order, so the results are the same bits.
fn block_n<const N: usize>(
    level: Level,
    src: Scores<N>,
    vals: &[f32],
    live: Range<usize>,
    scale: Scale,
    state: [&mut [f32]; N],
) {
    #[cfg(target_arch = "x86_64")]
    {
        match level {
            // SAFETY: the level is at most what the CPU supports (hearth_quant checks).
            Level::Avx512 => return unsafe { block_avx512::<N>(src, vals, live, scale, state) },
            Level::Avx2 => return unsafe { block_avx2::<N>(src, vals, live, scale, state) },
            Level::Scalar => {}
        }
    }
    let _ = level;
    block_body::<N, ScalarSoft>(src, vals, live, scale, state)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn block_avx512<const N: usize>(
    src: Scores<N>,
    vals: &[f32],
    live: Range<usize>,
    scale: Scale,
    state: [&mut [f32]; N],
) {
    block_body::<N, Avx512Soft>(src, vals, live, scale, state)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2<const N: usize>(
    src: Scores<N>,
    vals: &[f32],
    live: Range<usize>,
    scale: Scale,
    state: [&mut [f32]; N],
) {
    block_body::<N, ScalarSoft>(src, vals, live, scale, state)
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
    /// `p[k] = exp(s[k] - m)` for every key lane.
    ///
    /// # Safety
    /// As [`Soft::scale_max`].
    unsafe fn exp_shifted(s: &[f32; KEYS], m: f32, p: &mut [f32; KEYS]);
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
    unsafe fn exp_shifted(s: &[f32; KEYS], m: f32, p: &mut [f32; KEYS]) {
        for k in 0..KEYS {
            p[k] = exp(s[k] - m);
        }
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
            let upto: u32 = if hi == 16 { !0 } else { (1 << hi) - 1 };
            let mask = (upto & !((1u32 << lo) - 1)) as __mmask16;
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
    unsafe fn exp_shifted(s: &[f32; KEYS], m: f32, p: &mut [f32; KEYS]) {
        use std::arch::x86_64::*;
        let mv = _mm512_set1_ps(m);
        for c in 0..KEYS / 16 {
            let x = _mm512_sub_ps(_mm512_loadu_ps(s.as_ptr().add(16 * c)), mv);
            _mm512_storeu_ps(p.as_mut_ptr().add(16 * c), exp16(x));
        }
    }
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

/// Output elements accumulated in registers at a time.
const OUT_CHUNK: usize = 64;

#[inline(always)]
fn block_body<const N: usize, S: Soft>(
    src: Scores<N>,
    vals: &[f32],
    live: Range<usize>,
    scale: Scale,
    state: [&mut [f32]; N],
) {
    let hdv = state[0].len() - 2;
    let (ks, kc) = (live.start, live.end);
    assert!(ks < kc && kc <= KEYS && vals.len() == kc * hdv);
    assert!(state.iter().all(|st| st.len() == hdv + 2));
    let mut s = [[0f32; KEYS]; N];
    match src {
        Scores::Keys { kt, q } => {
            let hd = q[0].len();
            assert!(kt.len() == hd * KEYS && q.iter().all(|q| q.len() == hd));
            // For each key lane, one FMA chain over the head dimension in order.
            for d in 0..hd {
                let col: &[f32; KEYS] = kt[d * KEYS..(d + 1) * KEYS].try_into().expect("KEYS wide");
                for n in 0..N {
                    let qd = q[n][d];
                    for k in 0..KEYS {
                        s[n][k] = qd.mul_add(col[k], s[n][k]);
                    }
                }
            }
        }
        Scores::Given(g) => {
            for (s, g) in s.iter_mut().zip(g) {
                *s = *g;
            }
        }
    }
    let mut p = [[0f32; KEYS]; N];
    let mut alpha = [0f32; N];
    for n in 0..N {
        // SAFETY: `S` is the caller's kernel level, which the CPU has.
        let bmax = unsafe { S::scale_max(&mut s[n], ks, kc, scale) };
        let st = &state[n];
        let (m, sum) = (st[hdv], st[hdv + 1]);
        let m_new = m.max(bmax);
        alpha[n] = exp(m - m_new);
        // SAFETY: as above.
        unsafe { S::exp_shifted(&s[n], m_new, &mut p[n]) };
        let mut sum = sum * alpha[n];
        for &x in &p[n][ks..kc] {
            sum += x;
        }
        let st = &mut *state[n];
        st[hdv] = m_new;
        st[hdv + 1] = sum;
    }
    // o = o * alpha + Σ_k p_k v_k, each element's chain over the keys in order.
    let mut e0 = 0;
    while e0 + OUT_CHUNK <= hdv {
        let mut acc = [[0f32; OUT_CHUNK]; N];
        for n in 0..N {
            acc[n].copy_from_slice(&state[n][e0..e0 + OUT_CHUNK]);
            for x in &mut acc[n] {
                *x *= alpha[n];
            }
        }
        for k in ks..kc {
            let v: &[f32; OUT_CHUNK] = vals[k * hdv + e0..k * hdv + e0 + OUT_CHUNK]
                .try_into()
                .expect("chunk");
            for n in 0..N {
                let pk = p[n][k];
                for i in 0..OUT_CHUNK {
                    acc[n][i] = pk.mul_add(v[i], acc[n][i]);
                }
            }
        }
        for n in 0..N {
            state[n][e0..e0 + OUT_CHUNK].copy_from_slice(&acc[n]);
        }
        e0 += OUT_CHUNK;
    }
    for n in 0..N {
        for e in e0..hdv {
            let mut acc = state[n][e] * alpha[n];
            for k in ks..kc {
                acc = p[n][k].mul_add(vals[k * hdv + e], acc);
            }
            state[n][e] = acc;
        }
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
        // Every level, one query or four at once, equals the scalar body on one query, bit for
        // bit; head_dim_v 136 has two full output chunks and a tail, 40 only a tail. Live keys
        // from the block's start, and from inside it (a sliding window's first block), within a
        // chunk of 16 lanes and across chunks.
        for (hd, hdv) in [(72, 40), (64, 136)] {
            let kt: Vec<f32> = (0..hd * KEYS).map(|i| ((i as f32) * 0.37).sin()).collect();
            let vals: Vec<f32> = (0..KEYS * hdv).map(|i| ((i as f32) * 0.11).cos()).collect();
            let qs: Vec<Vec<f32>> = (0..4)
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
                        let src = Scores::Keys { kt: &kt, q: [q] };
                        block_body::<1, ScalarSoft>(src, vals, ks..kc, sc, [&mut st]);
                        block_body::<1, ScalarSoft>(src, vals, ks..kc, sc, [&mut st]);
                        st
                    })
                    .collect();
                for level in hearth_quant::simd::available_levels() {
                    let mut got = fresh();
                    let src = Scores::Keys {
                        kt: &kt,
                        q: [&qs[0]],
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
                        block_n::<4>(level, Scores::Keys { kt: &kt, q }, vals, ks..kc, sc, st);
                    }
                    for n in 0..4 {
                        assert_eq!(
                            bits(&four[n]),
                            bits(&want[n]),
                            "level {level}, {sc:?}, keys {ks}..{kc}, {n}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn load_block_is_the_same_at_every_level() {
        // f16 and f32 caches, head dimensions with tails past 16 and past 8, full and partial
        // blocks.
        for (hd, hdv) in [(72, 40), (68, 36)] {
            load_block_case(hd, hdv);
        }
    }

    fn load_block_case(hd: usize, hdv: usize) {
        let (kvh, n_kv) = (1, 2);
        let (kd, vd) = (n_kv * hd, n_kv * hdv);
        let n = 100;
        let kf: Vec<f32> = (0..n * kd).map(|i| ((i as f32) * 0.37).sin()).collect();
        let vf: Vec<f32> = (0..n * vd).map(|i| ((i as f32) * 0.11).cos()).collect();
        let kh: Vec<f16> = kf.iter().map(|&x| f16::from_f32(x)).collect();
        let vh: Vec<f16> = vf.iter().map(|&x| f16::from_f32(x)).collect();
        let caches = [
            (Rows::F16(&kh), Rows::F16(&vh)),
            (Rows::F32(&kf), Rows::F32(&vf)),
        ];
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (keys, values) in &caches {
            for (k0, kn) in [(0, KEYS), (64, 36), (3, 1)] {
                let at = KvAt {
                    k0,
                    kn,
                    kd,
                    vd,
                    kvh,
                };
                let run = |level| {
                    let mut kt = vec![f32::NAN; hd * KEYS];
                    let mut vals = vec![f32::NAN; kn * hdv];
                    load_block(level, keys, values, &at, &mut kt, &mut vals, hd, hdv);
                    (bits(&kt), bits(&vals))
                };
                let want = run(Level::Scalar);
                for level in hearth_quant::simd::available_levels() {
                    assert!(run(level) == want, "level {level}, block at {k0} of {kn}");
                }
            }
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
                let src = Scores::Keys { kt: &kt, q: [&q] };
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
