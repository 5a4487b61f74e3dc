//! SIMD dot products and activation quantizers for x86-64, picked at run time.
//!
//! Four instruction sets ([`Isa`]) exist: `Scalar` (the reference kernels in [`crate::dot`] /
//! [`crate::float`]), `Avx2` (AVX2 + FMA + F16C, 8-bit products with `vpmaddubsw` + `vpmaddwd`),
//! `AvxVnni` (the same with AVX-VNNI's VEX `vpdpbusd` on 256-bit registers: Alder Lake and later)
//! and `Avx512` (AVX-512 F/BW/VL/VNNI). The coarser [`Level`] (scalar, AVX2, AVX-512) is what
//! other crates pick their own vector code by; both AVX2 sets are [`Level::Avx2`]. The CPU is
//! probed once with `is_x86_feature_detected!`; the environment variable
//! `HEARTH_KERNELS=scalar|avx2|avxvnni|avx512` caps the set (one the CPU lacks falls back to the
//! best one below it that it has). Nothing is chosen at compile time, so one binary runs
//! everywhere; on other architectures everything is scalar.
//!
//! Which kernel runs for a weight type, instruction set and number of tokens is one row per type in
//! `crate::traits`. Every SIMD kernel computes exact integer sums per block and then one fixed
//! chain of f32 operations per output element: the chain is defined by the type (see
//! `ymm.rs`, `lanes.rs`), not by the kernel, the instruction set, the number of weight rows or
//! the number of tokens. So a single dot equals the element of any matrix product bit for bit
//! (batch invariance), and every SIMD instruction set gives the same bits as every other; only the
//! scalar oracles (ggml's `*_generic` order) differ, within rounding.
//!
//! Entry points: [`vec_dot_matrix`] (several weight rows × several activation rows, the one to use
//! in a matmul), [`vec_dot_tile`] / [`vec_dot_rows`] (one weight row × several activation rows),
//! and `*_at` twins taking an explicit [`Isa`] (or [`Level`]) for tests and benchmarks;
//! `crate::vec_dot` and `crate::quantize_row` dispatch here too.
//!
//! Activation quants must lie in `-127..=127`, as every quantizer in this crate writes them: the
//! signed 8-bit products use the `sign` trick of llama.cpp, which cannot represent `-(-128)`.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod lanes;
#[cfg(target_arch = "x86_64")]
pub(crate) mod quantize;
#[cfg(target_arch = "x86_64")]
pub(crate) mod ymm;

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

use crate::api::row_len;
use crate::traits::{self, Dot};
use crate::{GgmlType, QuantError};
use std::sync::OnceLock;

/// Most activation rows (tokens) one kernel call takes; longer lists are processed in passes of
/// this many.
pub const PASS: usize = 64;

/// The former tile width, kept for callers that size buffers by it.
pub const MAX_TILE: usize = 4;

/// A kernel level, from slowest to fastest: what other crates pick their own vector code by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// The reference kernels (any architecture).
    Scalar,
    /// AVX2 + FMA + F16C (with or without AVX-VNNI).
    Avx2,
    /// AVX-512 F/BW/VL/VNNI (implies [`Level::Avx2`]).
    Avx512,
}

impl Level {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    /// Parses a level name (`scalar`, `avx2`, `avx512`).
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

/// An instruction set the quant kernels are written for, slowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// The reference kernels (any architecture).
    Scalar,
    /// AVX2 + FMA + F16C, 8-bit products with `vpmaddubsw` + `vpmaddwd` (Haswell, Zen 1-3).
    Avx2,
    /// [`Isa::Avx2`] plus AVX-VNNI: `vpdpbusd` on 256-bit registers, VEX-encoded (Alder Lake,
    /// Zen 5).
    AvxVnni,
    /// AVX-512 F/BW/VL/VNNI with AVX2/FMA/F16C (Skylake-X with VNNI, Ice Lake, Zen 4).
    Avx512,
}

