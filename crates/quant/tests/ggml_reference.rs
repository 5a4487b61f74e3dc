//! Bit-exactness against ggml's own reference C code (see the header of tests/data/ggml_ref.txt):
//! the quantizers without a gguf-py twin or a llama.cpp fixture to check them (Q8_1, Q8_K, Q2_K, Q3_K,
//! IQ4_XS; Q8_0 and IQ4_NL again) and every integer dot product, on seeded inputs. A change of float
//! order in a scalar kernel can fail here while the tolerance tests in tests/dot.rs still pass.

mod common;

use common::{data_lines, f32s, unhex};
use hearth_quant::simd::{vec_dot_at, Level};
use hearth_quant::{quantize_row, GgmlType};
use std::collections::BTreeSet;

#[test]
fn quantizers_and_dots_match_ggml_reference_bit_for_bit() {
    let (mut quantizers, mut dots) = (BTreeSet::new(), BTreeSet::new());
    for line in data_lines("ggml_ref.txt") {
        let f: Vec<&str> = line.split(' ').collect();
        let ty = GgmlType::from_name(f[1]).unwrap();
        let n: usize = f[2].parse().unwrap();
        match f[0] {
            "Q" => {
                let x = f32s(&unhex(f[3]));
                let want = unhex(f[4]);
                let mut got = vec![0u8; want.len()];
                quantize_row(ty, &x, &mut got).unwrap();
                let bs = ty.type_size();
                let bad = got
                    .chunks(bs)
                    .zip(want.chunks(bs))
                    .filter(|(a, b)| a != b)
                    .count();
                assert_eq!(bad, 0, "{ty}: {bad} blocks differ from ggml");
                quantizers.insert(ty);
            }
            "D" => {
                let (w, a) = (unhex(f[3]), unhex(f[4]));
                let want = f32::from_bits(u32::from_str_radix(f[5], 16).unwrap());
                // The scalar twins are the ports of ggml's generic kernels; `vec_dot` may run SIMD
                // kernels, which are checked against these twins in tests/simd.rs.
                let got = vec_dot_at(Level::Scalar, ty, n, &w, &a);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty}: vec_dot {got} vs ggml {want}"
                );
                dots.insert(ty);
            }
            other => panic!("unknown record {other}"),
        }
    }
    assert_eq!(quantizers.len(), 7);
    assert_eq!(dots.len(), 12);
}
