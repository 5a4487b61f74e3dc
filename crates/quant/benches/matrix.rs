//! Matrix products shaped as the model calls them, single-threaded, at the run-time kernel level.
//!
//! Every product is cut like `hearth-model`'s dense matmul: one `vec_dot_matrix` call per block of
//! 16 weight rows and 64 tokens, written into a `[tokens, rows]` buffer.
//!
//! - `prefill/<TYPE>/<rows>x<cols>/t<tokens>`: throughput in multiply-adds (elements) per second;
//! - `call/<TYPE>/16x<cols>/t64`: a single call, the unit of work of one model task;
//! - `decode/<TYPE>/<rows>x<cols>`: one token, throughput in bytes of weights per second.
//!
//! `cargo bench -p hearth-quant --bench matrix -- Q4_1` filters by name.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hearth_quant::simd::{kernel_isa, quantize_row_at, vec_dot_matrix_at, Isa, Level, Rows};
use hearth_quant::{vec_dot_type, GgmlType};
use std::time::Duration;

mod common;
use common::Rng;

const ROWS_PER_CALL: usize = 16;
const TOKENS_PER_CALL: usize = 64;

/// Weights quantized from random normals (so scales and minimums are realistic).
fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let x: Vec<f32> = (0..rows * cols).map(|_| rng.normal() * 0.05).collect();
    let mut w = vec![0u8; ty.row_bytes((rows * cols) as u64).unwrap() as usize];
    quantize_row_at(Level::Scalar, ty, &x, &mut w).unwrap();
    w
}

fn acts(rng: &mut Rng, ty: GgmlType, tokens: usize, cols: usize) -> Vec<u8> {
    let aty = vec_dot_type(ty);
    let arow = aty.row_bytes(cols as u64).unwrap() as usize;
    let mut a = vec![0u8; arow * tokens];
    for t in 0..tokens {
        let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
        quantize_row_at(Level::Scalar, aty, &x, &mut a[t * arow..(t + 1) * arow]).unwrap();
    }
    a
}

/// The model's dense product: calls of 16 rows x 64 tokens.
#[allow(clippy::too_many_arguments)]
fn product(
    level: Isa,
    ty: GgmlType,
    cols: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    tokens: usize,
    out: &mut [f32],
) {
    let wrow = w.len() / rows;
    let arow = a.len() / tokens;
    let mut buf = [0f32; ROWS_PER_CALL * TOKENS_PER_CALL];
    for r0 in (0..rows).step_by(ROWS_PER_CALL) {
        let nr = (rows - r0).min(ROWS_PER_CALL);
        let wr = Rows::packed(&w[r0 * wrow..(r0 + nr) * wrow], wrow);
        for j0 in (0..tokens).step_by(TOKENS_PER_CALL) {
            let k = (tokens - j0).min(TOKENS_PER_CALL);
            let ar = Rows::packed(&a[j0 * arow..(j0 + k) * arow], arow);
            let o = &mut buf[..(k - 1) * ROWS_PER_CALL + nr];
            vec_dot_matrix_at(level, ty, cols, wr, ar, o, ROWS_PER_CALL);
            for j in 0..k {
                let dst = &mut out[(j0 + j) * rows + r0..(j0 + j) * rows + r0 + nr];
                dst.copy_from_slice(&buf[j * ROWS_PER_CALL..j * ROWS_PER_CALL + nr]);
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    use GgmlType::*;
    let level = kernel_isa();
    let mut rng = Rng(11);
    // (type, [(rows, cols)] for prefill, [(rows, cols)] for decode)
    let legacy: &[(usize, usize)] = &[(576, 576), (1536, 576), (576, 1536)];
    let kq: &[(usize, usize)] = &[(768, 2048), (2048, 768), (2048, 2048)];
    type Case<'a> = (GgmlType, &'a [(usize, usize)], usize);
    let cases: &[Case] = &[
        (Q4_1, legacy, 576),
        (Q8_0, legacy, 576),
        (Q5_0, legacy, 576),
        (Q4_0, legacy, 576),
        (Q4_K, kq, 2048),
        (Q6_K, kq, 2048),
        (Q5_K, kq, 2048),
    ];
    for &(ty, shapes, call_cols) in cases {
        // One model call: 16 rows x 64 tokens.
        {
            let (rows, tokens) = (ROWS_PER_CALL, TOKENS_PER_CALL);
            let w = weights(&mut rng, ty, rows, call_cols);
            let a = acts(&mut rng, ty, tokens, call_cols);
            let mut out = vec![0f32; rows * tokens];
            let mut g = c.benchmark_group(format!("call/{}", ty.name()));
            g.throughput(Throughput::Elements((rows * call_cols * tokens) as u64));
            g.sample_size(20);
            g.warm_up_time(Duration::from_millis(300));
            g.measurement_time(Duration::from_millis(1500));
            g.bench_function(
                BenchmarkId::from_parameter(format!("16x{call_cols}/t64/{level}")),
                |b| {
                    b.iter(|| {
                        product(level, ty, call_cols, &w, rows, &a, tokens, &mut out);
                        black_box(&out);
                    })
                },
            );
            g.finish();
        }
        for &(rows, cols) in shapes {
            let w = weights(&mut rng, ty, rows, cols);
            let a = acts(&mut rng, ty, 64, cols);
            let mut out = vec![0f32; rows * 64];
            let mut g = c.benchmark_group(format!("prefill/{}", ty.name()));
            g.sample_size(10);
            g.warm_up_time(Duration::from_millis(300));
            g.measurement_time(Duration::from_millis(1500));
            for tokens in [32, 64] {
                g.throughput(Throughput::Elements((rows * cols * tokens) as u64));
                g.bench_function(
                    BenchmarkId::from_parameter(format!("{rows}x{cols}/t{tokens}/{level}")),
                    |b| {
                        b.iter(|| {
                            product(level, ty, cols, &w, rows, &a, tokens, &mut out);
                            black_box(&out);
                        })
                    },
                );
            }
            g.finish();
            let mut g = c.benchmark_group(format!("decode/{}", ty.name()));
            g.sample_size(20);
            g.warm_up_time(Duration::from_millis(300));
            g.measurement_time(Duration::from_millis(1500));
            g.throughput(Throughput::Bytes(w.len() as u64));
            g.bench_function(
                BenchmarkId::from_parameter(format!("{rows}x{cols}/{level}")),
                |b| {
                    b.iter(|| {
                        product(level, ty, cols, &w, rows, &a, 1, &mut out);
                        black_box(&out);
                    })
                },
            );
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
