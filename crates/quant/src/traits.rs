//! One row per quant type: everything Hearth computes with a type, in one table.
//!
//! After ggml's `type_traits_cpu[]` and candle's `GgmlType` (`VecDotType`, `to_float`,
//! `vec_dot`): a row names the type's dequantizer, its reference quantizer (and a SIMD one for the
//! activation types), and for weight types the activation type of the dot product, the scalar dot
//! (the oracle the SIMD kernels are tested against) and the SIMD kernel for each instruction set
//! and number of tokens. Dispatch anywhere in the crate reads this table, so adding a type is its
//! block, its reference functions and kernels, and one row here.
//!
//! The block geometry (`block_size`, `type_size`, names, ids) stays with [`GgmlType`]: it is known
//! for every GGML type, including the ones without a row (which Hearth refuses to compute with).

use crate::block::{cast_blocks, cast_blocks_mut, Block};
use crate::{dot, float, iq4, iq4_quantize, k_quantize, k_quants as k, legacy as l, GgmlType};

#[cfg(target_arch = "x86_64")]
use crate::simd::ymm::{floats as yf, kquants as yk, legacy as yl, rows as yr};
#[cfg(target_arch = "x86_64")]
use crate::simd::{avx512, lanes, quantize as q};

/// A matrix kernel: every row of `w` (rows of `n` elements of the weight type) against every row
/// of `acts` (1..=[`crate::simd::PASS`] rows of the activation type): element (row `i`, token `j`)
/// goes to `out[j * tok_stride + i * row_stride]`.
///
/// # Safety
/// The CPU must run the kernel's instruction set; every weight and activation row must be exactly
/// one row, and `out` must hold every element written.
#[cfg(target_arch = "x86_64")]
pub(crate) type MatrixFn = unsafe fn(
    n: usize,
    w: &crate::simd::Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
);

/// The kernels of one instruction set: for one token (decode streams each weight once) and for
/// several (prefill and batched decode share each unpacked weight among the tokens). Both compute
/// the same bits per element.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    pub one: MatrixFn,
    pub many: MatrixFn,
}

#[cfg(target_arch = "x86_64")]
const fn both(f: MatrixFn) -> Kernel {
    Kernel { one: f, many: f }
}

/// Kernels that differ between one token and several.
#[cfg(target_arch = "x86_64")]
const fn split(one: MatrixFn, many: MatrixFn) -> Kernel {
    Kernel { one, many }
}

/// A SIMD row quantizer (lengths checked by the caller; the CPU must run its instruction set).
#[cfg(target_arch = "x86_64")]
pub(crate) type QuantizeFn = unsafe fn(&[f32], &mut [u8]);

/// What a weight type's dot product needs.
pub(crate) struct Dot {
    /// The activation type (`vec_dot_type`).
    pub act: GgmlType,
    /// ggml's scalar `ggml_vec_dot_*_generic`: `(n, weight row, activation row)`.
    pub scalar: fn(usize, &[u8], &[u8]) -> f32,
    /// The kernels for [`crate::Isa::Avx2`], [`crate::Isa::AvxVnni`] and [`crate::Isa::Avx512`].
    #[cfg(target_arch = "x86_64")]
    pub simd: [Kernel; 3],
}

impl Dot {
    /// The kernels for `isa` (none for the scalar set).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub fn kernels(&self, isa: crate::Isa) -> Option<Kernel> {
        use crate::Isa::*;
        match isa {
            Scalar => None,
            Avx2 => Some(self.simd[0]),
            AvxVnni => Some(self.simd[1]),
            Avx512 => Some(self.simd[2]),
        }
    }
}

/// One type's row.
pub(crate) struct TypeTraits {
    pub ty: GgmlType,
    /// Dequantizes one row (`dst.len()` elements; lengths checked by the caller).
    pub dequantize: fn(&[u8], &mut [f32]),
    /// ggml's `quantize_row_*_ref` (lengths checked by the caller).
    pub quantize: fn(&[f32], &mut [u8]),
    /// The activation quantizer with AVX2/FMA/F16C, bit-identical to `quantize`.
    #[cfg(target_arch = "x86_64")]
    pub quantize_avx2: Option<QuantizeFn>,
    /// The dot product, for weight types.
    pub dot: Option<Dot>,
}

fn b<B: Block>(src: &[u8]) -> &[B] {
    cast_blocks(src).expect("length checked by the caller")
}

fn bm<B: Block>(dst: &mut [u8]) -> &mut [B] {
    cast_blocks_mut(dst).expect("length checked by the caller")
}

use GgmlType::*;

