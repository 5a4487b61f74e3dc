//! Type-dispatched entry points over byte rows: [`dequantize_row`], [`quantize_row`], [`vec_dot`].

use crate::block::{cast_blocks, cast_blocks_mut, Block};
use crate::error::QuantError;
use crate::{float, iq4, iq4_quantize, k_quantize, k_quants as k, legacy as l, GgmlType};

/// Whether [`dequantize_row`] handles `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    ty.is_supported()
}

/// Whether [`quantize_row`] handles `ty`: every type Hearth can dequantize also has a reference
/// quantizer.
pub fn has_quantizer(ty: GgmlType) -> bool {
    can_dequantize(ty)
}

/// The activation type llama.cpp quantizes the other operand to before a dot product with a row of
/// `ty` (`vec_dot_type` in ggml-cpu.c's `type_traits_cpu`). Types without a dot product (Q8_1, Q8_K
/// and the unsupported ones) map to themselves; see [`has_vec_dot`].
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS => Q8_K,
        other => other,
    }
}

/// Whether [`vec_dot`] handles weight rows of `ty`.
pub fn has_vec_dot(ty: GgmlType) -> bool {
    can_dequantize(ty) && !matches!(ty, GgmlType::Q8_1 | GgmlType::Q8_K)
}

/// Checks that `n` elements of `ty` fill whole blocks and returns the row's byte length.
pub fn row_len(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    let block = ty.block_size();
    // Every block size is a power of two: mask and shift instead of two divisions, since this runs
    // on every `vec_dot` call.
    debug_assert!(block.is_power_of_two());
    if n & (block - 1) != 0 {
        return Err(QuantError::PartialBlock { ty, n, block });
    }
    (n >> block.trailing_zeros())
        .checked_mul(ty.type_size())
        .ok_or(QuantError::RowTooLong { ty, n })
}

fn blocks<B: Block>(src: &[u8]) -> &[B] {
    cast_blocks(src).expect("length checked by the caller")
}

fn blocks_mut<B: Block>(dst: &mut [u8]) -> &mut [B] {
    cast_blocks_mut(dst).expect("length checked by the caller")
}

/// Dequantizes one row of `ty` from `src` into `dst` (`dst.len()` elements). `src` must be exactly
/// the row's bytes. Results are bit-identical to gguf-py's numpy dequantizers.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    if !can_dequantize(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    let expected = row_len(ty, dst.len())?;
    if src.len() != expected {
        return Err(QuantError::BadLength {
            ty,
            expected,
            got: src.len(),
            what: "source row",
        });
    }
    match ty {
        F32 => float::dequantize_row_f32(src, dst),
        F16 => float::dequantize_row_f16(src, dst),
        BF16 => float::dequantize_row_bf16(src, dst),
        Q4_0 => l::dequantize_row_q4_0(blocks(src), dst),
        Q4_1 => l::dequantize_row_q4_1(blocks(src), dst),
        Q5_0 => l::dequantize_row_q5_0(blocks(src), dst),
        Q5_1 => l::dequantize_row_q5_1(blocks(src), dst),
        Q8_0 => l::dequantize_row_q8_0(blocks(src), dst),
        Q8_1 => l::dequantize_row_q8_1(blocks(src), dst),
        Q2_K => k::dequantize_row_q2_k(blocks(src), dst),
        Q3_K => k::dequantize_row_q3_k(blocks(src), dst),
        Q4_K => k::dequantize_row_q4_k(blocks(src), dst),
        Q5_K => k::dequantize_row_q5_k(blocks(src), dst),
        Q6_K => k::dequantize_row_q6_k(blocks(src), dst),
        Q8_K => k::dequantize_row_q8_k(blocks(src), dst),
        IQ4_NL => iq4::dequantize_row_iq4_nl(blocks(src), dst),
        IQ4_XS => iq4::dequantize_row_iq4_xs(blocks(src), dst),
        _ => unreachable!("can_dequantize covers the arms above"),
    }
    Ok(())
}

