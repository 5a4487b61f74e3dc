//! Dot-product throughput per weight type and kernel level, in bytes of weights per second.
//!
//! - `decode/<TYPE>/<level>`: 256 weight rows of 4096 columns against one activation row (one
//!   `vec_dot` per row), the shape of single-token decode;
//! - `tile8/<TYPE>/<level>`: the same rows against 8 activation rows with `vec_dot_tile_at`
//!   (prefill). Throughput counts each weight byte once, so the per-token rate is 8 times it.
//!
//! Run `cargo bench -p hearth-quant --bench dot -- Q4_K` to filter. Levels the CPU lacks are skipped.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hearth_quant::simd::{available_levels, quantize_row_at, vec_dot_at, vec_dot_tile_at, Level};
use hearth_quant::{has_vec_dot, vec_dot_type, GgmlType, ALL_TYPES};
use std::time::Duration;

mod common;
use common::Rng;

const COLS: usize = 4096;
const ROWS: usize = 256;
const TOKENS: usize = 8;

/// Byte offsets of f16 scales in a block, set to small finite values so no row is NaN/inf.
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
    let bytes = ty.row_bytes((ROWS * COLS) as u64).unwrap() as usize;
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let x: Vec<f32> = (0..ROWS * COLS).map(|_| rng.normal()).collect();
            let mut w = vec![0u8; bytes];
            quantize_row_at(Level::Scalar, ty, &x, &mut w).unwrap();
            w
        }
        _ => {
            let mut w: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
            for b in w.chunks_exact_mut(ty.type_size()) {
                for &off in f16_fields(ty) {
                    let v = half::f16::from_f32(rng.normal() * 0.01);
                    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            w
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut rng = Rng(7);
    for ty in ALL_TYPES.iter().copied().filter(|&t| has_vec_dot(t)) {
        let w = weights(&mut rng, ty);
        let wrow = w.len() / ROWS;
        let aty = vec_dot_type(ty);
        let arow = aty.row_bytes(COLS as u64).unwrap() as usize;
        let mut acts = vec![0u8; arow * TOKENS];
        for t in 0..TOKENS {
            let x: Vec<f32> = (0..COLS).map(|_| rng.normal()).collect();
            quantize_row_at(Level::Scalar, aty, &x, &mut acts[t * arow..(t + 1) * arow]).unwrap();
        }
        let mut out = vec![0.0f32; ROWS * TOKENS];
        for (shape, tokens) in [("decode", 1), ("tile8", TOKENS)] {
            let mut g = c.benchmark_group(format!("{shape}/{}", ty.name()));
            g.throughput(Throughput::Bytes(w.len() as u64));
            g.sample_size(10);
            g.warm_up_time(Duration::from_millis(300));
            g.measurement_time(Duration::from_millis(1200));
            for level in available_levels() {
                g.bench_function(BenchmarkId::from_parameter(level.name()), |b| {
                    b.iter(|| {
                        for r in 0..ROWS {
                            let wr = &w[r * wrow..(r + 1) * wrow];
                            if tokens == 1 {
                                out[r] = vec_dot_at(level, ty, COLS, wr, &acts[..arow]);
                            } else {
                                let o = &mut out[r * TOKENS..(r + 1) * TOKENS];
                                vec_dot_tile_at(level, ty, COLS, wr, &acts, arow, TOKENS, o);
                            }
                        }
                        black_box(&out);
                    })
                });
            }
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
