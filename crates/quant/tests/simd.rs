//! SIMD kernels against their scalar twins, at every level this CPU runs.
//!
//! - dots: every weight type, several row lengths, random-byte rows and rows quantized from random
//!   floats, against `Level::Scalar` within `1e-5 * sum|terms| + 1e-6` (integer sums are exact; only
//!   the order of the f32 accumulation differs);
//! - tiles: `vec_dot_tile_at` / `vec_dot_rows_at` bit-identical to `vec_dot_at` at the same level,
//!   for 1..=8 and odd activation counts (batch invariance), and `vec_dot_matrix_at` for ragged
//!   weight-row and token counts around the register-blocked kernels' 8 and 16 rows, groups of 4
//!   tokens and passes of 64;
//! - instruction sets: AVX2, AVX-VNNI and AVX-512 give the same bits for every element (one f32
//!   chain per type), for one token and for many, over several chunks and a ragged one;
//! - quantizers: the SIMD Q8_0 / Q8_1 / Q8_K / F16 quantizers bit-identical to the reference,
//!   including exact rounding ties, zeros, extremes and blocks with NaN or infinities.

mod common;

use common::{extreme_acts, f16_fields, random_row, Rng};
use hearth_quant::simd::{
    available_isas, cpu_level, quantize_row_at, vec_dot_at, vec_dot_matrix_at, vec_dot_rows_at,
    vec_dot_tile_at, Isa, Level, Rows, ALL_ISAS,
};
use hearth_quant::{dequantize_row, has_vec_dot, vec_dot_type, GgmlType, ALL_TYPES};

fn dot_types() -> Vec<GgmlType> {
    ALL_TYPES
        .iter()
        .copied()
        .filter(|&t| has_vec_dot(t))
        .collect()
}

/// SIMD instruction sets to test, with a note for each one the CPU lacks.
fn simd_levels() -> Vec<Isa> {
    for i in ALL_ISAS {
        if !i.supported() {
            println!("note: skipping {i}: this CPU does not run it");
        }
    }
    available_isas()
        .into_iter()
        .filter(|&l| l != Isa::Scalar)
        .collect()
}

fn lengths(ty: GgmlType) -> Vec<usize> {
    match ty.block_size() {
        1 => vec![1, 7, 31, 32, 33, 100, 257, 4096],
        32 => vec![32, 96, 256, 1280, 4096],
        _ => vec![256, 512, 1280, 4096],
    }
}

fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut dst = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    quantize_row_at(Level::Scalar, ty, x, &mut dst).unwrap();
    dst
}

fn dequant(ty: GgmlType, row: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    dequantize_row(ty, row, &mut out).unwrap();
    out
}

/// Activation values: normals with a per-row scale, some outliers and an all-zero stretch.
fn act_floats(rng: &mut Rng, n: usize, variant: usize) -> Vec<f32> {
    let scale = [1.0, 0.02, 30.0][variant % 3];
    let mut x = rng.normals(n, scale);
    if variant % 2 == 1 && n >= 64 {
        x[n / 3] = 40.0 * scale;
        for v in &mut x[..32] {
            *v = 0.0;
        }
    }
    x
}

/// A weight row: random bytes with sane scales (`variant` even) or quantized random floats.
fn weight_row(rng: &mut Rng, ty: GgmlType, n: usize, variant: usize) -> Vec<u8> {
    if variant & 1 == 0 {
        random_row(rng, ty, n)
    } else {
        let x = rng.normals(n, 0.05);
        quantize(ty, &x)
    }
}

/// `sum |w_i a_i|` plus `sum |c_i a_i|` where `c` is the part of the weight that a type with a
/// minimum adds outside the scaled quants (dequantized with the first f16 scale zeroed), so the
/// bound covers the scalar kernel's separate min term.
fn magnitude(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f64 {
    let wd = dequant(ty, w, n);
    let ad = dequant(vec_dot_type(ty), a, n);
    let mut m: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(x, y)| (*x as f64 * *y as f64).abs())
        .sum();
    if let Some(&off) = f16_fields(ty).first() {
        let mut wz = w.to_vec();
        for b in wz.chunks_exact_mut(ty.type_size()) {
            b[off..off + 2].copy_from_slice(&[0, 0]);
        }
        let c = dequant(ty, &wz, n);
        m += c
            .iter()
            .zip(&ad)
            .map(|(x, y)| (*x as f64 * *y as f64).abs())
            .sum::<f64>();
    }
    m
}