/// Every instruction set, slowest first.
pub const ALL_ISAS: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512];

impl Isa {
    /// Lower-case name, as `HEARTH_KERNELS` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parses a `HEARTH_KERNELS` value.
    pub fn from_name(s: &str) -> Option<Isa> {
        let s = s.trim().to_ascii_lowercase();
        ALL_ISAS.into_iter().find(|i| i.name() == s)
    }

    /// The coarse level this set belongs to.
    pub fn level(self) -> Level {
        match self {
            Isa::Scalar => Level::Scalar,
            Isa::Avx2 | Isa::AvxVnni => Level::Avx2,
            Isa::Avx512 => Level::Avx512,
        }
    }

    /// Whether this CPU runs it.
    pub fn supported(self) -> bool {
        cpu_features().has(self)
    }
}

impl From<Level> for Isa {
    /// A level's baseline set: [`Level::Avx2`] is plain AVX2 (no AVX-VNNI).
    fn from(l: Level) -> Isa {
        match l {
            Level::Scalar => Isa::Scalar,
            Level::Avx2 => Isa::Avx2,
            Level::Avx512 => Isa::Avx512,
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the CPU has, probed once.
#[derive(Clone, Copy, Debug)]
struct Features {
    avx2: bool,
    avxvnni: bool,
    avx512: bool,
}

impl Features {
    fn has(self, isa: Isa) -> bool {
        match isa {
            Isa::Scalar => true,
            Isa::Avx2 => self.avx2,
            Isa::AvxVnni => self.avx2 && self.avxvnni,
            Isa::Avx512 => self.avx512,
        }
    }

    /// The fastest set at most `cap` that the CPU runs.
    fn best(self, cap: Isa) -> Isa {
        ALL_ISAS
            .into_iter()
            .rev()
            .find(|&i| i <= cap && self.has(i))
            .unwrap_or(Isa::Scalar)
    }
}

fn cpu_features() -> Features {
    static CPU: OnceLock<Features> = OnceLock::new();
    *CPU.get_or_init(detect_cpu)
}

#[cfg(target_arch = "x86_64")]
fn detect_cpu() -> Features {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    Features {
        avx2,
        avxvnni: avx2 && is_x86_feature_detected!("avxvnni"),
        avx512: avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_cpu() -> Features {
    Features {
        avx2: false,
        avxvnni: false,
        avx512: false,
    }
}

/// The fastest instruction set this CPU runs (ignores `HEARTH_KERNELS`).
pub fn cpu_isa() -> Isa {
    cpu_features().best(Isa::Avx512)
}

/// The best level this CPU supports (ignores `HEARTH_KERNELS`).
pub fn cpu_level() -> Level {
    cpu_isa().level()
}

/// The instruction set [`crate::vec_dot`], [`vec_dot_matrix`] and [`crate::quantize_row`] use: the
/// CPU's best, capped by `HEARTH_KERNELS` if set. Decided once per process.
pub fn kernel_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let cpu = cpu_features();
        match std::env::var("HEARTH_KERNELS") {
            Ok(v) => match Isa::from_name(&v) {
                Some(want) => cpu.best(want),
                None => {
                    // A typo must not silently pick a level the user did not ask for without a word.
                    eprintln!(
                        "hearth-quant: ignoring HEARTH_KERNELS={v:?} (expected scalar, avx2, avxvnni or avx512)"
                    );
                    cpu.best(Isa::Avx512)
                }
            },
            Err(_) => cpu.best(Isa::Avx512),
        }
    })
}

/// The level of [`kernel_isa`]: what other crates pick their vector code by.
pub fn kernel_level() -> Level {
    kernel_isa().level()
}

/// Every level this CPU can run, slowest first (for tests and benchmarks).
pub fn available_levels() -> Vec<Level> {
    [Level::Scalar, Level::Avx2, Level::Avx512]
        .into_iter()
        .filter(|&l| l <= cpu_level())
        .collect()
}

/// Every instruction set this CPU can run, slowest first (for tests and benchmarks).
pub fn available_isas() -> Vec<Isa> {
    ALL_ISAS.into_iter().filter(|i| i.supported()).collect()
}

fn check_isa(isa: Isa) {
    assert!(
        isa.supported(),
        "kernel set {isa} requested but this CPU does not run it (best: {})",
        cpu_isa()
    );
}

/// The dot-product row of `ty` and the activation row length of `n` elements; checks the weight
/// row length `wlen` is one row of `n` elements.
fn dot_shapes(ty: GgmlType, n: usize) -> (&'static Dot, usize, usize) {
    let dot = traits::dot(ty).unwrap_or_else(|| panic!("vec_dot: no dot product for {ty}"));
    let wlen = row_len(ty, n).unwrap_or_else(|e| panic!("vec_dot: {e}"));
    let alen = row_len(dot.act, n).unwrap_or_else(|e| panic!("vec_dot: {e}"));
    (dot, wlen, alen)
}

/// [`crate::vec_dot`] at an explicit instruction set (which the CPU must run).
///
/// # Panics
/// As [`crate::vec_dot`], and if the CPU cannot run `isa`.
pub fn vec_dot_at(isa: impl Into<Isa>, ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0.0f32];
    vec_dot_rows_at(isa, ty, n, w, &[a], &mut out);
    out[0]
}

/// Weight rows a one-token call of the AVX-512 lanes kernels (16-row blocks) prefetches before it
/// starts: the blocks computed before the kernel's own prefetch of the block after next gets ahead
/// of the loads. (The AVX2 ones prefetch the first rows of each of their lanes instead.)
#[cfg(target_arch = "x86_64")]
const PREFETCH_FIRST_ROWS: usize = 32;

/// Prefetches (into L2) the first [`PREFETCH_FIRST_ROWS`] rows of a one-token call of the lanes
/// kernels. Decode streams the weights from memory, and a call starts a new stream: without this
/// its first rows wait on one load after another. With decode tasks of half a small matrix,
/// SmolLM2 decode 139 -> 144 t/s on AVX-512, 129 -> 135 on AVX2 (medians of 5-6 alternating runs,
/// Zen 4). Not for the one-row K-quant kernels, which read a row front to back and which the
/// hardware prefetchers follow: with it, the 12-layer MoE shape's decode lost 3-5%. (The AVX2
/// ones prefetch a fixed distance ahead of where they read instead: Zen 1's prefetchers fall
/// behind.)
#[cfg(target_arch = "x86_64")]
pub(crate) fn prefetch_first_rows(w: &Rows) {
    prefetch_l2(&w.data[..(PREFETCH_FIRST_ROWS * w.stride).min(w.data.len())]);
}

/// Asks for every 64-byte line of `x` to be brought into the L2 cache (`prefetcht1`; nothing where
/// the instruction set has no such hint). For data read soon, in an order the hardware prefetchers
/// do not follow.
pub fn prefetch_l2<T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let (first, count) = lines(x);
        for i in 0..count {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
            // SAFETY: a prefetch never faults (the address is not dereferenced).
            unsafe { _mm_prefetch::<_MM_HINT_T1>(first.wrapping_add(64 * i).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// The 64-byte lines `x` touches: the first one's address and how many. Stepping 64 bytes from
/// `x`'s start instead leaves out the last line of a slice that does not start on one.
fn lines<T>(x: &[T]) -> (*const u8, usize) {
    let r = x.as_ptr_range();
    let (start, end) = (r.start as usize, r.end as usize);
    let first = start - start % 64;
    let count = if end > start {
        (end - first).div_ceil(64)
    } else {
        0
    };
    (r.start.cast::<u8>().wrapping_sub(start % 64), count)
}

#[cfg(test)]
mod line_tests {
    use super::lines;

    #[test]
    fn a_prefetch_covers_every_line_a_slice_touches() {
        #[repr(align(64))]
        struct Buf([u8; 512]);
        let b = Buf([0; 512]);
        let line0 = b.0.as_ptr();
        let at = |from: usize, to: usize| {
            let (first, count) = lines(&b.0[from..to]);
            ((first as usize - line0 as usize) / 64, count)
        };
        assert_eq!(at(0, 64), (0, 1));
        assert_eq!(at(60, 196), (0, 4)); // 136 bytes over lines 0..=3 (stepping from 60: 3)
        assert_eq!(at(63, 65), (0, 2));
        assert_eq!(at(128, 129), (2, 1));
        assert_eq!(at(100, 100).1, 0);
    }
}

/// Every row of `w` (each `wlen` bytes) against every row of `acts` (each one activation row of
/// `n` elements), shapes already checked: element (row `i`, token `j`) goes to
/// `out[j * tok_stride + i * row_stride]`. The one place a kernel is picked: the type's row of
/// `crate::traits` for `isa` and the number of tokens.
#[allow(clippy::too_many_arguments)]
fn product(
    isa: Isa,
    dot: &Dot,
    n: usize,
    w: &Rows,
    wlen: usize,
    acts: &[&[u8]],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    if w.count == 0 || acts.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = dot.kernels(isa) {
        let f = if acts.len() == 1 { k.one } else { k.many };
        for (p, pass) in acts.chunks(PASS).enumerate() {
            // SAFETY: `check_isa` proved the CPU runs `isa` (every caller checks); the callers
            // checked that every weight row is one row of `n` elements (`wlen` bytes), every
            // activation row one activation row, and that `out` holds every element written.
            unsafe {
                f(
                    n,
                    w,
                    pass,
                    &mut out[p * PASS * tok_stride..],
                    tok_stride,
                    row_stride,
                )
            };
        }
        return;
    }
    let _ = isa;
    for i in 0..w.count {
        let wr = w.row(i, wlen);
        for (j, a) in acts.iter().enumerate() {
            out[j * tok_stride + i * row_stride] = (dot.scalar)(n, wr, a);
        }
    }
}

/// One weight row against several activation rows at an explicit instruction set:
/// `out[j] = w · acts[j]`, each element bit-identical to [`vec_dot_at`]`(isa, ty, n, w, acts[j])`.
///
/// # Panics
/// On programmer error: a type without a dot product, `n` not a whole number of blocks, rows of
/// the wrong length, `out.len() != acts.len()`, or a set the CPU cannot run.
pub fn vec_dot_rows_at(
    isa: impl Into<Isa>,
    ty: GgmlType,
    n: usize,
    w: &[u8],
    acts: &[&[u8]],
    out: &mut [f32],
) {
    let isa = isa.into();
    check_isa(isa);
    let (dot, wlen, alen) = dot_shapes(ty, n);
    assert!(
        w.len() == wlen,
        "vec_dot {ty}: weight row of {} bytes, expected {wlen}",
        w.len()
    );
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
    let w = Rows {
        data: w,
        stride: wlen,
        count: 1,
    };
    product(isa, dot, n, &w, wlen, acts, out, 1, 0);
}

/// [`vec_dot_rows_at`] at [`kernel_isa`].
pub fn vec_dot_rows(ty: GgmlType, n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    vec_dot_rows_at(kernel_isa(), ty, n, w, acts, out)
}

/// One weight row against `n_acts` activation rows stored back to back:
/// `out[j] = vec_dot(ty, n, w_row, acts[j * act_row_bytes .. j * act_row_bytes + row])` for
/// `j < n_acts`, where `row` is the activation row length of `n` elements of
/// [`crate::vec_dot_type`]`(ty)` (`act_row_bytes >= row` allows padded rows). Each element is
/// bit-identical to [`crate::vec_dot`] at the same [`kernel_isa`], for any `n_acts`.
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
    vec_dot_tile_at(kernel_isa(), ty, n, w_row, acts, act_row_bytes, n_acts, out)
}

/// [`vec_dot_tile`] at an explicit instruction set.
#[allow(clippy::too_many_arguments)]
pub fn vec_dot_tile_at(
    isa: impl Into<Isa>,
    ty: GgmlType,
    n: usize,
    w_row: &[u8],
    acts: &[u8],
    act_row_bytes: usize,
    n_acts: usize,
    out: &mut [f32],
) {
    let wlen = row_len(ty, n).unwrap_or_else(|e| panic!("vec_dot: {e}"));
    assert!(
        w_row.len() == wlen,
        "vec_dot {ty}: weight row of {} bytes, expected {wlen}",
        w_row.len()
    );
    assert!(out.len() >= n_acts, "vec_dot_tile: out shorter than n_acts");
    let w = Rows {
        data: w_row,
        stride: wlen,
        count: 1,
    };
    // Checked there: the activation rows fit `acts` and `act_row_bytes` is at least a row.
    let a = Rows {
        data: acts,
        stride: act_row_bytes,
        count: n_acts,
    };
    vec_dot_matrix_at(isa, ty, n, w, a, out, 1)
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

    /// Row `i` (of `len` bytes).
    #[inline]
    pub(crate) fn row(&self, i: usize, len: usize) -> &'a [u8] {
        &self.data[i * self.stride..i * self.stride + len]
    }
}

/// Several weight rows against several activation rows:
/// `out[j * out_stride + i] = vec_dot(ty, n, w_i, a_j)` for every weight row `i < w.count` and
/// activation row `j < acts.count` (activation-major, as a `[tokens, rows]` output). Each element
/// is bit-identical to [`crate::vec_dot`] at the same [`kernel_isa`].
///
/// Shapes are checked once per call and the kernel is entered once per pass of up to [`PASS`]
/// activation rows, so this is the cheapest entry point for both decode (one activation row, many
/// weight rows) and prefill.
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
    vec_dot_matrix_at(kernel_isa(), ty, n, w, acts, out, out_stride)
}

/// [`vec_dot_matrix`] at an explicit instruction set.
pub fn vec_dot_matrix_at(
    isa: impl Into<Isa>,
    ty: GgmlType,
    n: usize,
    w: Rows,
    acts: Rows,
    out: &mut [f32],
    out_stride: usize,
) {
    let isa = isa.into();
    check_isa(isa);
    let (dot, wlen, alen) = dot_shapes(ty, n);
    let what = [
        "vec_dot_matrix",
        "vec_dot_matrix weights",
        "vec_dot_matrix activations",
    ];
    if !check_matrix(what, &w, wlen, &acts, alen, out.len(), out_stride) {
        return;
    }
    for_passes(&acts, alen, |j0, rows| {
        product(
            isa,
            dot,
            n,
            &w,
            wlen,
            rows,
            &mut out[j0 * out_stride..],
            out_stride,
            1,
        );
    });
}

/// Checks the shapes of a product of `w` (rows of `wlen` bytes) with `acts` (rows of `alen`)
/// into `out_len` elements, `out_stride` apart per token (`[what, weights, activations]` name it and
/// its operands in panics: static, the hot path does not format); false when there is nothing to
/// compute.
fn check_matrix(
    [what, what_w, what_a]: [&str; 3],
    w: &Rows,
    wlen: usize,
    acts: &Rows,
    alen: usize,
    out_len: usize,
    out_stride: usize,
) -> bool {
    w.check(wlen, what_w);
    acts.check(alen, what_a);
    if w.count == 0 || acts.count == 0 {
        return false;
    }
    assert!(
        acts.count == 1 || out_stride >= w.count,
        "{what}: out_stride < weight rows"
    );
    let need = (acts.count - 1)
        .checked_mul(out_stride)
        .and_then(|b| b.checked_add(w.count))
        .unwrap_or_else(|| panic!("{what}: output extent overflows"));
    assert!(
        out_len >= need,
        "{what}: out has {out_len} elements, need {need}"
    );
    true
}

/// Calls `f(j0, rows)` for the activation rows in passes of at most [`PASS`], `j0` the first.
fn for_passes(acts: &Rows, alen: usize, mut f: impl FnMut(usize, &[&[u8]])) {
    let mut j0 = 0;
    while j0 < acts.count {
        let m = (acts.count - j0).min(PASS);
        // Only the pass's rows are sliced: all `PASS` of them (64 bounds-checked slices a call)
        // made this function 0.94% of the samples of `hearth bench --parallel 8` on SmolLM2,
        // 0.62% after (`perf`, Zen 3).
        let mut rows: [&[u8]; PASS] = [&[]; PASS];
        for (k, r) in rows[..m].iter_mut().enumerate() {
            *r = acts.row(j0 + k, alen);
        }
        f(j0, &rows[..m]);
        j0 += m;
    }
}

/// Whether [`vec_dot_matrix_interleaved_at`] has kernels of `isa` for interleaved rows of `ty`
/// ([`crate::interleave`]): what a loader rewrites its weights for. Elsewhere the product still
/// works, through a copy of each group in the file's layout, but slowly.
///
/// AVX-512 machines interleave too, and their kernels read the groups for any number of tokens.
///
/// - Few tokens (one of Q4_K or Q6_K, two of a legacy format) on 256-bit registers, which
///   stream better than the 512-bit kernels over the file's rows (one thread, in L2 of an Intel
///   Xeon with AVX-512 and AVX-VNNI, one token, GB/s: Q4_1 20.0 against 46.1, Q8_0 22.9 against
///   65.1, Q4_K 21.5 against 34.3, Q6_K 27.5 against 26.1).
/// - More through the 512-bit kernel loading the groups itself (`lanes::q4_k_grouped`,
///   `lanes::q6_k_grouped`, `lanes::q4_1_grouped` and the like) into the registers it makes of the
///   file's rows, faster than from those, which it transposes (one thread, in L2, 1536 × 576
///   legacy, 768 × 2048 K-quants, G multiply-adds/s, 8 tokens: Q4_1 128.5 against 101.6, Q8_0
///   111.4 against 79.5, Q4_K 143.5 against 132.4, Q6_K 108.1 against 90.8).
pub fn interleaved_kernels(isa: impl Into<Isa>, ty: GgmlType) -> bool {
    let isa = isa.into();
    crate::interleave::has_interleaved(ty)
        && cfg!(target_arch = "x86_64")
        && matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512)
}

