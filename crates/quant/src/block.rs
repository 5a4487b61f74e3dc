//! The [`Block`] trait and safe reinterpretation of byte slices as block slices.
//!
//! Every block struct in this crate is `#[repr(C)]` and built only from `u8`, `i8` and arrays of them:
//! alignment 1, no padding, and every bit pattern valid. Multi-byte scales (f16, f32, i16) are stored
//! as little-endian byte arrays and decoded on read, so a block may start at any address — tensor data
//! in a mmap'd GGUF file is only aligned at the tensor start, and rows inside it need not be.

use crate::GgmlType;
use std::mem::{align_of, size_of};

/// A GGML block layout.
///
/// # Safety
/// Implementors must be `#[repr(C)]` structs whose fields are only `u8`, `i8` or (nested) arrays of
/// them, so that the type has alignment 1, no padding, and accepts any bit pattern.
pub unsafe trait Block: Copy + 'static {
    /// The GGML type this block encodes.
    const TYPE: GgmlType;
    /// Elements per block.
    const BLOCK_SIZE: usize;

    /// An all-zero block.
    fn zeroed() -> Self {
        // SAFETY: per the trait contract, all-zero bytes are a valid value.
        unsafe { std::mem::zeroed() }
    }
}

/// `bytes` as a slice of blocks, or `None` if its length is not a whole number of blocks.
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> Option<&[B]> {
    debug_assert_eq!(align_of::<B>(), 1);
    let size = size_of::<B>();
    if bytes.len() % size != 0 {
        return None;
    }
    // SAFETY: B has alignment 1, no padding and no invalid bit patterns (trait contract), and the
    // length is an exact multiple of its size, so the memory is a valid [B] of that length.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}

/// `bytes` as a mutable slice of blocks, or `None` if its length is not a whole number of blocks.
pub fn cast_blocks_mut<B: Block>(bytes: &mut [u8]) -> Option<&mut [B]> {
    debug_assert_eq!(align_of::<B>(), 1);
    let size = size_of::<B>();
    if bytes.len() % size != 0 {
        return None;
    }
    // SAFETY: as in `cast_blocks`; any bytes written through B are plain bytes.
    Some(unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / size)
    })
}

/// The bytes of a block slice.
pub fn blocks_as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    // SAFETY: B is plain bytes without padding (trait contract).
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks))
    }
}

/// Implements [`Block`] and asserts size and alignment at compile time.
macro_rules! impl_block {
    ($b:ty, $t:expr, $bs:expr, $size:expr) => {
        const _: () = assert!(::std::mem::size_of::<$b>() == $size);
        const _: () = assert!(::std::mem::align_of::<$b>() == 1);
        // SAFETY: the struct is #[repr(C)] with only u8/i8 array fields (checked by the asserts above
        // for size and alignment; fields are reviewed at the definition).
        unsafe impl $crate::block::Block for $b {
            const TYPE: $crate::GgmlType = $t;
            const BLOCK_SIZE: usize = $bs;
        }
    };
}
pub(crate) use impl_block;

/// Decodes a little-endian IEEE half stored as two bytes.
#[inline]
pub fn f16_to_f32(b: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// Encodes `x` as a little-endian IEEE half, rounding to nearest even (as `GGML_FP32_TO_FP16`).
#[inline]
pub fn f32_to_f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}
