//! A quick table of dot throughput (GB/s of weight bytes) per type and level: the best of many
//! short runs, which stays meaningful on a loaded machine where criterion's means wander.
//!
//! `cargo bench -p hearth-quant --bench dot_min [-- TYPE...]`. Shapes as benches/dot.rs: `decode`
//! is 256 rows x 4096 columns against one activation row; `tile8` against 8 rows with
//! `vec_dot_tile_at`, counting each weight byte once (per-token rate = 8x); `mat1` / `mat8` the
//! same products with one `vec_dot_matrix_at` call over all rows; for types with an interleaved
//! layout, `int1` / `int8` the same over the rows interleaved (`vec_dot_matrix_interleaved_at`). `HEARTH_BENCH_ROWS` and
//! `HEARTH_BENCH_COLS` change the shape: a matrix larger than the caches shows how a kernel streams
//! from memory, which decode is bound by.

use hearth_quant::interleave::{can_interleave, interleave};
use hearth_quant::simd::{
    available_isas, quantize_row_at, vec_dot_at, vec_dot_matrix_at, vec_dot_matrix_interleaved_at,
    vec_dot_tile_at, Isa, Level, Rows,
};
use hearth_quant::{has_vec_dot, vec_dot_type, GgmlType, ALL_TYPES};
use std::hint::black_box;
use std::time::{Duration, Instant};

mod common;
use common::Rng;

/// Columns per row: 4096, or `HEARTH_BENCH_COLS` (e.g. 576 for SmolLM2-135M's hidden size, where
/// per-call overhead shows).
fn cols() -> usize {
    std::env::var("HEARTH_BENCH_COLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096)
}
/// Rows: 256, or `HEARTH_BENCH_ROWS` (e.g. 262144 for a matrix far larger than the caches, where
/// the read pattern shows).
fn rows() -> usize {
    std::env::var("HEARTH_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}
const TOKENS: usize = 8;

fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

fn weights(rng: &mut Rng, ty: GgmlType) -> Vec<u8> {
    let cols = cols();
    let bytes = ty.row_bytes((rows() * cols) as u64).unwrap() as usize;
    if ty.block_size() == 1 {
        let x: Vec<f32> = (0..rows() * cols).map(|_| rng.normal()).collect();
        let mut w = vec![0u8; bytes];
        quantize_row_at(Level::Scalar, ty, &x, &mut w).unwrap();
        return w;
    }
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
    for b in w.chunks_exact_mut(ty.type_size()) {
        for &off in f16_fields(ty) {
            let v = half::f16::from_f32(rng.normal() * 0.01);
            b[off..off + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    w
}

/// Best time of one pass over the rows, over ~`budget` of repetitions.
fn best(budget: Duration, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut best = Duration::MAX;
    let mut reps = 0;
    while reps < 3 || (start.elapsed() < budget && reps < 10_000) {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
        reps += 1;
    }
    best
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let levels = available_isas();
    let cols = cols();
    let rows = rows();
    println!("{rows} rows x {cols} columns");
    print!("{:<8} {:<7}", "type", "shape");
    for l in &levels {
        print!(" {:>9}", l.name());
    }
    println!("   (GB/s of weight bytes)");
    let mut rng = Rng(7);
    for ty in ALL_TYPES.iter().copied().filter(|&t| has_vec_dot(t)) {
        if !filter.is_empty() && !filter.iter().any(|f| f.eq_ignore_ascii_case(ty.name())) {
            continue;
        }
        if !cols.is_multiple_of(ty.block_size()) {
            println!(
                "{:<8} skipped: {cols} columns are not whole blocks",
                ty.name()
            );
            continue;
        }
        let w = weights(&mut rng, ty);
        let wrow = w.len() / rows;
        let aty = vec_dot_type(ty);
        let arow = aty.row_bytes(cols as u64).unwrap() as usize;
        let mut acts = vec![0u8; arow * TOKENS];
        for t in 0..TOKENS {
            let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
            quantize_row_at(Level::Scalar, aty, &x, &mut acts[t * arow..(t + 1) * arow]).unwrap();
        }
        let mut out = vec![0.0f32; rows * TOKENS];
        let mut wi = w.clone();
        let interleaved = can_interleave(ty, rows, cols) && interleave(ty, cols, &mut wi);
        let shapes = [
            ("decode", 1),
            ("tile8", TOKENS),
            ("mat1", 1),
            ("mat8", TOKENS),
            ("int1", 1),
            ("int8", TOKENS),
        ];
        for (shape, tokens) in shapes {
            if shape.starts_with("int") && !interleaved {
                continue;
            }
            print!("{:<8} {:<7}", ty.name(), shape);
            for &level in &levels {
                let budget = Duration::from_millis(if level == Isa::Scalar { 300 } else { 600 });
                let t = best(budget, || {
                    if shape.starts_with("mat") || shape.starts_with("int") {
                        type Product = fn(Isa, GgmlType, usize, Rows, Rows, &mut [f32], usize);
                        let (data, product): (&[u8], Product) = if shape.starts_with("int") {
                            (&wi, vec_dot_matrix_interleaved_at)
                        } else {
                            (&w, vec_dot_matrix_at)
                        };
                        let wr = Rows {
                            data,
                            stride: wrow,
                            count: rows,
                        };
                        let ar = Rows {
                            data: &acts,
                            stride: arow,
                            count: tokens,
                        };
                        product(level, ty, cols, wr, ar, &mut out, rows);
                        black_box(&out);
                        return;
                    }
                    for r in 0..rows {
                        let wr = &w[r * wrow..(r + 1) * wrow];
                        if tokens == 1 {
                            out[r] = vec_dot_at(level, ty, cols, wr, &acts[..arow]);
                        } else {
                            let o = &mut out[r * TOKENS..(r + 1) * TOKENS];
                            vec_dot_tile_at(level, ty, cols, wr, &acts, arow, TOKENS, o);
                        }
                    }
                    black_box(&out);
                });
                print!(" {:>9.2}", w.len() as f64 / t.as_secs_f64() / 1e9);
            }
            println!();
        }
    }
}
