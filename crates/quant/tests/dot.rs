//! Every reference dot product against the f64 dot of the dequantized operands, on seeded random
//! rows: weight rows from our quantizers where we have one, else random valid bytes (and random bytes
//! for every type, which reach bit patterns no quantizer writes).

mod common;

use common::{random_row, Rng};
use hearth_quant::{
    dequantize_row, has_quantizer, has_vec_dot, quantize_row, vec_dot, vec_dot_type, GgmlType,
    ALL_TYPES,
};

fn dequant(ty: GgmlType, row: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, row, &mut out).unwrap();
    out
}

fn quant(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    quantize_row(ty, x, &mut out).unwrap();
    out
}

/// Σ |m_b * s_b| over the Q8_1 blocks of `a` against the Q4_1/Q5_1 blocks of `w`: ggml applies the
/// weight minimum through the activation's f16-rounded block sum `s`, which the dequantized dot does
/// not see, so that term carries up to half an f16 ulp of relative error.
fn q8_1_min_term(ty: GgmlType, w: &[u8], a: &[u8]) -> f64 {
    if vec_dot_type(ty) != GgmlType::Q8_1 {
        return 0.0;
    }
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f64();
    w.chunks_exact(ty.type_size())
        .zip(a.chunks_exact(36))
        .map(|(wb, ab)| (f16(&wb[2..4]) * f16(&ab[2..4])).abs())
        .sum()
}

fn check_dot(ty: GgmlType, n: usize, w: &[u8], x: &[f32], what: &str) {
    let at = vec_dot_type(ty);
    let a = quant(at, x);
    let got = vec_dot(ty, n, w, &a) as f64;
    let (wd, ad) = (dequant(ty, w, n), dequant(at, &a, n));
    let exact: f64 = wd.iter().zip(&ad).map(|(&p, &q)| p as f64 * q as f64).sum();
    let scale: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(&p, &q)| (p as f64 * q as f64).abs())
        .sum();
    let tol = 1e-4 * scale + q8_1_min_term(ty, w, &a) * 2f64.powi(-10) + 1e-30;
    assert!(
        (got - exact).abs() <= tol,
        "{ty} x {at} ({what}): vec_dot {got} vs dequantized {exact} (tolerance {tol})"
    );
}

#[test]
fn every_dot_product_matches_dequantized_dot() {
    let mut rng = Rng(42);
    let mut covered = 0;
    for &ty in ALL_TYPES.iter().filter(|t| has_vec_dot(**t)) {
        for (n, round) in [(256usize, 0), (512, 1), (1024, 2), (256, 3)] {
            let x = rng.normals(n, if round == 3 { 1e-3 } else { 1.0 });
            let w_src = rng.normals(n, 0.05);
            if has_quantizer(ty) {
                check_dot(ty, n, &quant(ty, &w_src), &x, "quantized weights");
            }
            check_dot(ty, n, &random_row(&mut rng, ty, n), &x, "random bytes");
        }
        covered += 1;
    }
    assert_eq!(covered, 15, "weight types with a dot product");
}

#[test]
fn vec_dot_type_pairs_as_ggml() {
    use GgmlType::*;
    for (w, a) in [
        (Q4_0, Q8_0),
        (Q5_0, Q8_0),
        (Q8_0, Q8_0),
        (IQ4_NL, Q8_0),
        (Q4_1, Q8_1),
        (Q5_1, Q8_1),
        (Q2_K, Q8_K),
        (Q3_K, Q8_K),
        (Q4_K, Q8_K),
        (Q5_K, Q8_K),
        (Q6_K, Q8_K),
        (IQ4_XS, Q8_K),
        (F16, F16),
        (BF16, BF16),
        (F32, F32),
    ] {
        assert_eq!(vec_dot_type(w), a, "{w}");
        assert!(has_quantizer(a), "{a} must be quantizable to feed {w}");
    }
}

#[test]
fn zero_activation_gives_zero() {
    let mut rng = Rng(7);
    for &ty in ALL_TYPES.iter().filter(|t| has_vec_dot(**t)) {
        let w = random_row(&mut rng, ty, 256);
        let a = quant(vec_dot_type(ty), &[0.0; 256]);
        assert_eq!(vec_dot(ty, 256, &w, &a), 0.0, "{ty}");
    }
}

#[test]
#[should_panic(expected = "activation row of 238 bytes, expected 272")]
fn vec_dot_panics_on_length_mismatch() {
    let w = vec![0u8; 18 * 8];
    let a = vec![0u8; 34 * 7];
    vec_dot(GgmlType::Q4_0, 256, &w, &a);
}
