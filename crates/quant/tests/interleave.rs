//! Rows interleaved four (K-quants) or eight (legacy formats) at a time
//! (`hearth_quant::interleave`): the rewrite gives the file's bytes back exactly, so does the
//! lookup of one row, and products over interleaved rows give the same bits as over the file's rows at
//! every instruction set, for one token and for many, including quants and activations at their
//! extremes.

mod common;

use common::{extreme_acts, f16_fields, random_row, Rng};
use hearth_quant::interleave::{
    can_interleave, deinterleave, group_rows, interleave, interleaved_row, GROUP_ROWS,
    LEGACY_GROUP_ROWS,
};
use hearth_quant::simd::{
    available_isas, interleaved_kernels, quantize_row_at, vec_dot_matrix_at,
    vec_dot_matrix_interleaved_at, Isa, Level, Rows,
};
use hearth_quant::{vec_dot_type, GgmlType, ALL_TYPES};

/// The types with an interleaved layout.
const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
];

/// Matrix shapes (rows, columns) of `ty`: one group up to many, whole blocks.
fn shapes(ty: GgmlType) -> [(usize, usize); 4] {
    if group_rows(ty) == GROUP_ROWS {
        [(4, 256), (8, 2048), (16, 768), (68, 512)]
    } else {
        [(8, 32), (16, 576), (32, 2048), (136, 96)]
    }
}

/// `rows` random rows of `ty` of `n` elements (random bytes with sane f16 scales).
fn rows_of(rng: &mut Rng, ty: GgmlType, rows: usize, n: usize) -> Vec<u8> {
    (0..rows).flat_map(|_| random_row(rng, ty, n)).collect()
}

fn acts_of(rng: &mut Rng, ty: GgmlType, tokens: usize, n: usize) -> Vec<u8> {
    let aty = vec_dot_type(ty);
    let arow = aty.row_bytes(n as u64).unwrap() as usize;
    let mut a = vec![0u8; arow * tokens];
    for t in 0..tokens {
        let x = rng.normals(n, [1.0, 0.02, 30.0][t % 3]);
        quantize_row_at(Level::Scalar, aty, &x, &mut a[t * arow..(t + 1) * arow]).unwrap();
    }
    a
}

/// `(interleaved, file's layout)`: every row of `wi` (interleaved) and of `w` (the same rows in
/// the file's layout) against `tokens` activation rows of `a`, at `isa`.
#[allow(clippy::too_many_arguments)]
fn both_layouts(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    rows: usize,
    w: &[u8],
    wi: &[u8],
    a: &[u8],
    tokens: usize,
) -> (Vec<f32>, Vec<f32>) {
    let wrow = ty.row_bytes(n as u64).unwrap() as usize;
    let arow = vec_dot_type(ty).row_bytes(n as u64).unwrap() as usize;
    let ar = Rows::packed(&a[..tokens * arow], arow);
    let mut want = vec![0f32; rows * tokens];
    let mut got = vec![f32::NAN; rows * tokens];
    vec_dot_matrix_at(isa, ty, n, Rows::packed(w, wrow), ar, &mut want, rows);
    vec_dot_matrix_interleaved_at(isa, ty, n, Rows::packed(wi, wrow), ar, &mut got, rows);
    (got, want)
}

#[test]
fn interleaving_round_trips_exactly() {
    let mut rng = Rng(11);
    for ty in TYPES {
        for (rows, n) in shapes(ty) {
            let w = rows_of(&mut rng, ty, rows, n);
            let mut x = w.clone();
            assert!(can_interleave(ty, rows, n));
            assert!(interleave(ty, n, &mut x));
            assert_ne!(x, w, "{ty} {rows} x {n}: interleaving changed nothing");
            let rb = w.len() / rows;
            let mut buf = Vec::new();
            for r in 0..rows {
                let row = interleaved_row(ty, n, &x, r, &mut buf);
                assert_eq!(row, &w[r * rb..(r + 1) * rb], "{ty} {rows} x {n}: row {r}");
            }
            assert!(deinterleave(ty, n, &mut x));
            assert_eq!(x, w, "{ty} {rows} x {n}");
        }
    }
}

#[test]
fn only_whole_groups_of_a_type_with_a_layout_are_interleaved() {
    for ty in TYPES {
        assert!(!can_interleave(ty, 6, 256));
        assert!(!can_interleave(ty, 8, 300));
        assert!(!can_interleave(ty, 8, 0));
    }
    for ty in TYPES
        .into_iter()
        .filter(|&t| group_rows(t) == LEGACY_GROUP_ROWS)
    {
        assert!(!can_interleave(ty, 4, 256), "{ty}: half a group");
        assert!(!can_interleave(ty, 12, 256), "{ty}: a group and a half");
    }
    for &ty in ALL_TYPES.iter() {
        assert_eq!(can_interleave(ty, 8, 256), TYPES.contains(&ty), "{ty}");
    }
    // Not whole groups: nothing written.
    let mut rng = Rng(3);
    for ty in TYPES {
        let w = rows_of(&mut rng, ty, 6, 256);
        let mut x = w.clone();
        assert!(!interleave(ty, 256, &mut x));
        assert_eq!(x, w);
    }
    assert!(!interleave(GgmlType::Q5_K, 256, &mut vec![0u8; 4 * 176]));
}

