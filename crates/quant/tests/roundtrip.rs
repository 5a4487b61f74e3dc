//! Quantizers without a gguf-py twin (Q8_1, Q8_K) and properties of all of them: quantize then
//! dequantize stays within the format's step, zeros stay zeros, constant rows stay (nearly) constant;
//! plus the API's typed errors and reading blocks at odd addresses.

mod common;

use common::Rng;
use hearth_quant::{
    cast_blocks, dequantize_row, has_quantizer, quantize_row, BlockQ8K, BlockQ8_1, GgmlType,
    QuantError, ALL_TYPES,
};

fn roundtrip(ty: GgmlType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut q = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    quantize_row(ty, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut y).unwrap();
    (q, y)
}

fn f16(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

#[test]
fn q8_1_within_half_a_step_and_sums_consistent() {
    let mut rng = Rng(1);
    for scale in [1.0f32, 1e-3, 100.0] {
        let x = rng.normals(1024, scale);
        let (q, y) = roundtrip(GgmlType::Q8_1, &x);
        for (b, (xb, yb)) in cast_blocks::<BlockQ8_1>(&q)
            .unwrap()
            .iter()
            .zip(x.chunks(32).zip(y.chunks(32)))
        {
            let (d, d32) = (f16(&b.d), d_f32(xb));
            // Quants are rounded against the f32 scale and read back with its f16 rounding: half a
            // step plus that rounding times |q| <= 127 (large for f16 subnormal scales).
            let bound = (d32 * 0.5 + 127.0 * (d - d32).abs()) * (1.0 + 1e-5) + 1e-30;
            for (a, c) in xb.iter().zip(yb) {
                assert!((a - c).abs() <= bound, "Q8_1 {a} -> {c} (d {d})");
            }
            let sum: i32 = b.qs.iter().map(|&v| v as i32).sum();
            assert_eq!(
                b.s,
                half::f16::from_f32(sum as f32 * d_f32(xb)).to_le_bytes()
            );
        }
    }
}

/// The unrounded Q8 scale of a block, `amax / 127`.
fn d_f32(xb: &[f32]) -> f32 {
    xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0
}

#[test]
fn q8_k_within_half_a_step_and_bsums_consistent() {
    let mut rng = Rng(2);
    for scale in [1.0f32, 1e-3, 100.0] {
        let x = rng.normals(1024, scale);
        let (q, y) = roundtrip(GgmlType::Q8_K, &x);
        for (b, (xb, yb)) in cast_blocks::<BlockQ8K>(&q)
            .unwrap()
            .iter()
            .zip(x.chunks(256).zip(y.chunks(256)))
        {
            let d = b.d().abs();
            for (a, c) in xb.iter().zip(yb) {
                assert!(
                    (a - c).abs() <= d * 0.5 * (1.0 + 1e-5),
                    "Q8_K {a} -> {c} (d {d})"
                );
            }
            for j in 0..16 {
                let s: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&v| v as i32).sum();
                assert_eq!(b.bsum(j) as i32, s);
            }
            // The largest element maps to exactly +-127.
            assert_eq!(b.qs.iter().map(|v| v.unsigned_abs()).max(), Some(127));
        }
    }
}

/// Relative RMSE bounds on N(0, 1) rows: a little above what each format achieves, far below what a
/// wrong scale or layout produces.
#[test]
fn rmse_within_format_bounds() {
    let bounds = [
        (GgmlType::Q4_0, 0.10),
        (GgmlType::Q4_1, 0.09),
        (GgmlType::Q5_0, 0.05),
        (GgmlType::Q5_1, 0.045),
        (GgmlType::Q8_0, 0.006),
        (GgmlType::Q8_1, 0.006),
        (GgmlType::Q8_K, 0.008),
        (GgmlType::Q2_K, 0.32),
        (GgmlType::Q3_K, 0.17),
        (GgmlType::Q4_K, 0.08),
        (GgmlType::Q5_K, 0.042),
        (GgmlType::Q6_K, 0.021),
        (GgmlType::IQ4_NL, 0.085),
        (GgmlType::IQ4_XS, 0.085),
        (GgmlType::F16, 0.0005),
        (GgmlType::BF16, 0.003),
        (GgmlType::F32, 0.0),
    ];
    let mut rng = Rng(3);
    let x = rng.normals(4096, 1.0);
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
    for (ty, bound) in bounds {
        let (_, y) = roundtrip(ty, &x);
        let rmse = (x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            / x.len() as f32)
            .sqrt();
        eprintln!("{ty}: relative rmse {:.4}", rmse / rms);
        assert!(
            rmse / rms <= bound,
            "{ty}: relative rmse {} above {bound}",
            rmse / rms
        );
    }
}