/// The table, one row per type Hearth computes with.
const TABLE: [TypeTraits; 17] = [
    TypeTraits {
        ty: F32,
        dequantize: float::dequantize_row_f32,
        quantize: float::quantize_row_f32,
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: F32,
            scalar: float::vec_dot_f32,
            #[cfg(target_arch = "x86_64")]
            simd: [both(yf::f32s), both(yf::f32s), both(yf::f32s)],
        }),
    },
    TypeTraits {
        ty: F16,
        dequantize: float::dequantize_row_f16,
        quantize: float::quantize_row_f16,
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: Some(q::f16_row),
        dot: Some(Dot {
            act: F16,
            scalar: float::vec_dot_f16,
            #[cfg(target_arch = "x86_64")]
            simd: [both(yf::f16s), both(yf::f16s), both(yf::f16s)],
        }),
    },
    TypeTraits {
        ty: BF16,
        dequantize: float::dequantize_row_bf16,
        quantize: float::quantize_row_bf16,
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: BF16,
            scalar: float::vec_dot_bf16,
            #[cfg(target_arch = "x86_64")]
            simd: [both(yf::bf16s), both(yf::bf16s), both(yf::bf16s)],
        }),
    },
    TypeTraits {
        ty: Q4_0,
        dequantize: |s, d| l::dequantize_row_q4_0(b(s), d),
        quantize: |s, d| l::quantize_row_q4_0(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_0,
            scalar: |n, w, a| dot::vec_dot_q4_0_q8_0(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                both(yl::q4_0),
                both(yl::q4_0_vnni),
                // A legacy format's file rows at AVX-512: one token through the 256-bit kernel
                // (EVEX VNNI), several through the 512-bit one, whose transpose of 16 rows a chunk
                // one token does not pay back (`prefill_min`, one thread, an Intel Xeon, GB/s,
                // 512-bit against 256-bit: 1536 × 576 in L2 Q4_0 17.1 / 19.1, Q4_1 19.8 / 23.9,
                // Q8_0 23.1 / 31.4; 32768 × 4096 from memory Q4_1 10.5 / 15.2, Q8_0 8.1 / 12.3).
                // The same for the other legacy formats below. Same bits: the quantizer never
                // makes the activation -128 that the 256-bit kernels' `vpsignb` cannot negate.
                split(yl::q4_0_avx512, lanes::q4_0),
            ],
        }),
    },
    TypeTraits {
        ty: Q4_1,
        dequantize: |s, d| l::dequantize_row_q4_1(b(s), d),
        quantize: |s, d| l::quantize_row_q4_1(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_1,
            scalar: |n, w, a| dot::vec_dot_q4_1_q8_1(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                both(yl::q4_1),
                both(yl::q4_1_vnni),
                split(yl::q4_1_avx512, lanes::q4_1),
            ],
        }),
    },
    TypeTraits {
        ty: Q5_0,
        dequantize: |s, d| l::dequantize_row_q5_0(b(s), d),
        quantize: |s, d| l::quantize_row_q5_0(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_0,
            scalar: |n, w, a| dot::vec_dot_q5_0_q8_0(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                both(yl::q5_0),
                both(yl::q5_0_vnni),
                split(yl::q5_0_avx512, lanes::q5_0),
            ],
        }),
    },
    TypeTraits {
        ty: Q5_1,
        dequantize: |s, d| l::dequantize_row_q5_1(b(s), d),
        quantize: |s, d| l::quantize_row_q5_1(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_1,
            scalar: |n, w, a| dot::vec_dot_q5_1_q8_1(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                both(yl::q5_1),
                both(yl::q5_1_vnni),
                split(yl::q5_1_avx512, lanes::q5_1),
            ],
        }),
    },
    TypeTraits {
        ty: Q8_0,
        dequantize: |s, d| l::dequantize_row_q8_0(b(s), d),
        quantize: |s, d| l::quantize_row_q8_0(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: Some(q::q8_0_row),
        dot: Some(Dot {
            act: Q8_0,
            scalar: |n, w, a| dot::vec_dot_q8_0_q8_0(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                both(yl::q8_0),
                both(yl::q8_0_vnni),
                split(yl::q8_0_avx512, lanes::q8_0),
            ],
        }),
    },
    TypeTraits {
        ty: Q8_1,
        dequantize: |s, d| l::dequantize_row_q8_1(b(s), d),
        quantize: |s, d| l::quantize_row_q8_1(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: Some(q::q8_1_row),
        dot: None,
    },
    TypeTraits {
        ty: Q2_K,
        dequantize: |s, d| k::dequantize_row_q2_k(b(s), d),
        quantize: |s, d| k_quantize::quantize_row_q2_k(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_K,
            scalar: |n, w, a| dot::vec_dot_q2_k_q8_k(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [both(yk::q2_k), both(yk::q2_k_vnni), both(yk::q2_k_avx512)],
        }),
    },
    TypeTraits {
        ty: Q3_K,
        dequantize: |s, d| k::dequantize_row_q3_k(b(s), d),
        quantize: |s, d| k_quantize::quantize_row_q3_k(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_K,
            scalar: |n, w, a| dot::vec_dot_q3_k_q8_k(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                both(yk::q3_k),
                both(yk::q3_k_vnni),
                // One token: the AVX2 build (`vpmaddubsw`), 11.4 against 9.2 GB/s in L2 and 9.3
                // against 7.6 from memory for the AVX-512 VNNI one, one thread, an Intel Xeon; the
                // same bits.
                split(yk::q3_k, yk::q3_k_avx512),
            ],
        }),
    },
    TypeTraits {
        ty: Q4_K,
        dequantize: |s, d| k::dequantize_row_q4_k(b(s), d),
        quantize: |s, d| k_quantize::quantize_row_q4_k(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_K,
            scalar: |n, w, a| dot::vec_dot_q4_k_q8_k(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                Kernel {
                    one: yr::k45_rows::<k::BlockQ4K>,
                    many: yk::q4_k,
                },
                Kernel {
                    one: yr::k45_rows::<k::BlockQ4K>,
                    many: yk::q4_k_vnni,
                },
                Kernel {
                    one: avx512::q4_k_rows,
                    many: lanes::q4_k,
                },
            ],
        }),
    },
    TypeTraits {
        ty: Q5_K,
        dequantize: |s, d| k::dequantize_row_q5_k(b(s), d),
        quantize: |s, d| k_quantize::quantize_row_q5_k(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_K,
            scalar: |n, w, a| dot::vec_dot_q5_k_q8_k(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                Kernel {
                    one: yr::k45_rows::<k::BlockQ5K>,
                    many: yk::q5_k,
                },
                Kernel {
                    one: yr::k45_rows::<k::BlockQ5K>,
                    many: yk::q5_k_vnni,
                },
                Kernel {
                    one: avx512::q5_k_rows,
                    many: lanes::q5_k,
                },
            ],
        }),
    },
    TypeTraits {
        ty: Q6_K,
        dequantize: |s, d| k::dequantize_row_q6_k(b(s), d),
        quantize: |s, d| k_quantize::quantize_row_q6_k(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_K,
            scalar: |n, w, a| dot::vec_dot_q6_k_q8_k(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                Kernel {
                    one: yr::q6_k_rows,
                    many: yk::q6_k,
                },
                Kernel {
                    one: yr::q6_k_rows,
                    many: yk::q6_k_vnni,
                },
                Kernel {
                    one: avx512::q6_k_rows,
                    many: lanes::q6_k,
                },
            ],
        }),
    },
    TypeTraits {
        ty: Q8_K,
        dequantize: |s, d| k::dequantize_row_q8_k(b(s), d),
        quantize: |s, d| k_quantize::quantize_row_q8_k(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: Some(q::q8_k_row),
        dot: None,
    },
    TypeTraits {
        ty: IQ4_NL,
        dequantize: |s, d| iq4::dequantize_row_iq4_nl(b(s), d),
        quantize: |s, d| iq4_quantize::quantize_row_iq4_nl(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_0,
            scalar: |n, w, a| dot::vec_dot_iq4_nl_q8_0(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                both(yl::iq4_nl),
                both(yl::iq4_nl_vnni),
                split(yl::iq4_nl_avx512, lanes::iq4_nl),
            ],
        }),
    },
    TypeTraits {
        ty: IQ4_XS,
        dequantize: |s, d| iq4::dequantize_row_iq4_xs(b(s), d),
        quantize: |s, d| iq4_quantize::quantize_row_iq4_xs(s, bm(d)),
        #[cfg(target_arch = "x86_64")]
        quantize_avx2: None,
        dot: Some(Dot {
            act: Q8_K,
            scalar: |n, w, a| dot::vec_dot_iq4_xs_q8_k(n, b(w), b(a)),
            #[cfg(target_arch = "x86_64")]
            simd: [
                both(yk::iq4_xs),
                both(yk::iq4_xs_vnni),
                both(yk::iq4_xs_avx512),
            ],
        }),
    },
];