/// Most tokens a product over interleaved legacy rows at AVX-512 takes on 256-bit registers
/// (`ymm::legacy_groups`); more go through the 512-bit kernel. `prefill_min`, 1536 x 576 (in
/// L2), one thread on an Intel Xeon, G multiply-adds/s of Q4_0 / Q4_1 / Q8_0, 256-bit against
/// 512-bit: 2 tokens 87.8 / 89.3 / 70.5 against 56.9 / 71.4 / 54.9; 3 tokens 77.3 / 75.0 / 60.2
/// against 73.5 / 88.0 / 70.9; 4 tokens 86.4 / 81.3 / 65.5 against 86.7 / 104.2 / 84.3; 8
/// tokens (256-bit on AVX-VNNI) 102.6 / 95.1 / 72.9 against 112.9 / 128.5 / 111.4.
const LEGACY_YMM_TOKENS: usize = 2;

/// [`vec_dot_matrix`] over rows rewritten by [`crate::interleave::interleave`]: the same elements,
/// bit for bit, as [`vec_dot_matrix`] over the rows in the file's layout. `w` holds whole groups
/// of [`crate::interleave::group_rows`] rows, back to back.
pub fn vec_dot_matrix_interleaved(
    ty: GgmlType,
    n: usize,
    w: Rows,
    acts: Rows,
    out: &mut [f32],
    out_stride: usize,
) {
    vec_dot_matrix_interleaved_at(kernel_isa(), ty, n, w, acts, out, out_stride)
}

