//! Type-dispatched entry points over byte rows: [`dequantize_row`], [`quantize_row`], [`vec_dot`].

use crate::error::QuantError;
use crate::{traits, GgmlType};

/// Whether [`dequantize_row`] handles `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    traits::get(ty).is_some()
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
    traits::dot(ty).map_or(ty, |d| d.act)
}

/// Whether [`vec_dot`] handles weight rows of `ty`.
pub fn has_vec_dot(ty: GgmlType) -> bool {
    traits::dot(ty).is_some()
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

/// Dequantizes one row of `ty` from `src` into `dst` (`dst.len()` elements). `src` must be exactly
/// the row's bytes. Results are bit-identical to gguf-py's numpy dequantizers.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let t = traits::get(ty).ok_or(QuantError::Unsupported(ty))?;
    let expected = row_len(ty, dst.len())?;
    if src.len() != expected {
        return Err(QuantError::BadLength {
            ty,
            expected,
            got: src.len(),
            what: "source row",
        });
    }
    (t.dequantize)(src, dst);
    Ok(())
}

/// Quantizes one row `src` to `ty` into `dst`, which must be exactly the row's bytes. Matches ggml's
/// `quantize_row_*_ref` (and gguf-py's `quantize` where it has one) bit for bit; Q8_0, Q8_1, Q8_K
/// and F16 use the SIMD quantizers of [`crate::simd`] where the CPU has them (bit-identical for
/// finite input).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    crate::simd::quantize_row_at(crate::simd::kernel_isa(), ty, src, dst)
}

/// Dot product of one weight row `w` of `ty` (`n` elements) with one activation row `a` already
/// quantized to [`vec_dot_type`]`(ty)`, with the fastest kernel this CPU runs
/// ([`crate::simd::kernel_isa`]). At [`crate::simd::Isa::Scalar`] this is exactly ggml's scalar
/// `ggml_vec_dot_*_generic`; the SIMD sets compute the same integer sums and differ only in the
/// order of the f32 accumulation (see [`crate::simd`]).
///
/// # Panics
/// On programmer error only: a type without a dot product ([`has_vec_dot`]), `n` not a whole number
/// of blocks, or slices that are not exactly one row. Callers validate shapes when loading a model.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    crate::simd::vec_dot_at(crate::simd::kernel_isa(), ty, n, w, a)
}