/// Table index by type id (`u8::MAX`: no row).
const INDEX: [u8; 64] = {
    let mut idx = [u8::MAX; 64];
    let mut i = 0;
    while i < TABLE.len() {
        idx[TABLE[i].ty as usize] = i as u8;
        i += 1;
    }
    idx
};

static ROWS: [TypeTraits; 17] = TABLE;

/// The row of `ty`, or `None` for a type Hearth does not compute with.
#[inline]
pub(crate) fn get(ty: GgmlType) -> Option<&'static TypeTraits> {
    let i = *INDEX.get(ty as usize)?;
    ROWS.get(i as usize)
}

/// The dot product of weight type `ty`, if it has one.
#[inline]
pub(crate) fn dot(ty: GgmlType) -> Option<&'static Dot> {
    get(ty)?.dot.as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_unique_and_indexed() {
        for (i, t) in TABLE.iter().enumerate() {
            assert_eq!(INDEX[t.ty as usize] as usize, i, "{}", t.ty);
            assert!(std::ptr::eq(get(t.ty).unwrap(), &ROWS[i]));
        }
        assert!(get(GgmlType::IQ2_XS).is_none());
        for &t in crate::ALL_TYPES {
            assert!((t as usize) < INDEX.len(), "{t} id fits the index");
        }
    }
}