#[test]
fn simd_dots_match_scalar_twins() {
    let levels = simd_levels();
    let mut rng = Rng(0x5EED_D075);
    let (mut checked, mut differing) = (0, 0);
    for ty in dot_types() {
        let aty = vec_dot_type(ty);
        for n in lengths(ty) {
            for variant in 0..4 {
                let w = weight_row(&mut rng, ty, n, variant);
                let a = quantize(aty, &act_floats(&mut rng, n, variant));
                let want = vec_dot_at(Level::Scalar, ty, n, &w, &a);
                let tol = 1e-5 * magnitude(ty, n, &w, &a) + 1e-6;
                for &level in &levels {
                    let got = vec_dot_at(level, ty, n, &w, &a);
                    let err = (got as f64 - want as f64).abs();
                    assert!(
                        err <= tol,
                        "{ty} n={n} variant={variant} {level}: {got} vs scalar {want} (err {err:e} > {tol:e})"
                    );
                    checked += 1;
                    differing += (got.to_bits() != want.to_bits()) as usize;
                }
            }
        }
    }
    // Not all equal bit for bit: the SIMD path really ran (its f32 order differs from the twin's).
    println!("{checked} SIMD dots checked against the scalar twins, {differing} not bit-equal");
    assert!(levels.is_empty() || differing > 0);
}

#[test]
fn public_vec_dot_uses_a_level_equal_to_vec_dot_at() {
    let level = hearth_quant::kernel_isa();
    let mut rng = Rng(42);
    for ty in dot_types() {
        let n = 512;
        let w = weight_row(&mut rng, ty, n, 1);
        let a = quantize(vec_dot_type(ty), &act_floats(&mut rng, n, 0));
        let got = hearth_quant::vec_dot(ty, n, &w, &a);
        assert_eq!(
            got.to_bits(),
            vec_dot_at(level, ty, n, &w, &a).to_bits(),
            "{ty} at {level}"
        );
    }
}

#[test]
fn tiles_are_bit_identical_to_single_dots() {
    let mut rng = Rng(0x711E);
    for level in available_isas() {
        for ty in dot_types() {
            let aty = vec_dot_type(ty);
            for &n in &[
                ty.block_size().max(33) / ty.block_size() * ty.block_size(),
                512,
            ] {
                let n = if ty.block_size() == 1 { n + 3 } else { n };
                let row = aty.row_bytes(n as u64).unwrap() as usize;
                let w = weight_row(&mut rng, ty, n, 1);
                for n_acts in (1..=8).chain([11, 13]) {
                    // Padded rows (stride > row) for odd counts, packed ones otherwise.
                    let stride = if n_acts % 2 == 1 { row + 5 } else { row };
                    let mut acts = vec![0u8; stride * n_acts];
                    let mut singles = Vec::new();
                    for j in 0..n_acts {
                        let a = quantize(aty, &act_floats(&mut rng, n, j));
                        acts[j * stride..j * stride + row].copy_from_slice(&a);
                        singles.push(vec_dot_at(level, ty, n, &w, &a));
                    }
                    let mut out = vec![f32::NAN; n_acts];
                    vec_dot_tile_at(level, ty, n, &w, &acts, stride, n_acts, &mut out);
                    let rows: Vec<&[u8]> = (0..n_acts)
                        .map(|j| &acts[j * stride..j * stride + row])
                        .collect();
                    let mut out2 = vec![f32::NAN; n_acts];
                    vec_dot_rows_at(level, ty, n, &w, &rows, &mut out2);
                    for j in 0..n_acts {
                        assert_eq!(
                            out[j].to_bits(),
                            singles[j].to_bits(),
                            "{ty} {level} n={n} tile of {n_acts}, row {j}: {} vs {}",
                            out[j],
                            singles[j]
                        );
                        assert_eq!(out2[j].to_bits(), singles[j].to_bits(), "{ty} {level} rows");
                    }
                }
            }
        }
    }
}