/// [`vec_dot_matrix_interleaved`] at an explicit instruction set.
///
/// # Panics
/// As [`vec_dot_matrix_at`], and if `ty` has no interleaved layout or `w` is not whole groups of
/// rows back to back.
pub fn vec_dot_matrix_interleaved_at(
    isa: impl Into<Isa>,
    ty: GgmlType,
    n: usize,
    w: Rows,
    acts: Rows,
    out: &mut [f32],
    out_stride: usize,
) {
    use crate::interleave::{group_rows, has_interleaved};
    let isa = isa.into();
    check_isa(isa);
    let (_, wlen, alen) = dot_shapes(ty, n);
    assert!(
        has_interleaved(ty),
        "vec_dot_matrix_interleaved: {ty} has no interleaved layout"
    );
    let group_rows = group_rows(ty);
    assert!(
        w.count % group_rows == 0 && (w.stride == wlen || w.count == 0),
        "vec_dot_matrix_interleaved: {} rows of stride {} (whole groups of {group_rows} rows of {wlen} bytes)",
        w.count,
        w.stride
    );
    let what = [
        "vec_dot_matrix_interleaved",
        "vec_dot_matrix_interleaved weights",
        "vec_dot_matrix_interleaved activations",
    ];
    if !check_matrix(what, &w, wlen, &acts, alen, out.len(), out_stride) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if interleaved_kernels(isa, ty) {
        // Legacy formats: `ymm::legacy_groups` for any number of tokens. K-quants, one or two
        // tokens (decode): each unpacked register serves both, four rows share each scale
        // multiply. More: the 8-lane kernels, which unpack 8 rows once for up to 64
        // tokens, read the groups as the file's transposed chunks. 768 x 2048 on Zen 4, one
        // thread, G multiply-adds/s, one-group kernel against 8-lane for 2 / 3 / 4 / 16 tokens:
        // Q4_K 52.6 / 57.3 / 57.9 / 57.8 against 50.2 / 64.2 / 74.6 / 107.6, Q6_K 41.2 / 48.5 /
        // 51.9 / 53.0 against 36.5 / 48.5 / 56.7 / 90.9.
        use ymm::interleaved as il;
        use ymm::legacy_groups as lg;
        // AVX-512: many tokens through the 512-bit kernel loading the groups, the legacy
        // formats' few with AVX-512 VNNI on 256-bit registers, the K-quants' one token with the
        // AVX2 kernels (the many-token arms below are AVX-VNNI's only where the CPU has it).
        let vnni = isa == Isa::AvxVnni;
        let legacy: Option<[traits::MatrixFn; 4]> = match ty {
            GgmlType::Q4_0 => Some([
                lg::q4_0,
                lg::q4_0_vnni,
                lg::q4_0_avx512,
                lanes::q4_0_grouped,
            ]),
            GgmlType::Q4_1 => Some([
                lg::q4_1,
                lg::q4_1_vnni,
                lg::q4_1_avx512,
                lanes::q4_1_grouped,
            ]),
            GgmlType::Q5_0 => Some([
                lg::q5_0,
                lg::q5_0_vnni,
                lg::q5_0_avx512,
                lanes::q5_0_grouped,
            ]),
            GgmlType::Q5_1 => Some([
                lg::q5_1,
                lg::q5_1_vnni,
                lg::q5_1_avx512,
                lanes::q5_1_grouped,
            ]),
            GgmlType::Q8_0 => Some([
                lg::q8_0,
                lg::q8_0_vnni,
                lg::q8_0_avx512,
                lanes::q8_0_grouped,
            ]),
            GgmlType::IQ4_NL => Some([
                lg::iq4_nl,
                lg::iq4_nl_vnni,
                lg::iq4_nl_avx512,
                lanes::iq4_nl_grouped,
            ]),
            _ => None,
        };
        let f: traits::MatrixFn = match legacy {
            None if isa == Isa::Avx512 && acts.count > 1 => match ty {
                GgmlType::Q6_K => lanes::q6_k_grouped,
                _ => lanes::q4_k_grouped,
            },
            Some([avx2, vex, evex, zmm]) => match isa {
                Isa::Avx2 => avx2,
                Isa::AvxVnni => vex,
                _ if acts.count <= LEGACY_YMM_TOKENS => evex,
                _ => zmm,
            },
            None => match (ty, acts.count <= 2, vnni) {
                (GgmlType::Q6_K, true, _) => il::q6_k,
                (_, true, _) => il::q4_k,
                (GgmlType::Q6_K, false, false) => il::q6_k_many,
                (GgmlType::Q6_K, false, true) => il::q6_k_many_vnni,
                (_, false, false) => il::q4_k_many,
                (_, false, true) => il::q4_k_many_vnni,
            },
        };
        for_passes(&acts, alen, |j0, rows| {
            // SAFETY: `check_isa` proved the CPU runs `isa` (AVX2 and more); the rows, the
            // activations and `out` were checked above.
            unsafe { f(n, &w, rows, &mut out[j0 * out_stride..], out_stride, 1) };
        });
        return;
    }
    // Elsewhere: the file's layout back, a few groups at a time into a scratch buffer, and the
    // plain product over it.
    UNGROUPED.with(|buf| {
        let mut buf = buf.borrow_mut();
        let chunk = UNGROUP_ROWS * wlen;
        if buf.len() < chunk {
            buf.resize(chunk, 0);
        }
        let group = group_rows * wlen;
        for (c, part) in w.data[..w.count * wlen].chunks(chunk).enumerate() {
            let rows = &mut buf[..part.len()];
            for (g, dst) in part.chunks_exact(group).zip(rows.chunks_exact_mut(group)) {
                crate::interleave::ungroup(ty, n, g, dst);
            }
            let wr = Rows::packed(rows, wlen);
            vec_dot_matrix_at(
                isa,
                ty,
                n,
                wr,
                acts,
                &mut out[c * UNGROUP_ROWS..],
                out_stride,
            );
        }
    });
}

