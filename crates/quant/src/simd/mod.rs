//! SIMD dot products and activation quantizers for x86-64, picked at run time.
//!
//! Three [`Level`]s exist: `Scalar` (the reference kernels in [`crate::dot`] / [`crate::float`]),
//! `Avx2` (AVX2 + FMA + F16C) and `Avx512` (AVX-512 F/BW/VL/VNNI on top of AVX2). The CPU is probed
//! once with `is_x86_feature_detected!`; the environment variable `HEARTH_KERNELS=scalar|avx2|avx512`
//! caps the level (a level the CPU lacks falls back to the best one it has). Nothing is chosen at
//! compile time, so one binary runs everywhere; on other architectures everything is scalar.
//!
//! Every SIMD kernel computes the same integer sums as its scalar twin (exactly) and differs only in
//! the order of the final f32 accumulation. Each kernel is written once as a *tile*: one weight row
//! against `N` (1..=[`MAX_TILE`]) activation rows, with per-activation accumulators and a reduction
//! order that does not depend on `N`. The single-row dot is the tile with `N = 1`, so
//! [`vec_dot_tile`] is bit-identical to [`crate::vec_dot`] at the same level for every element,
//! whatever the batch or tile size (batch invariance).
//!
//! At [`Level::Avx512`], Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL and Q4_K/Q5_K/Q6_K use the
//! register-blocked kernels of `lanes.rs` instead: 16 weight rows per register (one per lane) against
//! up to 4 tokens at a time, where each element is one f32 FMA chain over its blocks in order. A
//! single dot runs the same kernel with one row, so the rule above holds there too.
//!
//! Entry points: [`vec_dot_matrix`] (several weight rows × several activation rows, the one to use
//! in a matmul), [`vec_dot_tile`] / [`vec_dot_rows`] (one weight row × several activation rows),
//! and `*_at` twins taking an explicit [`Level`] for tests and benchmarks; `crate::vec_dot` and
//! `crate::quantize_row` dispatch here too.
//!
//! Activation quants must lie in `-127..=127`, as every quantizer in this crate writes them: the
//! signed 8-bit products use the `sign` trick of llama.cpp, which cannot represent `-(-128)`.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod lanes;
#[cfg(target_arch = "x86_64")]
mod quantize;

/// In-register transpose of 16 × 16 dwords: afterwards lane `l` of `r[k]` is lane `k` of the
/// input `r[l]` (for callers that lay out f32 or i32 tiles, such as attention's key blocks).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub unsafe fn transpose16x16(r: &mut [std::arch::x86_64::__m512i; 16]) {
    lanes::transpose16(r)
}

use crate::api::{has_vec_dot, row_len, vec_dot_type};
use crate::block::{cast_blocks, Block};
use crate::{dot, float, GgmlType, QuantError};
use std::sync::OnceLock;

/// Most activation rows one kernel pass handles; longer lists are processed in passes of this many.
/// Four keeps the per-activation accumulators of every kernel within the 16 AVX2 registers.
pub const MAX_TILE: usize = 4;

/// A kernel level, from slowest to fastest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// The reference kernels (any architecture).
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL/VNNI (implies [`Level::Avx2`]); types without a 512-bit kernel use AVX2.
    Avx512,
}

impl Level {
    /// Lower-case name, as `HEARTH_KERNELS` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    /// Parses a `HEARTH_KERNELS` value.
    pub fn from_name(s: &str) -> Option<Level> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(Level::Scalar),
            "avx2" => Some(Level::Avx2),
            "avx512" => Some(Level::Avx512),
            _ => None,
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The best level this CPU supports (ignores `HEARTH_KERNELS`).
pub fn cpu_level() -> Level {
    static CPU: OnceLock<Level> = OnceLock::new();
    *CPU.get_or_init(detect_cpu)
}

#[cfg(target_arch = "x86_64")]
fn detect_cpu() -> Level {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    if avx512 {
        Level::Avx512
    } else if avx2 {
        Level::Avx2
    } else {
        Level::Scalar
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_cpu() -> Level {
    Level::Scalar
}

/// The level [`crate::vec_dot`], [`vec_dot_tile`] and [`crate::quantize_row`] use: the CPU's best,
/// capped by `HEARTH_KERNELS` if set. Decided once per process.
pub fn kernel_level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let cpu = cpu_level();
        match std::env::var("HEARTH_KERNELS") {
            Ok(v) => match Level::from_name(&v) {
                Some(want) => want.min(cpu),
                None => {
                    // A typo must not silently pick a level the user did not ask for without a word.
                    eprintln!("hearth-quant: ignoring HEARTH_KERNELS={v:?} (expected scalar, avx2 or avx512)");
                    cpu
                }
            },
            Err(_) => cpu,
        }
    })
}

