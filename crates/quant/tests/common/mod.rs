//! Helpers shared by the integration tests: vector files, hex, the tensor hash, a seeded PRNG and the
//! fixture paths.

#![allow(dead_code)]

use std::path::PathBuf;

/// Lines of a data file under tests/data, without comments and blanks.
pub fn data_lines(name: &str) -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/").to_string() + name;
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Decodes lowercase/uppercase hex.
pub fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() & 1 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Little-endian f32s from bytes.
pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The order-sensitive hash of f32 bit patterns that tools/gen_quant_vectors.py writes: the wrapping
/// sum of `splitmix64_finalize(bits_i ^ (i << 32))`.
pub fn hash_f32(x: &[f32]) -> u64 {
    let mut total = 0u64;
    for (i, v) in x.iter().enumerate() {
        let mut z = v.to_bits() as u64 ^ ((i as u64) << 32);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        total = total.wrapping_add(z);
    }
    total
}

/// The shared read-only directory (/work/shared), from the crate's manifest.
pub fn shared_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared"))
}

/// Path of the real SmolLM2 model (env HEARTH_SMOLLM2 or the repo's .cache default).
pub fn smollm2_path() -> PathBuf {
    std::env::var_os("HEARTH_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
            ))
        })
}

/// Resolves a FILE column of tensors.txt.
pub fn model_path(label: &str) -> PathBuf {
    if label == "$HEARTH_SMOLLM2" {
        smollm2_path()
    } else {
        shared_dir().join(label)
    }
}

/// One line of tensors.txt.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub file: String,
    pub name: String,
    pub ty: hearth_quant::GgmlType,
    pub offset: usize,
    pub n: usize,
    pub hash: u64,
}

pub fn tensor_index() -> Vec<TensorEntry> {
    data_lines("tensors.txt")
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 6, "bad line {l}");
            TensorEntry {
                file: f[0].to_string(),
                name: f[1].to_string(),
                ty: hearth_quant::GgmlType::from_name(f[2]).expect("type"),
                offset: f[3].parse().unwrap(),
                n: f[4].parse().unwrap(),
                hash: u64::from_str_radix(f[5], 16).unwrap(),
            }
        })
        .collect()
}

/// The bytes of a tensor inside a model file.
pub fn tensor_bytes<'a>(file: &'a [u8], e: &TensorEntry) -> &'a [u8] {
    let len = e.ty.row_bytes(e.n as u64).expect("whole blocks") as usize;
    &file[e.offset..e.offset + len]
}

/// A small seeded generator (splitmix64) so tests need no extra crates and stay deterministic.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Roughly normal (sum of uniforms), mean 0, sd 1.
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..12).map(|_| self.uniform()).sum();
        s - 6.0
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// `n` normal values times `scale`.
    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// Byte offsets of the f16 scale fields in a block of `ty` (Q8_K's f32 scale is at 0).
pub fn f16_fields(ty: hearth_quant::GgmlType) -> &'static [usize] {
    use hearth_quant::GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS => &[0],
        Q4_1 | Q5_1 | Q8_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// Activation row `j` of the extreme-value tests, `n` elements: all 1.0 (quantized to +127), all
/// -1.0 (-127), then signs alternating every 32 elements (sums of sub-blocks at their extremes).
pub fn extreme_acts(j: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|k| match j {
            0 => 1.0,
            1 => -1.0,
            _ => 1.0 - 2.0 * (k / 32 % 2) as f32,
        })
        .collect()
}

/// A random but valid row of `n` elements of `ty`: random bytes with sane finite scales (and for the
/// plain float types, random finite values).
pub fn random_row(rng: &mut Rng, ty: hearth_quant::GgmlType, n: usize) -> Vec<u8> {
    use hearth_quant::GgmlType::*;
    match ty {
        F32 => rng
            .normals(n, 1.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        F16 => rng
            .normals(n, 1.0)
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        BF16 => rng
            .normals(n, 1.0)
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => {
            let bs = ty.type_size();
            let mut row = rng.bytes(n / ty.block_size() * bs);
            for block in row.chunks_exact_mut(bs) {
                for &off in f16_fields(ty) {
                    let v = half::f16::from_f32(rng.normal() * 0.01);
                    block[off..off + 2].copy_from_slice(&v.to_le_bytes());
                }
                if ty == Q8_K {
                    block[0..4].copy_from_slice(&(rng.normal() * 0.01).to_le_bytes());
                    // keep bsums consistent with the quants, as a real Q8_K row has them
                    for j in 0..16 {
                        let s: i32 = block[4 + 16 * j..4 + 16 * j + 16]
                            .iter()
                            .map(|&q| q as i8 as i32)
                            .sum();
                        block[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
                    }
                }
            }
            row
        }
    }
}
