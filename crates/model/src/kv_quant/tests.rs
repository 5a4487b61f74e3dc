//! Every kernel level against the scalar twins, bit for bit, and the twins against the formulas.

use super::*;
use crate::test_rng::Rng;
use hearth_quant::simd::available_levels;

const TYPES: [KvQuant; 2] = [KvQuant::Q8_0, KvQuant::Q4_0];

fn stored(level: Level, ty: KvQuant, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(x.len())];
    store_row(level, ty, x, &mut out);
    out
}

/// Rows that probe the rounding: random magnitudes, exact halves (amax 127 makes `id` 1, so
/// `k + 0.5` is a tie), zeros, signed zeros, a lone maximum, subnormals and huge values.
fn probe_rows(rng: &mut Rng) -> Vec<Vec<f32>> {
    let mut rows: Vec<Vec<f32>> = [1e-3, 0.5, 3.0, 70.0, 6e4]
        .iter()
        .map(|&s| rng.row(4 * QK, s))
        .collect();
    let mut ties: Vec<f32> = (0..QK).map(|j| j as f32 - 15.5).collect();
    ties[7] = 127.0;
    ties[20] = -2.5;
    rows.push(
        ties.iter()
            .cloned()
            .chain(ties.iter().map(|x| -x))
            .collect(),
    );
    rows.push(vec![0.0; QK]);
    rows.push(
        (0..QK)
            .map(|j| if j % 2 == 0 { -0.0 } else { 0.0 })
            .collect(),
    );
    let mut lone = vec![0.0; QK];
    lone[31] = -3.0;
    rows.push(lone);
    rows.push((0..QK).map(|j| f32::from_bits(j as u32 + 1)).collect());
    rows.push(rng.row(QK, 3e38));
    rows
}

#[test]
fn q8_0_store_rounds_as_llama_cpp_x86() {
    // amax 127: d = 1, id = 127 / 127 = 1; ties go to even (2.5 -> 2, -2.5 -> -2, 3.5 -> 4),
    // where `roundf` (the reference quantizer) would give 3, -3 and 4.
    let mut x = vec![0.0f32; QK];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 3.5;
    x[4] = 0.4;
    for level in available_levels() {
        let b = stored(level, KvQuant::Q8_0, &x);
        assert_eq!(
            &b[..2],
            &f16::from_f32(1.0).to_bits().to_le_bytes(),
            "{level}"
        );
        assert_eq!(&b[2..7], &[127u8, 2, (-2i8) as u8, 4, 0], "{level}");
    }
    // `127 / amax`, not `1 / (amax / 127)`: the two differ here, and so do the quants.
    let amax = 100.000_01f32;
    let (a, b) = (127.0 / amax, 1.0 / (amax / 127.0));
    assert_ne!(a, b, "the probe must separate the two rules");
    let mut x = vec![0.0f32; QK];
    x[0] = amax;
    for (j, v) in x.iter_mut().enumerate().skip(1) {
        *v = (j as f32 + 0.5) / a;
    }
    let b = stored(Level::Scalar, KvQuant::Q8_0, &x);
    for j in 1..QK {
        assert_eq!(b[2 + j] as i8 as f32, (x[j] * a).round_ties_even(), "{j}");
    }
}

#[test]
fn stores_are_the_same_at_every_level() {
    let mut rng = Rng(0x5EED_0001);
    let mut rows = probe_rows(&mut rng);
    // Non-finite values decide through the order of the maximum and the integer conversion.
    let mut special = rng.row(3 * QK, 1.0);
    special[5] = f32::NAN;
    special[QK + 9] = f32::INFINITY;
    special[2 * QK + 31] = f32::NEG_INFINITY;
    special[2 * QK] = f32::NAN;
    rows.push(special);
    for ty in TYPES {
        for x in &rows {
            let want = stored(Level::Scalar, ty, x);
            if ty == KvQuant::Q4_0 {
                let mut r = vec![<BlockQ4_0 as hearth_quant::Block>::zeroed(); x.len() / QK];
                hearth_quant::quantize_row_q4_0(x, &mut r);
                assert_eq!(hearth_quant::blocks_as_bytes(&r), &want[..]);
            }
            for level in available_levels() {
                assert_eq!(stored(level, ty, x), want, "{ty:?} {level} {:?}", &x[..4]);
            }
        }
    }
}