/// Products over interleaved rows against the same at the same instruction set over the file's
/// rows: every element the same bits, for token counts around the kernels' groups of 4 and passes
/// of 64, and for row counts of one group up to several (K-quants of 4 rows, legacy formats of 8;
/// 96 and 576 columns are chunks of the legacy kernels cut short).
#[test]
fn interleaved_products_are_bit_identical_to_the_files_rows() {
    let mut rng = Rng(7);
    for ty in TYPES {
        for isa in available_isas() {
            for (rows, n) in shapes(ty) {
                let w = rows_of(&mut rng, ty, rows, n);
                let mut wi = w.clone();
                assert!(interleave(ty, n, &mut wi));
                for tokens in [1, 2, 3, 4, 5, 9, 64, 67] {
                    let a = acts_of(&mut rng, ty, tokens, n);
                    let (got, want) = both_layouts(isa, ty, n, rows, &w, &wi, &a, tokens);
                    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "{ty} {isa} {rows} x {n}, {tokens} tokens: token {} row {}: {g} vs {w}",
                            k / rows,
                            k % rows
                        );
                    }
                }
            }
        }
    }
}

/// Quants, scales and minimums at their extremes (every byte `fill`) and activations of ±127 and
/// -128: the i16 sums of four (Q4_K) or two (Q6_K) products' pairs, and of the legacy kernels,
/// must not overflow.
#[test]
fn extreme_quants_stay_exact_interleaved() {
    for ty in TYPES {
        extreme_quants(ty);
    }
}

fn extreme_quants(ty: GgmlType) {
    let aty = vec_dot_type(ty);
    let n = 512;
    // Three legacy groups: the many-token kernel's pair of groups and a single one.
    let rows = 24;
    let wrow = ty.row_bytes(n as u64).unwrap() as usize;
    let arow = aty.row_bytes(n as u64).unwrap() as usize;
    for isa in available_isas() {
        for fill in [0xFFu8, 0x80, 0x7F, 0x88, 0x00] {
            let mut w = vec![fill; wrow * rows];
            for (i, block) in w.chunks_exact_mut(ty.type_size()).enumerate() {
                for &off in f16_fields(ty) {
                    let v = half::f16::from_f32(if i % 2 == 0 { 0.01 } else { -0.02 });
                    block[off..off + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            let mut wi = w.clone();
            assert!(interleave(ty, n, &mut wi));
            let mut a = vec![];
            for j in 0..3 {
                let x = extreme_acts(j, n);
                let mut q = vec![0u8; arow];
                quantize_row_at(Level::Scalar, aty, &x, &mut q).unwrap();
                a.extend(q);
            }
            // -1.0 quantizes to -127; make the second row's first block -128.
            let signed = matches!(ty, GgmlType::Q8_0 | GgmlType::IQ4_NL);
            if aty == GgmlType::Q8_K {
                // Q8_K's range, with its sums of 16 to match (d: 4 bytes, 256 quants, 16 i16
                // sums).
                let b = &mut a[arow..arow + 292];
                b[4..260].fill(0x80);
                for j in 0..16 {
                    b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(-2048i16).to_le_bytes());
                }
            } else if !(signed && isa == Isa::Avx512) {
                // Q8_0 / Q8_1: the quants after `d` (and `s`, which both layouts use alike).
                // Not for signed weights (Q8_0, IQ4_NL) at AVX-512: their groups of one or two
                // tokens go through the 256-bit kernels, whose `vpsignb` cannot negate -128, the
                // file's rows through the 512-bit ones, exact there; the quantizer never makes -128
                // (its range is ±127).
                let qs = aty.type_size() - 32;
                a[arow + qs..arow + qs + 32].fill(0x80);
            }
            for tokens in [1, 3] {
                let (got, want) = both_layouts(isa, ty, n, rows, &w, &wi, &a, tokens);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(
                    same,
                    "{ty} {isa} fill {fill:#x}, {tokens} tokens: {got:?} vs {want:?}"
                );
            }
        }
    }
}

#[test]
fn kernels_exist_where_a_loader_interleaves() {
    for ty in TYPES {
        assert!(!interleaved_kernels(Isa::Scalar, ty));
        for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
            assert_eq!(interleaved_kernels(isa, ty), cfg!(target_arch = "x86_64"));
        }
    }
    assert!(!interleaved_kernels(Isa::Avx2, GgmlType::Q5_K));
    assert_eq!(GROUP_ROWS, 4);
    assert_eq!(LEGACY_GROUP_ROWS, 8);
}