/// Every level this CPU can run, slowest first (for tests and benchmarks).
pub fn available_levels() -> Vec<Level> {
    [Level::Scalar, Level::Avx2, Level::Avx512]
        .into_iter()
        .filter(|&l| l <= cpu_level())
        .collect()
}

fn blocks<B: Block>(src: &[u8]) -> &[B] {
    cast_blocks(src).expect("length checked by the caller")
}

fn check_level(level: Level) {
    assert!(
        level <= cpu_level(),
        "kernel level {level} requested but this CPU only supports {}",
        cpu_level()
    );
}

/// Checks `ty`, `n` and the weight row; returns the activation row length in bytes.
fn check_shapes(ty: GgmlType, n: usize, w: &[u8]) -> usize {
    assert!(has_vec_dot(ty), "vec_dot: no dot product for {ty}");
    let wlen = row_len(ty, n).unwrap_or_else(|e| panic!("vec_dot: {e}"));
    let alen = row_len(vec_dot_type(ty), n).unwrap_or_else(|e| panic!("vec_dot: {e}"));
    assert!(
        w.len() == wlen,
        "vec_dot {ty}: weight row of {} bytes, expected {wlen}",
        w.len()
    );
    alen
}

/// [`crate::vec_dot`] at an explicit level (which must be in [`available_levels`]).
///
/// # Panics
/// As [`crate::vec_dot`], and if the CPU cannot run `level`.
pub fn vec_dot_at(level: Level, ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0.0f32];
    vec_dot_rows_at(level, ty, n, w, &[a], &mut out);
    out[0]
}

/// The single dot at `level` once [`crate::vec_dot`] has checked the shapes.
pub(crate) fn vec_dot_checked(level: Level, ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0.0f32];
    tile(level, ty, n, w, &[a], &mut out);
    out[0]
}

/// The scalar reference dot (the oracle), after the shapes were checked.
fn scalar_dot(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    use GgmlType::*;
    match ty {
        F32 => float::vec_dot_f32(n, w, a),
        F16 => float::vec_dot_f16(n, w, a),
        BF16 => float::vec_dot_bf16(n, w, a),
        Q4_0 => dot::vec_dot_q4_0_q8_0(n, blocks(w), blocks(a)),
        Q4_1 => dot::vec_dot_q4_1_q8_1(n, blocks(w), blocks(a)),
        Q5_0 => dot::vec_dot_q5_0_q8_0(n, blocks(w), blocks(a)),
        Q5_1 => dot::vec_dot_q5_1_q8_1(n, blocks(w), blocks(a)),
        Q8_0 => dot::vec_dot_q8_0_q8_0(n, blocks(w), blocks(a)),
        IQ4_NL => dot::vec_dot_iq4_nl_q8_0(n, blocks(w), blocks(a)),
        Q2_K => dot::vec_dot_q2_k_q8_k(n, blocks(w), blocks(a)),
        Q3_K => dot::vec_dot_q3_k_q8_k(n, blocks(w), blocks(a)),
        Q4_K => dot::vec_dot_q4_k_q8_k(n, blocks(w), blocks(a)),
        Q5_K => dot::vec_dot_q5_k_q8_k(n, blocks(w), blocks(a)),
        Q6_K => dot::vec_dot_q6_k_q8_k(n, blocks(w), blocks(a)),
        IQ4_XS => dot::vec_dot_iq4_xs_q8_k(n, blocks(w), blocks(a)),
        _ => unreachable!("has_vec_dot covers the arms above"),
    }
}

/// One weight row against several activation rows at an explicit level:
/// `out[j] = w · acts[j]`, each element bit-identical to [`vec_dot_at`]`(level, ty, n, w, acts[j])`.
///
/// # Panics
/// On programmer error: a type without a dot product, `n` not a whole number of blocks, rows of
/// the wrong length, `out.len() != acts.len()`, or a level the CPU cannot run.
pub fn vec_dot_rows_at(
    level: Level,
    ty: GgmlType,
    n: usize,
    w: &[u8],
    acts: &[&[u8]],
    out: &mut [f32],
) {
    check_level(level);
    let alen = check_shapes(ty, n, w);
    assert_eq!(
        acts.len(),
        out.len(),
        "vec_dot_rows: one output per activation row"
    );
    for a in acts {
        assert!(
            a.len() == alen,
            "vec_dot {ty}: activation row of {} bytes, expected {alen}",
            a.len()
        );
    }
    if use_lanes(level, ty, w.len()) {
        return row_lanes(ty, n, w, acts, out);
    }
    for (a, o) in acts.chunks(MAX_TILE).zip(out.chunks_mut(MAX_TILE)) {
        tile(level, ty, n, w, a, o);
    }
}

