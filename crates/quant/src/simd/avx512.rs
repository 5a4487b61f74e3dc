//! AVX-512 kernels (placeholder until the 512-bit kernels land).

use crate::GgmlType;

/// Runs the AVX-512 tile for `ty`; returns false if there is none (the caller falls back to AVX2).
///
/// # Safety
/// As `avx2::tile`, and the CPU must have AVX-512 F/BW/VL/VNNI.
pub(super) unsafe fn tile(
    _ty: GgmlType,
    _n: usize,
    _w: &[u8],
    _acts: &[&[u8]],
    _out: &mut [f32],
) -> bool {
    false
}
