//! A quick table of matrix-product throughput per type and instruction set: the best of many short
//! runs (robust on a loaded machine), single-threaded, cut as the model cuts prefill (calls of 64
//! weight rows x 64 tokens) and decode (one call over all rows, one token).
//!
//! `cargo bench -p hearth-quant --bench prefill_min [-- TYPE...]`; `HEARTH_BENCH_SHAPE=ROWSxCOLS`
//! (default 1536x576, SmolLM2's FFN up) and `HEARTH_BENCH_TOKENS` (default 64) change the shape,
//! `HEARTH_BENCH_REPS=N` runs exactly N repetitions (for callgrind). Prints G multiply-adds per
//! second for prefill and GB/s of weights for decode (from L2 at the default shape; give a shape
//! past the last-level cache, such as 262144x4096 for Q4_K, to read from memory: the Intel Xeon
//! VM's caches held much of a 100 MB matrix). The weights are on transparent huge pages where the
//! OS gives them, as the model's are. Types with an interleaved layout add `prefill-i` and
//! `decode-i`: the same over their rows interleaved (`crate::interleave`).

use hearth_quant::interleave::{can_interleave, interleave};
use hearth_quant::simd::{
    available_isas, quantize_row_at, vec_dot_matrix_at, vec_dot_matrix_interleaved_at, Isa, Level,
    Rows,
};
use hearth_quant::{has_vec_dot, vec_dot_type, GgmlType, ALL_TYPES};
use std::hint::black_box;
use std::time::{Duration, Instant};

mod common;
use common::Rng;

const ROWS_PER_CALL: usize = 64;
const TOKENS_PER_CALL: usize = 64;

fn shape() -> (usize, usize) {
    std::env::var("HEARTH_BENCH_SHAPE")
        .ok()
        .and_then(|v| {
            let (r, c) = v.split_once('x')?;
            Some((r.parse().ok()?, c.parse().ok()?))
        })
        .unwrap_or((1536, 576))
}

fn tokens() -> usize {
    std::env::var("HEARTH_BENCH_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Best time of `f` over ~`budget` of repetitions (or exactly `HEARTH_BENCH_REPS` of them, for
/// instruction counts under callgrind).
fn best(budget: Duration, mut f: impl FnMut()) -> Duration {
    let fixed: Option<usize> = std::env::var("HEARTH_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok());
    let start = Instant::now();
    let mut best = Duration::MAX;
    let mut reps = 0;
    while fixed.map_or(
        reps < 3 || (start.elapsed() < budget && reps < 10_000),
        |n| reps < n,
    ) {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
        reps += 1;
    }
    best
}

/// `bytes` in anonymous memory advised onto transparent huge pages (Linux), as the model reads its
/// weights (`hearth_gguf::Gguf::open_resident`): from memory, a kernel on 4 KiB pages also pays a
/// TLB miss every 4 KiB, which decode does not (65536 x 2048, one thread, AVX-512, 8 tokens of
/// interleaved Q4_1: 79-87 -> 97 G multiply-adds/s).
fn on_huge_pages(bytes: impl Iterator<Item = u8>, len: usize) -> memmap2::MmapMut {
    let mut m = memmap2::MmapOptions::new()
        .len(len)
        .map_anon()
        .expect("an anonymous map for the weights");
    // Advice only: a kernel without transparent huge pages refuses it.
    #[cfg(target_os = "linux")]
    let _ = m.advise(memmap2::Advice::HugePage);
    for (d, x) in m.iter_mut().zip(bytes) {
        *d = x;
    }
    m
}

#[allow(clippy::too_many_arguments)]
fn product(
    isa: Isa,
    ty: GgmlType,
    cols: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    tokens: usize,
    out: &mut [f32],
    interleaved: bool,
) {
    let wrow = w.len() / rows;
    let arow = a.len() / tokens;
    let vec_dot_matrix_at: fn(Isa, GgmlType, usize, Rows, Rows, &mut [f32], usize) = if interleaved
    {
        vec_dot_matrix_interleaved_at
    } else {
        vec_dot_matrix_at
    };
    if tokens == 1 {
        vec_dot_matrix_at(
            isa,
            ty,
            cols,
            Rows::packed(w, wrow),
            Rows::packed(a, arow),
            out,
            rows,
        );
        return;
    }
    for r0 in (0..rows).step_by(ROWS_PER_CALL) {
        let nr = (rows - r0).min(ROWS_PER_CALL);
        let wr = Rows::packed(&w[r0 * wrow..(r0 + nr) * wrow], wrow);
        for j0 in (0..tokens).step_by(TOKENS_PER_CALL) {
            let k = (tokens - j0).min(TOKENS_PER_CALL);
            let ar = Rows::packed(&a[j0 * arow..(j0 + k) * arow], arow);
            vec_dot_matrix_at(isa, ty, cols, wr, ar, &mut out[j0 * rows + r0..], rows);
        }
    }
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let isas: Vec<Isa> = available_isas()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .collect();
    let (rows, cols) = shape();
    let tok = tokens();
    println!(
        "{rows} rows x {cols} columns, prefill of {tok} tokens: G multiply-adds/s; decode: GB/s"
    );
    print!("{:<8} {:<8}", "type", "shape");
    for i in &isas {
        print!(" {:>9}", i.name());
    }
    println!();
    let mut rng = Rng(5);
    for ty in ALL_TYPES.iter().copied().filter(|&t| has_vec_dot(t)) {
        if !filter.is_empty() && !filter.iter().any(|f| f.eq_ignore_ascii_case(ty.name())) {
            continue;
        }
        if cols % ty.block_size() != 0 {
            continue;
        }
        // At most 256 distinct rows, repeated: big shapes (past the caches, to measure decode from
        // memory) without quantizing all of them.
        let distinct = rows.min(256);
        let x: Vec<f32> = (0..distinct * cols).map(|_| rng.normal() * 0.05).collect();
        let mut block = vec![0u8; ty.row_bytes((distinct * cols) as u64).unwrap() as usize];
        quantize_row_at(Level::Scalar, ty, &x, &mut block).unwrap();
        let len = block.len() / distinct * rows;
        let w = on_huge_pages(block.iter().copied().cycle(), len);
        let aty = vec_dot_type(ty);
        let arow = aty.row_bytes(cols as u64).unwrap() as usize;
        let mut a = vec![0u8; arow * tok];
        for t in 0..tok {
            let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
            quantize_row_at(Level::Scalar, aty, &x, &mut a[t * arow..(t + 1) * arow]).unwrap();
        }
        let mut out = vec![0f32; rows * tok];
        let mut wi = on_huge_pages(w.iter().copied(), w.len());
        let int = can_interleave(ty, rows, cols) && interleave(ty, cols, &mut wi);
        let runs = [
            ("prefill", tok, false),
            ("decode", 1, false),
            ("prefill-i", tok, true),
            ("decode-i", 1, true),
        ];
        for (name, t, i) in runs {
            if i && !int {
                continue;
            }
            let w = if i { &wi } else { &w };
            print!("{:<8} {:<8}", ty.name(), name);
            for &isa in &isas {
                let d = best(Duration::from_millis(700), || {
                    product(isa, ty, cols, w, rows, &a[..t * arow], t, &mut out, i);
                    black_box(&out);
                });
                let v = if t == 1 {
                    w.len() as f64 / d.as_secs_f64() / 1e9
                } else {
                    (rows * cols * t) as f64 / d.as_secs_f64() / 1e9
                };
                print!(" {v:>9.2}");
            }
            println!();
        }
    }
}