/// Rows put back in the file's layout at a time by [`vec_dot_matrix_interleaved_at`] where it has
/// no kernels: enough for the register-blocked kernels' blocks of 8 and 16 rows, few enough to
/// stay in L1/L2 until the product reads them.
const UNGROUP_ROWS: usize = 32;

thread_local! {
    /// [`vec_dot_matrix_interleaved_at`]'s rows in the file's layout, grown once per thread.
    static UNGROUPED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`crate::quantize_row`] at an explicit instruction set: the SIMD quantizers (Q8_0, Q8_1,
/// Q8_K, F16) are bit-identical to the reference ones for every input; other types use the
/// reference quantizer.
pub fn quantize_row_at(
    isa: impl Into<Isa>,
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    let isa = isa.into();
    check_isa(isa);
    let t = traits::get(ty).ok_or(QuantError::NoQuantizer(ty))?;
    let expected = row_len(ty, src.len())?;
    if dst.len() != expected {
        return Err(QuantError::BadLength {
            ty,
            expected,
            got: dst.len(),
            what: "destination row",
        });
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        if let Some(q) = t.quantize_avx2 {
            // SAFETY: `check_isa` proved AVX2/FMA/F16C; lengths were checked above.
            unsafe { q(src, dst) };
            return Ok(());
        }
    }
    (t.quantize)(src, dst);
    Ok(())
}