#[test]
fn matrix_is_bit_identical_to_single_dots() {
    let mut rng = Rng(0x3A7);
    for level in available_isas() {
        for ty in dot_types() {
            let aty = vec_dot_type(ty);
            let short = if ty.block_size() == 1 { 77 } else { 512 };
            // Ragged on both sides of the AVX-512 kernel's 16-row registers and 64-token passes, and
            // of the one-token kernels' groups of 4 rows. Rows of 65 super-blocks go past what
            // the AVX2 one-row K-quant kernels keep of the activation on the stack.
            let long = (ty.block_size() == 256).then_some((256 * 65, 3, 1));
            let shapes = [
                (1, 1),
                (3, 1),
                (6, 1),
                (13, 1),
                (5, 7),
                (2, 8),
                (7, 11),
                (17, 3),
                (16, 33),
                (35, 2),
                (3, 47),
                (9, 65),
            ];
            let shapes = shapes.map(|(n_w, n_acts)| (short, n_w, n_acts));
            for (n, n_w, n_acts) in shapes.into_iter().chain(long) {
                let wrow = ty.row_bytes(n as u64).unwrap() as usize;
                let arow = aty.row_bytes(n as u64).unwrap() as usize;
                // Weight rows padded by 3 bytes, activation rows packed.
                let wstride = wrow + 3;
                let mut w = vec![0u8; wstride * n_w];
                for i in 0..n_w {
                    w[i * wstride..i * wstride + wrow]
                        .copy_from_slice(&weight_row(&mut rng, ty, n, i));
                }
                let mut acts = vec![0u8; arow * n_acts];
                for j in 0..n_acts {
                    acts[j * arow..(j + 1) * arow]
                        .copy_from_slice(&quantize(aty, &act_floats(&mut rng, n, j)));
                }
                let out_stride = n_w + 2;
                let mut out = vec![f32::NAN; out_stride * n_acts];
                let wr = Rows {
                    data: &w,
                    stride: wstride,
                    count: n_w,
                };
                vec_dot_matrix_at(
                    level,
                    ty,
                    n,
                    wr,
                    Rows::packed(&acts, arow),
                    &mut out,
                    out_stride,
                );
                for i in 0..n_w {
                    for j in 0..n_acts {
                        let single = vec_dot_at(
                            level,
                            ty,
                            n,
                            &w[i * wstride..i * wstride + wrow],
                            &acts[j * arow..(j + 1) * arow],
                        );
                        assert_eq!(
                            out[j * out_stride + i].to_bits(),
                            single.to_bits(),
                            "{ty} {level} {n_w}x{n_acts} at ({i}, {j})"
                        );
                    }
                }
                // The padding columns are not written.
                for j in 0..n_acts {
                    assert!(
                        out[j * out_stride + n_w].is_nan()
                            && out[j * out_stride + n_w + 1].is_nan()
                    );
                }
            }
        }
    }
}