/// Whether `level` runs `ty` with the register-blocked kernels of `lanes.rs` (16 weight rows per
/// register), for weight rows `w_stride` bytes apart.
#[inline]
fn use_lanes(level: Level, ty: GgmlType, w_stride: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // Lane offsets of up to 16 rows are i32 gather indices.
        level >= Level::Avx512
            && lanes::supports(ty)
            && w_stride <= i32::MAX as usize / lanes::LANES
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, ty, w_stride);
        false
    }
}

/// Every row of `w` against activation rows `act(0..n_acts)` with the lanes kernels, in passes of
/// at most `lanes::PASS` tokens: element (row `i`, token `j`) goes to
/// `out[j * tok_stride + i * row_stride]`. Shapes already checked; only after [`use_lanes`].
#[allow(clippy::too_many_arguments)]
fn lanes_product<'a>(
    ty: GgmlType,
    n: usize,
    w: &Rows,
    n_acts: usize,
    act: impl Fn(usize) -> &'a [u8],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut j0 = 0;
        while j0 < n_acts {
            let m = (n_acts - j0).min(lanes::PASS);
            let mut rows: [&[u8]; lanes::PASS] = [&[]; lanes::PASS];
            for (k, r) in rows[..m].iter_mut().enumerate() {
                *r = act(j0 + k);
            }
            // SAFETY: `use_lanes` proved AVX-512 F/BW/VL/VNNI (which implies AVX2/FMA/F16C here,
            // see `detect_cpu`) and i32 lane offsets; the callers checked every row's length and
            // that `out` holds every element written.
            let done = unsafe {
                lanes::matrix(
                    ty,
                    n,
                    w,
                    &rows[..m],
                    &mut out[j0 * tok_stride..],
                    tok_stride,
                    row_stride,
                )
            };
            debug_assert!(done);
            j0 += m;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, n, w, n_acts, act, out, tok_stride, row_stride);
        unreachable!("use_lanes is false off x86-64");
    }
}

/// One weight row against `acts` through the lanes kernel (`use_lanes` said yes).
fn row_lanes(ty: GgmlType, n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let w = Rows {
        data: w,
        stride: w.len(),
        count: 1,
    };
    lanes_product(ty, n, &w, acts.len(), |j| acts[j], out, 1, 0);
}

/// One pass of at most [`MAX_TILE`] activation rows; shapes already checked.
fn tile(level: Level, ty: GgmlType, n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    if use_lanes(level, ty, w.len()) {
        return row_lanes(ty, n, w, acts, out);
    }
    #[cfg(target_arch = "x86_64")]
    {
        if level >= Level::Avx512 {
            // SAFETY: `check_level` proved the CPU has AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C;
            // the shapes were checked by the caller.
            if unsafe { avx512::tile(ty, n, w, acts, out) } {
                return;
            }
        }
        if level >= Level::Avx2 {
            // SAFETY: `check_level` proved the CPU has AVX2, FMA and F16C; shapes were checked.
            if unsafe { avx2::tile(ty, n, w, acts, out) } {
                return;
            }
        }
    }
    let _ = level;
    for (a, o) in acts.iter().zip(out.iter_mut()) {
        *o = scalar_dot(ty, n, w, a);
    }
}

/// [`vec_dot_rows_at`] at [`kernel_level`].
pub fn vec_dot_rows(ty: GgmlType, n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    vec_dot_rows_at(kernel_level(), ty, n, w, acts, out)
}

/// One weight row against `n_acts` activation rows stored back to back:
/// `out[j] = vec_dot(ty, n, w_row, acts[j * act_row_bytes .. j * act_row_bytes + row])` for
/// `j < n_acts`, where `row` is the activation row length of `n` elements of
/// [`vec_dot_type`]`(ty)` (`act_row_bytes >= row` allows padded rows). Each element is
/// bit-identical to [`crate::vec_dot`] at the same [`kernel_level`], for any `n_acts`.
///
/// The weight row is decoded once per pass of up to [`MAX_TILE`] activation rows, so prefill reads
/// and unpacks each weight block `n_acts / MAX_TILE` times instead of `n_acts` times.
///
/// # Panics
/// As [`vec_dot_rows_at`]; also if `acts` is shorter than `n_acts` rows of `act_row_bytes` or
/// `out` is shorter than `n_acts`.
pub fn vec_dot_tile(
    ty: GgmlType,
    n: usize,
    w_row: &[u8],
    acts: &[u8],
    act_row_bytes: usize,
    n_acts: usize,
    out: &mut [f32],
) {
    vec_dot_tile_at(
        kernel_level(),
        ty,
        n,
        w_row,
        acts,
        act_row_bytes,
        n_acts,
        out,
    )
}