#[test]
fn zeros_and_constant_rows() {
    for &ty in ALL_TYPES.iter().filter(|t| has_quantizer(**t)) {
        let (_, y) = roundtrip(ty, &[0.0; 512]);
        assert!(y.iter().all(|&v| v == 0.0), "{ty}: zeros do not round-trip");
        // Tiny constants lose more: the super-block scales are f16 and go subnormal.
        for (c, tol) in [(1.0f32, 0.01), (-0.37, 0.01), (1e-3, 0.05)] {
            let (_, y) = roundtrip(ty, &[c; 512]);
            for &v in &y {
                assert!(
                    (v - c).abs() <= c.abs() * tol,
                    "{ty}: constant {c} came back as {v}"
                );
            }
        }
    }
}

#[test]
fn typed_errors() {
    let mut out = [0f32; 256];
    for ty in [
        GgmlType::IQ2_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ1_M,
        GgmlType::TQ1_0,
        GgmlType::MXFP4,
        GgmlType::I8,
        GgmlType::F64,
        GgmlType::Q1_0,
    ] {
        assert_eq!(
            dequantize_row(ty, &[], &mut out),
            Err(QuantError::Unsupported(ty))
        );
        assert!(dequantize_row(ty, &[], &mut out)
            .unwrap_err()
            .to_string()
            .contains(ty.name()));
    }
    let mut dst = [0u8; 74];
    assert_eq!(
        quantize_row(GgmlType::IQ2_XS, &[0.0; 256], &mut dst),
        Err(QuantError::NoQuantizer(GgmlType::IQ2_XS))
    );
    assert_eq!(
        dequantize_row(GgmlType::Q4_K, &[0u8; 143], &mut out),
        Err(QuantError::BadLength {
            ty: GgmlType::Q4_K,
            expected: 144,
            got: 143,
            what: "source row"
        })
    );
    assert!(matches!(
        dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut out[..31]),
        Err(QuantError::PartialBlock { .. })
    ));
    assert!(matches!(
        quantize_row(GgmlType::Q8_0, &[0.0; 32], &mut [0u8; 33]),
        Err(QuantError::BadLength { .. })
    ));
}

#[test]
fn huge_row_lengths_are_errors() {
    assert_eq!(
        hearth_quant::row_len(GgmlType::F32, usize::MAX),
        Err(QuantError::RowTooLong {
            ty: GgmlType::F32,
            n: usize::MAX
        })
    );
    assert_eq!(hearth_quant::row_len(GgmlType::Q8_0, 64), Ok(68));
}

/// Rows inside a mmap'd tensor can start at any address: blocks are plain bytes, so reading from an
/// odd offset gives the same values.
#[test]
fn blocks_at_odd_addresses() {
    let mut rng = Rng(4);
    for ty in [
        GgmlType::Q8_K,
        GgmlType::Q4_K,
        GgmlType::Q8_0,
        GgmlType::F32,
        GgmlType::F16,
    ] {
        let row = common::random_row(&mut rng, ty, 512);
        let mut shifted = vec![0u8; row.len() + 1];
        shifted[1..].copy_from_slice(&row);
        let (mut a, mut b) = (vec![0f32; 512], vec![0f32; 512]);
        dequantize_row(ty, &row, &mut a).unwrap();
        dequantize_row(ty, &shifted[1..], &mut b).unwrap();
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