/// Quants at their extremes against activations at theirs, every product of a block the same sign:
/// the largest partial sums the 8-bit kernels hold in i16 lanes before widening (their bounds are
/// in `simd/ymm/legacy.rs`). Each level's result stays within the scalar twin's tolerance (an i16
/// lane that wrapped would be off by far more), and one token (the decode kernels) gives the same
/// bits as three (the register-blocked ones).
#[test]
fn extreme_quants_stay_exact() {
    for level in available_isas() {
        for ty in dot_types() {
            let aty = vec_dot_type(ty);
            let n = if ty.block_size() == 1 { 64 } else { 512 };
            let (n_w, n_acts) = (9, 3);
            let wrow = ty.row_bytes(n as u64).unwrap() as usize;
            let arow = aty.row_bytes(n as u64).unwrap() as usize;
            for fill in [0xFFu8, 0x80, 0x7F, 0x88, 0x00] {
                if ty.block_size() == 1 {
                    continue;
                }
                let mut w = vec![fill; wrow * n_w];
                for (i, block) in w.chunks_exact_mut(ty.type_size()).enumerate() {
                    for &off in f16_fields(ty) {
                        let v = half::f16::from_f32(if i % 2 == 0 { 0.01 } else { -0.02 });
                        block[off..off + 2].copy_from_slice(&v.to_le_bytes());
                    }
                }
                let mut acts = vec![];
                for j in 0..n_acts {
                    let x = extreme_acts(j, n);
                    acts.extend(quantize(aty, &x));
                }
                let wr = Rows::packed(&w, wrow);
                let mut many = vec![0f32; n_w * n_acts];
                vec_dot_matrix_at(level, ty, n, wr, Rows::packed(&acts, arow), &mut many, n_w);
                for j in 0..n_acts {
                    let a = &acts[j * arow..(j + 1) * arow];
                    let mut one = vec![0f32; n_w];
                    vec_dot_matrix_at(level, ty, n, wr, Rows::packed(a, arow), &mut one, n_w);
                    for i in 0..n_w {
                        let wi = &w[i * wrow..(i + 1) * wrow];
                        let want = vec_dot_at(Level::Scalar, ty, n, wi, a);
                        let tol = 1e-5 * magnitude(ty, n, wi, a) + 1e-6;
                        let got = many[j * n_w + i];
                        assert!(
                            (got as f64 - want as f64).abs() <= tol,
                            "{ty} {level} fill {fill:#x} act {j} row {i}: {got} vs scalar {want}"
                        );
                        assert_eq!(
                            got.to_bits(),
                            one[i].to_bits(),
                            "{ty} {level} fill {fill:#x} act {j} row {i}: one token {} vs three {got}",
                            one[i]
                        );
                    }
                }
            }
        }
    }
}

/// Rows that stress the quantizers: exact ties of `x * id`, zeros, tiny and huge values, a negative
/// extreme, plus plain random rows.
fn quantizer_rows(rng: &mut Rng, n: usize) -> Vec<Vec<f32>> {
    let mut rows = vec![];
    // amax = 127 makes d = 1 (id = 1, Q8_K's iscale = -1): every x.5 is an exact tie.
    let mut ties: Vec<f32> = (0..n)
        .map(|i| ((rng.next_u64() % 253) as f32 - 126.0) + if i % 3 == 0 { 0.5 } else { -0.5 })
        .collect();
    for b in ties.chunks_mut(32) {
        b[7] = if b[0] > 0.0 { 127.0 } else { -127.0 };
    }
    rows.push(ties);
    // Again amax = 127, each value one float either side of a tie `k + 0.5` (or the tie itself),
    // where rounding by adding one half to the value would go wrong (0.49999997 + 0.5 rounds to 1).
    let mut near: Vec<f32> = (0..n)
        .map(|i| {
            let tie = ((rng.next_u64() % 254) as f32 - 127.0) + 0.5;
            let bits = tie.to_bits();
            f32::from_bits(match i % 3 {
                0 => bits - 1,
                1 => bits + 1,
                _ => bits,
            })
        })
        .collect();
    for b in near.chunks_mut(32) {
        b[5] = if b[0] > 0.0 { 127.0 } else { -127.0 };
        b[9] = 0.49999997;
        b[10] = -0.49999997;
        b[11] = 0.5;
    }
    rows.push(near);
    // The same with amax = 63.5 (d = 0.5): x.25 / x.75 are ties in units of d.
    rows.push(
        (0..n)
            .map(|i| {
                if i % 32 == 3 {
                    63.5
                } else {
                    ((rng.next_u64() % 250) as f32 - 125.0) * 0.25 + 0.25
                }
            })
            .collect(),
    );
    let mut zeros = rng.normals(n, 1.0);
    for v in &mut zeros[..n.min(256)] {
        *v = 0.0;
    }
    rows.push(zeros);
    rows.push(rng.normals(n, 1e-30));
    rows.push(rng.normals(n, 1e20));
    let mut neg = rng.normals(n, 1.0);
    neg[n / 2] = -50.0;
    rows.push(neg);
    for s in [1.0, 0.01, 7.0] {
        rows.push(rng.normals(n, s));
    }
    // Non-finite values take the reference path block by block; the rest stays vectorised.
    let mut bad = rng.normals(n, 1.0);
    bad[3] = f32::NAN;
    bad[40] = f32::INFINITY;
    bad[n - 1] = f32::NEG_INFINITY;
    rows.push(bad);
    rows
}