/// [`vec_dot_tile`] at an explicit level.
#[allow(clippy::too_many_arguments)]
pub fn vec_dot_tile_at(
    level: Level,
    ty: GgmlType,
    n: usize,
    w_row: &[u8],
    acts: &[u8],
    act_row_bytes: usize,
    n_acts: usize,
    out: &mut [f32],
) {
    check_level(level);
    let alen = check_shapes(ty, n, w_row);
    assert!(
        act_row_bytes >= alen,
        "vec_dot_tile: act_row_bytes {act_row_bytes} < row {alen}"
    );
    assert!(out.len() >= n_acts, "vec_dot_tile: out shorter than n_acts");
    let need = n_acts
        .checked_sub(1)
        .map_or(Some(0), |k| {
            k.checked_mul(act_row_bytes)
                .and_then(|b| b.checked_add(alen))
        })
        .expect("vec_dot_tile: activation extent overflows");
    assert!(
        acts.len() >= need,
        "vec_dot_tile: {} activation bytes, need {need}",
        acts.len()
    );
    if use_lanes(level, ty, w_row.len()) {
        let w = Rows {
            data: w_row,
            stride: w_row.len(),
            count: 1,
        };
        let act = |j: usize| &acts[j * act_row_bytes..j * act_row_bytes + alen];
        lanes_product(ty, n, &w, n_acts, act, out, 1, 0);
        return;
    }
    let mut j0 = 0;
    while j0 < n_acts {
        let m = (n_acts - j0).min(MAX_TILE);
        let rows: [&[u8]; MAX_TILE] = std::array::from_fn(|k| {
            let j = j0 + k.min(m - 1);
            &acts[j * act_row_bytes..j * act_row_bytes + alen]
        });
        tile(level, ty, n, w_row, &rows[..m], &mut out[j0..j0 + m]);
        j0 += m;
    }
}

/// A set of equally spaced rows in one buffer: row `i` is `data[i * stride..i * stride + len]`,
/// where `len` is the row length the operation expects (`stride >= len`).
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    /// The bytes holding the rows.
    pub data: &'a [u8],
    /// Bytes from the start of one row to the start of the next.
    pub stride: usize,
    /// Number of rows.
    pub count: usize,
}

impl<'a> Rows<'a> {
    /// Rows of exactly `row_bytes` each, back to back.
    pub fn packed(data: &'a [u8], row_bytes: usize) -> Rows<'a> {
        let count = data.len().checked_div(row_bytes).unwrap_or(0);
        Rows {
            data,
            stride: row_bytes,
            count,
        }
    }

    /// Checks that `count` rows of `len` bytes fit in `data`.
    fn check(&self, len: usize, what: &str) {
        assert!(
            self.stride >= len || self.count <= 1,
            "{what}: stride {} < row {len}",
            self.stride
        );
        let need = self
            .count
            .checked_sub(1)
            .map_or(Some(0), |k| {
                k.checked_mul(self.stride).and_then(|b| b.checked_add(len))
            })
            .expect("row extent overflows");
        assert!(
            self.data.len() >= need,
            "{what}: {} bytes, need {need}",
            self.data.len()
        );
    }

    #[inline]
    fn row(&self, i: usize, len: usize) -> &'a [u8] {
        &self.data[i * self.stride..i * self.stride + len]
    }
}

/// Several weight rows against several activation rows:
/// `out[j * out_stride + i] = vec_dot(ty, n, w_i, a_j)` for every weight row `i < w.count` and
/// activation row `j < acts.count` (activation-major, as a `[tokens, rows]` output). Each element
/// is bit-identical to [`crate::vec_dot`] at the same [`kernel_level`].
///
/// Shapes are checked once per call and the kernel is entered once per weight row and pass of up
/// to [`MAX_TILE`] activation rows, so this is the cheapest entry point for both decode (one
/// activation row, many weight rows) and prefill.
///
/// # Panics
/// On programmer error: a type without a dot product, `n` not a whole number of blocks, rows that
/// do not fit their buffers, or `out` too short for `(acts.count - 1) * out_stride + w.count`.
pub fn vec_dot_matrix(
    ty: GgmlType,
    n: usize,
    w: Rows,
    acts: Rows,
    out: &mut [f32],
    out_stride: usize,
) {
    vec_dot_matrix_at(kernel_level(), ty, n, w, acts, out, out_stride)
}