/// Quantizes one row `src` to `ty` into `dst`, which must be exactly the row's bytes. Matches ggml's
/// `quantize_row_*_ref` (and gguf-py's `quantize` where it has one) bit for bit; Q8_0, Q8_1, Q8_K
/// and F16 use the SIMD quantizers of [`crate::simd`] where the CPU has them (bit-identical for
/// finite input).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    crate::simd::quantize_row_at(crate::simd::kernel_level(), ty, src, dst)
}

/// [`quantize_row`] with the reference quantizers only.
pub(crate) fn quantize_row_scalar(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    use GgmlType::*;
    if !has_quantizer(ty) {
        return Err(QuantError::NoQuantizer(ty));
    }
    let expected = row_len(ty, src.len())?;
    if dst.len() != expected {
        return Err(QuantError::BadLength {
            ty,
            expected,
            got: dst.len(),
            what: "destination row",
        });
    }
    match ty {
        F32 => float::quantize_row_f32(src, dst),
        F16 => float::quantize_row_f16(src, dst),
        BF16 => float::quantize_row_bf16(src, dst),
        Q4_0 => l::quantize_row_q4_0(src, blocks_mut(dst)),
        Q4_1 => l::quantize_row_q4_1(src, blocks_mut(dst)),
        Q5_0 => l::quantize_row_q5_0(src, blocks_mut(dst)),
        Q5_1 => l::quantize_row_q5_1(src, blocks_mut(dst)),
        Q8_0 => l::quantize_row_q8_0(src, blocks_mut(dst)),
        Q8_1 => l::quantize_row_q8_1(src, blocks_mut(dst)),
        Q2_K => k_quantize::quantize_row_q2_k(src, blocks_mut(dst)),
        Q3_K => k_quantize::quantize_row_q3_k(src, blocks_mut(dst)),
        Q4_K => k_quantize::quantize_row_q4_k(src, blocks_mut(dst)),
        Q5_K => k_quantize::quantize_row_q5_k(src, blocks_mut(dst)),
        Q6_K => k_quantize::quantize_row_q6_k(src, blocks_mut(dst)),
        Q8_K => k_quantize::quantize_row_q8_k(src, blocks_mut(dst)),
        IQ4_NL => iq4_quantize::quantize_row_iq4_nl(src, blocks_mut(dst)),
        IQ4_XS => iq4_quantize::quantize_row_iq4_xs(src, blocks_mut(dst)),
        _ => unreachable!("has_quantizer covers the arms above"),
    }
    Ok(())
}

/// Dot product of one weight row `w` of `ty` (`n` elements) with one activation row `a` already
/// quantized to [`vec_dot_type`]`(ty)`, with the fastest kernel this CPU runs
/// ([`crate::simd::kernel_level`]). At [`crate::simd::Level::Scalar`] this is exactly ggml's scalar
/// `ggml_vec_dot_*_generic`; the SIMD levels compute the same integer sums and differ only in the
/// order of the f32 accumulation (see [`crate::simd`]).
///
/// # Panics
/// On programmer error only: a type without a dot product ([`has_vec_dot`]), `n` not a whole number
/// of blocks, or slices that are not exactly one row. Callers validate shapes when loading a model.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(has_vec_dot(ty), "vec_dot: no dot product for {ty}");
    let wlen = row_len(ty, n).unwrap_or_else(|e| panic!("vec_dot: {e}"));
    let alen = row_len(vec_dot_type(ty), n).unwrap_or_else(|e| panic!("vec_dot: {e}"));
    assert!(
        w.len() == wlen && a.len() == alen,
        "vec_dot {ty}: row lengths {} / {}, expected {wlen} / {alen}",
        w.len(),
        a.len()
    );
    crate::simd::vec_dot_checked(crate::simd::kernel_level(), ty, n, w, a)
}