#[test]
fn q8_0_store_round_trips_within_half_a_step() {
    let mut rng = Rng(0x5EED_0002);
    for x in &probe_rows(&mut rng) {
        let b = stored(Level::Scalar, KvQuant::Q8_0, x);
        let mut y = vec![0f32; x.len()];
        hearth_quant::dequantize_row_q8_0(cast_blocks(&b).unwrap(), &mut y);
        for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            // Only blocks whose scale is a normal f16 (a subnormal or infinite one has fewer bits).
            if !(1e-2..6e4).contains(&amax) {
                continue;
            }
            for (a, b) in xb.iter().zip(yb) {
                // Half a step, plus the scale's f16 rounding over up to 127 steps.
                assert!((a - b).abs() <= amax / 127.0 * 0.5 + amax * 1e-3 + 1e-30);
            }
        }
    }
}

/// `n_kv` heads of `hd` per token, `count` tokens; the rows of head `kvh`.
struct Block {
    bytes: Vec<u8>,
    stride: usize,
    offset: usize,
    floats: Vec<Vec<f32>>, // [count, hd] the head's rows, dequantized
}

fn key_block(
    rng: &mut Rng,
    ty: KvQuant,
    hd: usize,
    n_kv: usize,
    kvh: usize,
    count: usize,
) -> Block {
    let stride = ty.row_bytes(hd * n_kv);
    let mut bytes = vec![0u8; stride * count];
    let mut floats = Vec::new();
    for k in 0..count {
        let x = rng.row(hd * n_kv, 2.0);
        store_row(
            Level::Scalar,
            ty,
            &x,
            &mut bytes[k * stride..(k + 1) * stride],
        );
        let head = &bytes[k * stride + kvh * ty.row_bytes(hd)..][..ty.row_bytes(hd)];
        let mut y = vec![0f32; hd];
        hearth_quant::dequantize_row(ty.ggml(), head, &mut y).unwrap();
        floats.push(y);
    }
    Block {
        bytes,
        stride,
        offset: kvh * ty.row_bytes(hd),
        floats,
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn scores_are_the_same_at_every_level_and_for_any_number_of_queries() {
    let mut rng = Rng(0x5EED_0003);
    for ty in TYPES {
        for hd in [32, 64, 128] {
            for count in [1, 3, 16, 17, 40, KEYS] {
                let blk = key_block(&mut rng, ty, hd, 2, 1, count);
                let keys = KeyRows {
                    ty,
                    data: &blk.bytes[blk.offset..],
                    stride: blk.stride,
                    count,
                };
                let n = 9;
                let qf: Vec<Vec<f32>> = (0..n).map(|_| rng.row(hd, 1.5)).collect();
                let mut q = vec![0u8; n * q8_row_bytes(hd)];
                for (j, x) in qf.iter().enumerate() {
                    let qb = q8_row_bytes(hd);
                    store_row(
                        Level::Scalar,
                        KvQuant::Q8_0,
                        x,
                        &mut q[j * qb..(j + 1) * qb],
                    );
                }
                let mut want = vec![f32::NAN; n * KEYS];
                scores(Level::Scalar, hd, &keys, &q, n, &mut want, &[]);
                for j in 0..n {
                    assert!(want[j * KEYS + count..(j + 1) * KEYS]
                        .iter()
                        .all(|&s| s == 0.0));
                    // The twin computes the formula: the dot of the dequantized rows.
                    let mut qd = vec![0f32; hd];
                    let qb = q8_row_bytes(hd);
                    hearth_quant::dequantize_row(GgmlType::Q8_0, &q[j * qb..(j + 1) * qb], &mut qd)
                        .unwrap();
                    for (k, kf) in blk.floats.iter().enumerate() {
                        let terms = kf.iter().zip(&qd).map(|(a, b)| *a as f64 * *b as f64);
                        let mag: f64 = terms.clone().map(f64::abs).sum();
                        let exact: f64 = terms.sum();
                        let got = want[j * KEYS + k] as f64;
                        assert!((got - exact).abs() <= 1e-6 * mag + 1e-9, "{got} vs {exact}");
                    }
                }
                for level in available_levels() {
                    for m in [1, 2, 3, 4, 5, 8, n] {
                        let mut got = vec![f32::NAN; m * KEYS];
                        // Prefetching the rows themselves ahead changes nothing.
                        let ahead = [Ahead {
                            rows: keys,
                            bytes: ty.row_bytes(hd),
                        }];
                        scores(level, hd, &keys, &q, m, &mut got, &ahead[..m % 2]);
                        assert_eq!(
                            bits(&got),
                            bits(&want[..m * KEYS]),
                            "{ty:?} {level} hd {hd} count {count} queries {m}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn values_are_exact_at_every_level() {
    let mut rng = Rng(0x5EED_0004);
    for ty in TYPES {
        for hdv in [32, 64, 96] {
            for count in [1, 5, KEYS] {
                let blk = key_block(&mut rng, ty, hdv, 3, 2, count);
                let vals = ValueRows {
                    ty,
                    data: &blk.bytes[blk.offset..],
                    stride: blk.stride,
                    count,
                };
                let want: Vec<f32> = blk.floats.concat();
                for level in available_levels() {
                    let mut got = vec![f32::NAN; count * hdv];
                    values(level, hdv, &vals, &mut got);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{ty:?} {level} hdv {hdv} count {count}"
                    );
                }
            }
        }
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn stores_match_llama_cpp_cpu_quantizers() {
    // llama.cpp's own `quantize_row_q8_0` (x86) and `quantize_row_q4_0` on probing rows (see
    // tools/gen_kv_quant_vectors.py): the bytes a llama.cpp KV cache holds for the same f32 row.
    let mut n_rows = 0;
    for line in include_str!("llama_cpp.txt").lines() {
        if line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(' ').collect();
        let ty = match f[0] {
            "Q8_0" => KvQuant::Q8_0,
            "Q4_0" => KvQuant::Q4_0,
            t => panic!("type {t}"),
        };
        let n: usize = f[1].parse().unwrap();
        let x: Vec<f32> = unhex(f[2])
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(x.len(), n);
        let want = unhex(f[3]);
        for level in available_levels() {
            assert_eq!(stored(level, ty, &x), want, "{ty:?} {level} row {n_rows}");
        }
        n_rows += 1;
    }
    assert!(n_rows >= 40);
}

/// Attention at depth, f16 against the quantized caches: one decode row (and one prefill task of
/// 16 rows) over `HEARTH_BENCH_DEPTH` (default 4096) cached positions of SmolLM2's shape (9 heads
/// of 64 over 3 KV heads), the types alternated and the median of each reported. Each timed
/// call runs every one of `HEARTH_BENCH_LAYERS` layers (default 1; SmolLM2 has 30, whose cache
/// at depth 4096 does not fit the caches, as in a decode step), on `HEARTH_BENCH_THREADS`
/// threads (default 2). `HEARTH_SMOLLM2` may name another model file for its shape;
/// `HEARTH_BENCH_KVH=k` gives that shape `k` KV heads (the same query heads per KV head and head
/// sizes: value rows of another stride, e.g. the Qwen3-MoE shape's 8 query heads over 1 or 8).
/// Run: `cargo test --release -p hearth-model --lib bench_attention -- --ignored --nocapture`
/// (`HEARTH_KERNELS=avx2` for the AVX2 path, e.g. under callgrind, which has no AVX-512).
#[test]
#[ignore]
fn bench_attention_at_depth() {
    use crate::attention::{attend, AttnRows, AttnScratch};
    use crate::{Config, KvCache, KvType, ThreadPool};
    let path = std::env::var("HEARTH_SMOLLM2").unwrap_or_else(|_| {
        format!(
            "{}/../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let model = crate::Model::open(&path).expect("scripts/fetch-model smollm2");
    let mut cfg: Config = model.config.clone();
    if let Ok(k) = std::env::var("HEARTH_BENCH_KVH") {
        let k: usize = k.parse().unwrap();
        cfg.n_head = cfg.n_head / cfg.n_head_kv * k;
        cfg.n_head_kv = k;
    }
    let c: &Config = &cfg;
    let depth: usize = std::env::var("HEARTH_BENCH_DEPTH").map_or(4096, |d| d.parse().unwrap());
    let iters: usize = std::env::var("HEARTH_BENCH_ITERS").map_or(20, |d| d.parse().unwrap());
    let layers: usize = std::env::var("HEARTH_BENCH_LAYERS").map_or(1, |d| d.parse().unwrap());
    let (kd, vd) = (c.k_dim(), c.v_dim());
    let mut rng = Rng(11);
    // `HEARTH_BENCH_KV=q8_0` (a comma list) to run some types only, e.g. one per callgrind run.
    let types: Vec<KvType> = KvType::ALL
        .into_iter()
        .filter(|t| *t != KvType::F32)
        .filter(|t| {
            std::env::var("HEARTH_BENCH_KV").map_or(true, |v| v.split(',').any(|n| n == t.name()))
        })
        .collect();
    // `HEARTH_BENCH_ROWS=1` (a comma list) to time some row counts only.
    let row_counts: Vec<usize> = std::env::var("HEARTH_BENCH_ROWS").map_or(vec![1, 16], |v| {
        v.split(',').map(|n| n.parse().unwrap()).collect()
    });
    // Every row's own key is cached too (rows at positions `depth..depth + rows`).
    let len = depth + row_counts.iter().copied().max().unwrap_or(1).max(16);
    let kvs: Vec<KvCache> = types
        .iter()
        .map(|&ty| {
            let mut kv = KvCache::new(1, layers, len, c.kv_dims(), ty);
            let mut rng = Rng(5);
            for p in 0..len {
                let (k, v) = (rng.row(kd, 2.0), rng.row(vd, 1.0));
                for l in 0..layers {
                    kv.store(0, l, p, &k, &v);
                }
            }
            kv
        })
        .collect();
    let threads: usize = std::env::var("HEARTH_BENCH_THREADS").map_or(2, |d| d.parse().unwrap());
    let pool = ThreadPool::new(threads);
    for rows in row_counts {
        let q = rng.row(rows * c.q_dim(), 1.0);
        let pos: Vec<usize> = (0..rows).map(|i| depth + i).collect();
        let (lo, seq) = (vec![0; rows], vec![0; rows]);
        let r = AttnRows {
            q: &q,
            pos: &pos,
            lo: &lo,
            seq: &seq,
            scale: 0.125,
            softcap: None,
        };
        let mut out = vec![0f32; rows * c.n_head * c.head_dim_v];
        let mut blocks = AttnScratch::default();
        let mut times = vec![Vec::new(); types.len()];
        for _ in 0..iters {
            for (i, kv) in kvs.iter().enumerate() {
                let t = std::time::Instant::now();
                for l in 0..layers {
                    attend(&pool, c, kv, l, &r, &mut blocks, &mut out);
                }
                times[i].push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        for (ty, t) in types.iter().zip(&mut times) {
            t.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!(
                "{} rows at depth {depth}, {ty:?} ({}): median {:.0} us, min {:.0} us",
                rows,
                hearth_quant::kernel_level(),
                t[t.len() / 2],
                t[0]
            );
        }
    }
}