/// [`vec_dot_matrix`] at an explicit level.
pub fn vec_dot_matrix_at(
    level: Level,
    ty: GgmlType,
    n: usize,
    w: Rows,
    acts: Rows,
    out: &mut [f32],
    out_stride: usize,
) {
    check_level(level);
    assert!(has_vec_dot(ty), "vec_dot: no dot product for {ty}");
    let wlen = row_len(ty, n).unwrap_or_else(|e| panic!("vec_dot: {e}"));
    let alen = row_len(vec_dot_type(ty), n).unwrap_or_else(|e| panic!("vec_dot: {e}"));
    w.check(wlen, "vec_dot_matrix weights");
    acts.check(alen, "vec_dot_matrix activations");
    if w.count == 0 || acts.count == 0 {
        return;
    }
    assert!(
        acts.count == 1 || out_stride >= w.count,
        "vec_dot_matrix: out_stride < weight rows"
    );
    let need = (acts.count - 1)
        .checked_mul(out_stride)
        .and_then(|b| b.checked_add(w.count))
        .expect("vec_dot_matrix: output extent overflows");
    assert!(
        out.len() >= need,
        "vec_dot_matrix: out has {} elements, need {need}",
        out.len()
    );
    if use_lanes(level, ty, w.stride) {
        let act = |j: usize| acts.row(j, alen);
        lanes_product(ty, n, &w, acts.count, act, out, out_stride, 1);
        return;
    }
    let mut j0 = 0;
    while j0 < acts.count {
        let m = (acts.count - j0).min(MAX_TILE);
        let rows: [&[u8]; MAX_TILE] = std::array::from_fn(|k| acts.row(j0 + k.min(m - 1), alen));
        let mut g = OutGrid {
            out: &mut *out,
            stride: out_stride,
            j0,
        };
        matrix_pass(level, ty, n, &w, wlen, &rows[..m], &mut g);
        j0 += m;
    }
}

/// Where a matrix pass writes: weight row `i` against activation `k` of the pass goes to
/// `out[(j0 + k) * stride + i]`.
pub(crate) struct OutGrid<'o> {
    out: &'o mut [f32],
    stride: usize,
    j0: usize,
}

impl OutGrid<'_> {
    #[inline(always)]
    fn put(&mut self, i: usize, vals: &[f32]) {
        for (k, v) in vals.iter().enumerate() {
            self.out[(self.j0 + k) * self.stride + i] = *v;
        }
    }
}

/// Every row of `w` against at most [`MAX_TILE`] activation rows; shapes already checked. Each
/// element is computed by the same kernel call as in [`tile`], so it equals [`vec_dot_at`].
fn matrix_pass(
    level: Level,
    ty: GgmlType,
    n: usize,
    w: &Rows,
    wlen: usize,
    acts: &[&[u8]],
    g: &mut OutGrid,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= Level::Avx512 {
            // SAFETY: `check_level` proved AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C; the caller
            // checked that every weight row is `wlen` bytes and every activation row one row.
            if unsafe { avx512::matrix(ty, n, w, wlen, acts, g) } {
                return;
            }
        }
        if level >= Level::Avx2 {
            // SAFETY: `check_level` proved AVX2/FMA/F16C; shapes checked as above.
            if unsafe { avx2::matrix(ty, n, w, wlen, acts, g) } {
                return;
            }
        }
    }
    let _ = level;
    let mut o = [0.0f32; MAX_TILE];
    for i in 0..w.count {
        let wr = w.row(i, wlen);
        for (ok, a) in o.iter_mut().zip(acts) {
            *ok = scalar_dot(ty, n, wr, a);
        }
        g.put(i, &o[..acts.len()]);
    }
}

/// [`crate::quantize_row`] at an explicit level: the SIMD quantizers (Q8_0, Q8_1, Q8_K, F16) are
/// bit-identical to the reference ones for finite input; other types use the reference quantizer.
pub fn quantize_row_at(
    level: Level,
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    check_level(level);
    #[cfg(target_arch = "x86_64")]
    {
        if level >= Level::Avx2
            && matches!(
                ty,
                GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K | GgmlType::F16
            )
        {
            let expected = row_len(ty, src.len())?;
            if dst.len() != expected {
                return Err(QuantError::BadLength {
                    ty,
                    expected,
                    got: dst.len(),
                    what: "destination row",
                });
            }
            // SAFETY: `check_level` proved AVX2/FMA/F16C; lengths were checked above.
            unsafe { quantize::quantize_row(ty, src, dst) };
            return Ok(());
        }
    }
    crate::api::quantize_row_scalar(ty, src, dst)
}