#[test]
fn simd_quantizers_are_bit_identical() {
    let levels = simd_levels();
    let mut rng = Rng(0xC0FFEE);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8_K,
        GgmlType::F16,
    ] {
        for n in [256, 512, 4096] {
            for (r, x) in quantizer_rows(&mut rng, n).iter().enumerate() {
                let want = quantize(ty, x);
                for &level in &levels {
                    let mut got = vec![0u8; want.len()];
                    quantize_row_at(level, ty, x, &mut got).unwrap();
                    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
                        panic!("{ty} {level} n={n} row {r}: first differing byte {i}");
                    }
                }
            }
        }
    }
}

#[test]
fn simd_f16_conversion_handles_specials_and_tails() {
    let levels = simd_levels();
    let specials = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        65504.0,
        65520.0,
        -65536.0,
        1e-8,
        -6.0e-8,
        5.9604645e-8,
        2.9802322e-8,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        f32::MIN_POSITIVE,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffc1_2345),
    ];
    for n in [1, 7, 14, 18, 23, 36] {
        let x: Vec<f32> = specials.iter().cycle().take(n).copied().collect();
        let want = quantize(GgmlType::F16, &x);
        for &level in &levels {
            let mut got = vec![0u8; want.len()];
            quantize_row_at(level, GgmlType::F16, &x, &mut got).unwrap();
            assert_eq!(got, want, "F16 {level} n={n}");
        }
    }
}

#[test]
fn kernel_level_names_round_trip() {
    for l in [Level::Scalar, Level::Avx2, Level::Avx512] {
        assert_eq!(Level::from_name(l.name()), Some(l));
    }
    assert_eq!(Level::from_name("AVX2 "), Some(Level::Avx2));
    assert_eq!(Level::from_name("sse"), None);
    assert!(hearth_quant::kernel_level() <= cpu_level());
    for i in ALL_ISAS {
        assert_eq!(Isa::from_name(i.name()), Some(i));
    }
    assert_eq!(Isa::from_name("AVXVNNI"), Some(Isa::AvxVnni));
    assert_eq!(Isa::AvxVnni.level(), Level::Avx2);
    assert!(hearth_quant::kernel_isa().supported());
}

#[test]
fn every_simd_instruction_set_gives_the_same_bits() {
    // One f32 chain per type, whatever the kernel: AVX2 (maddubs), AVX-VNNI and AVX-512 agree bit
    // for bit on every element, for one token (decode kernels) and for many.
    let isas = simd_levels();
    let mut rng = Rng(0xB175);
    for ty in dot_types() {
        let aty = vec_dot_type(ty);
        // Several chunks of the register-blocked kernels and a ragged last one.
        let n = match ty.block_size() {
            1 => 301,
            32 => 32 * 37,
            _ => 256 * 3,
        };
        let wrow = ty.row_bytes(n as u64).unwrap() as usize;
        let arow = aty.row_bytes(n as u64).unwrap() as usize;
        for (n_w, n_acts) in [(19, 1), (24, 5), (9, 70)] {
            let mut w = vec![0u8; wrow * n_w];
            for i in 0..n_w {
                w[i * wrow..(i + 1) * wrow].copy_from_slice(&weight_row(&mut rng, ty, n, i));
            }
            let mut acts = vec![0u8; arow * n_acts];
            for j in 0..n_acts {
                acts[j * arow..(j + 1) * arow]
                    .copy_from_slice(&quantize(aty, &act_floats(&mut rng, n, j)));
            }
            let mut first: Option<(Isa, Vec<f32>)> = None;
            for &isa in &isas {
                let mut out = vec![f32::NAN; n_w * n_acts];
                vec_dot_matrix_at(
                    isa,
                    ty,
                    n,
                    Rows::packed(&w, wrow),
                    Rows::packed(&acts, arow),
                    &mut out,
                    n_w,
                );
                match &first {
                    None => first = Some((isa, out)),
                    Some((i0, o0)) => {
                        for (e, (x, y)) in out.iter().zip(o0).enumerate() {
                            assert_eq!(
                                x.to_bits(),
                                y.to_bits(),
                                "{ty} {n_w}x{n_acts} element {e}: {isa} {x} vs {i0} {y}"
                            );
                        }
                    }
                }
            }
        }
    }
}
