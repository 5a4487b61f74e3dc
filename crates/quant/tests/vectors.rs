//! Parity with gguf-py on the committed vectors: dequantization of random blocks of every type and
//! quantization of seeded rows (see tools/gen_quant_vectors.py).

mod common;

use common::{data_lines, f32s, unhex};
use hearth_quant::{dequantize_row, quantize_row, GgmlType};

#[test]
fn dequantize_random_blocks_bit_exact() {
    let mut seen = std::collections::BTreeSet::new();
    for line in data_lines("dequant_blocks.txt") {
        let f: Vec<&str> = line.split(' ').collect();
        let ty = GgmlType::from_name(f[0]).unwrap();
        let n: usize = f[1].parse().unwrap();
        let src = unhex(f[2]);
        let want = f32s(&unhex(f[3]));
        let mut got = vec![0f32; n];
        dequantize_row(ty, &src, &mut got).unwrap();
        for i in 0..n {
            assert_eq!(
                got[i].to_bits(),
                want[i].to_bits(),
                "{ty} element {i}: got {} want {}",
                got[i],
                want[i]
            );
        }
        seen.insert(ty);
    }
    for ty in hearth_quant::ALL_TYPES
        .iter()
        .filter(|t| hearth_quant::can_dequantize(**t))
    {
        assert!(seen.contains(ty), "no vectors for {ty}");
    }
}

#[test]
fn quantize_rows_bit_exact_with_gguf_py() {
    for line in data_lines("quantize_rows.txt") {
        let f: Vec<&str> = line.split(' ').collect();
        let ty = GgmlType::from_name(f[0]).unwrap();
        let n: usize = f[1].parse().unwrap();
        let src = f32s(&unhex(f[2]));
        let want = unhex(f[3]);
        assert_eq!(src.len(), n);
        let mut got = vec![0u8; want.len()];
        quantize_row(ty, &src, &mut got).unwrap();
        if got != want {
            let bs = ty.type_size();
            let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
            panic!(
                "{ty}: first difference at byte {first} (block {}): got {:02x?} want {:02x?}",
                first / bs,
                &got[first / bs * bs..][..bs],
                &want[first / bs * bs..][..bs]
            );
        }
    }
}
