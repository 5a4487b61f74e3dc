//! AVX2 register-blocked kernels: 8 weight rows in the 8 lanes of a 256-bit register.
//!
//! The AVX2 counterpart of `lanes.rs`. A block of 8 weight rows is loaded a chunk of K at a time,
//! transposed in registers (row `r` in lane `r`: register `k` holds bytes `4k..4k + 4` of every
//! row) and unpacked once into 8-bit quants; each activation dword is then broadcast and one
//! 8-bit product step adds the partial sums of the 8 rows at once, every unpacked register serving
//! up to 4 tokens. The per-block f32 work (one convert, one multiply, one FMA) serves 8 outputs.
//!
//! The 8-bit product is a [`Dp`]: `vpmaddubsw` + `vpmaddwd` on plain AVX2 ([`Madd`]; products of
//! small quants are first added as i16, which cannot overflow for the depths each format uses), or
//! `vpdpbusd` on 256-bit registers with AVX-VNNI ([`VexVnni`]) or AVX-512 VNNI ([`EvexVnni`]).
//! The integers are exact either way, so all three give the same bits.
//!
//! Batch invariance and agreement with `lanes.rs`: an output element lives in one lane, and its
//! value is the f32 chain of its type, `acc = fma(dx * dy, isum_b, acc)` over blocks `b` in order
//! (plus, for formats with a minimum, a second chain combined at the end), with `isum_b` an exact
//! integer. That chain is the one the AVX-512 kernels compute, so every SIMD instruction set gives
//! the same bits for every element, whatever the number of weight rows, tokens or their grouping.

use std::arch::x86_64::*;
use std::cell::UnsafeCell;
use std::ptr::read_unaligned;

use super::Rows;
use crate::simd::PASS;

pub(crate) mod floats;
pub(crate) mod interleaved;
pub(crate) mod kquants;
pub(crate) mod legacy;
pub(crate) mod legacy_groups;
pub(crate) mod rows;

/// Weight rows per register.
pub(super) const LANES: usize = 8;

/// The 8-bit integer product: `acc + Σ w * y` over the 4 bytes of each i32 lane, `w` unsigned
/// (0..=255), `y` signed (-127..=127).
pub(crate) trait Dp {
    /// Products accumulate straight into i32 (VNNI): no i16 grouping helps.
    const VNNI: bool;
    unsafe fn dp(acc: __m256i, w: __m256i, y: __m256i) -> __m256i;
    /// `acc + madd(x, s)`: i16 pairs times i16 pairs, summed into i32 lanes.
    unsafe fn madd_acc(acc: __m256i, x: __m256i, s: __m256i) -> __m256i;
}

/// `vpmaddubsw` + `vpmaddwd` (AVX2).
pub(crate) struct Madd;

impl Dp for Madd {
    const VNNI: bool = false;
    #[inline(always)]
    unsafe fn dp(acc: __m256i, w: __m256i, y: __m256i) -> __m256i {
        _mm256_add_epi32(
            acc,
            _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), _mm256_set1_epi16(1)),
        )
    }
    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, x: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(x, s))
    }
}

/// AVX-VNNI `vpdpbusd` / `vpdpwssd` (VEX, 256-bit).
pub(crate) struct VexVnni;

impl Dp for VexVnni {
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dp(acc: __m256i, w: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, w, y)
    }
    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, x: __m256i, s: __m256i) -> __m256i {
        _mm256_dpwssd_avx_epi32(acc, x, s)
    }
}

/// AVX-512 VNNI `vpdpbusd` / `vpdpwssd` on 256-bit registers (EVEX; CPUs with AVX-512 but not
/// AVX-VNNI, such as Zen 4).
pub(crate) struct EvexVnni;

impl Dp for EvexVnni {
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dp(acc: __m256i, w: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, w, y)
    }
    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, x: __m256i, s: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, x, s)
    }
}

#[inline(always)]
pub(super) unsafe fn bcast(p: *const u8) -> __m256i {
    _mm256_set1_epi32(read_unaligned(p.cast::<i32>()))
}

#[inline(always)]
pub(super) unsafe fn bcast_f(p: *const f32) -> __m256 {
    _mm256_set1_ps(read_unaligned(p))
}

#[inline(always)]
pub(super) unsafe fn nib_lo(v: __m256i) -> __m256i {
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

#[inline(always)]
pub(super) unsafe fn nib_hi(v: __m256i) -> __m256i {
    _mm256_and_si256(_mm256_srli_epi32(v, 4), _mm256_set1_epi8(0x0f))
}

/// The two f16 halves of each lane as f32: (low halves, high halves).
#[inline(always)]
pub(super) unsafe fn halves_f32(v: __m256i) -> (__m256, __m256) {
    let idx = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7,
        10, 11, 14, 15,
    );
    // [lo0..lo3, hi0..hi3 | lo4..lo7, hi4..hi7] -> [lo0..lo7 | hi0..hi7]
    let s = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(v, idx));
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(s)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(s)),
    )
}

/// The f16 in the low half of each lane as f32.
#[inline(always)]
pub(super) unsafe fn low_f32(v: __m256i) -> __m256 {
    halves_f32(v).0
}

/// Most dwords of one chunk of one row (Q8_0: 16 blocks of 34 bytes).
const MAX_DW: usize = 136;

/// A chunk of 8 rows, transposed: `d[k]` lane `r` is dword `k` (bytes `4k..4k + 4`) of row `r`.
pub(crate) struct TChunk {
    d: [__m256i; MAX_DW],
}

impl TChunk {
    /// The 4 bytes at `off` (even) of every row.
    #[inline(always)]
    pub(crate) unsafe fn dw(&self, off: usize) -> __m256i {
        let i = off / 4;
        if off % 4 == 0 {
            self.d[i]
        } else {
            // Upper half of dword i and lower half of dword i + 1.
            _mm256_or_si256(
                _mm256_srli_epi32(self.d[i], 16),
                _mm256_slli_epi32(self.d[i + 1], 16),
            )
        }
    }

    /// Loads `len` bytes at `off` of each row `rows[l]` and transposes them. The loads are 16
    /// bytes wide and may read up to 15 bytes past `len` (bytes of the next row, or padding): where
    /// that would leave the weight buffer (`end`), which only the last block of rows can do, the
    /// rows are first copied into a zero-padded buffer.
    #[inline(always)]
    pub(super) unsafe fn load(
        &mut self,
        rows: &[*const u8; LANES],
        end: *const u8,
        off: usize,
        len: usize,
    ) {
        debug_assert!(len <= 4 * MAX_DW);
        let wide = len.next_multiple_of(16);
        let last = rows.iter().map(|r| *r as usize).max().unwrap_or(0);
        if last + off + wide <= end as usize {
            return self.load_in(rows, off, len);
        }
        // The bytes a row does not have before `end` stay zero; they are never used.
        let mut buf = [[0u8; 4 * MAX_DW + 16]; LANES];
        let mut copies = [std::ptr::null::<u8>(); LANES];
        for l in 0..LANES {
            let src = rows[l].add(off);
            let n = len.min((end as usize).saturating_sub(src as usize));
            std::ptr::copy_nonoverlapping(src, buf[l].as_mut_ptr(), n);
            copies[l] = buf[l].as_ptr();
        }
        self.load_in(&copies, 0, len)
    }

    /// [`TChunk::load`] where every row has `len` rounded up to 16 readable bytes at `off`.
    #[inline(always)]
    unsafe fn load_in(&mut self, rows: &[*const u8; LANES], off: usize, len: usize) {
        let mut done = 0;
        while done < len {
            let i = done / 4;
            if len - done <= 16 {
                let t = load_t4(rows, off + done);
                self.d[i..i + 4].copy_from_slice(&t);
                break;
            }
            let t = load_t8(rows, off + done);
            self.d[i..i + 8].copy_from_slice(&t);
            done += 32;
        }
    }
}

/// Rows `l` and `l + 4` of the 16 bytes at `at`, in the low and high 128-bit lanes.
#[inline(always)]
unsafe fn pair16(rows: &[*const u8; LANES], l: usize, at: usize) -> __m256i {
    _mm256_inserti128_si256::<1>(
        _mm256_castsi128_si256(_mm_loadu_si128(rows[l].add(at).cast())),
        _mm_loadu_si128(rows[l + 4].add(at).cast()),
    )
}

/// In-lane 4 x 4 transpose: `z[i]` holds 4 dwords of row `i` (low lane) and row `i + 4` (high
/// lane); afterwards register `k` holds dword `k` of rows 0..8 in lane order.
#[inline(always)]
unsafe fn transpose4(z: [__m256i; 4]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm256_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

/// Dwords `0..4` of the 16 bytes at `at` of each row, transposed.
#[inline(always)]
pub(super) unsafe fn load_t4(rows: &[*const u8; LANES], at: usize) -> [__m256i; 4] {
    transpose4([
        pair16(rows, 0, at),
        pair16(rows, 1, at),
        pair16(rows, 2, at),
        pair16(rows, 3, at),
    ])
}

/// Dwords `0..8` of the 32 bytes at `at` of each row, transposed: two 128-bit halves per row pair
/// and in-lane 4 x 4 transposes (no cross-lane shuffles).
#[inline(always)]
pub(super) unsafe fn load_t8(rows: &[*const u8; LANES], at: usize) -> [__m256i; 8] {
    let a = load_t4(rows, at);
    let b = load_t4(rows, at + 16);
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// A weight format unpacked for 8 lanes, paired with its activation format.
pub(crate) trait Fmt {
    /// Elements per block.
    const BS: usize;
    /// Bytes of one weight block and of one activation block.
    const WB: usize;
    const AB: usize;
    /// Blocks unpacked at a time (at most what [`TChunk`] and `P` hold).
    const CHUNK: usize;
    /// `CHUNK` blocks of 8 rows, unpacked.
    type P;
    /// What a token needs per block besides its raw block (converted scales, sums).
    type Q: Copy;
    /// Unpacks `cn` blocks from the transposed chunk.
    unsafe fn pack<D: Dp>(src: &TChunk, cn: usize, p: &mut Self::P);
    /// Prepares one activation block.
    unsafe fn prep(a: *const u8, q: &mut Self::Q);
    /// Block `b` of the chunk against `T` tokens (`a[t]`, `q[t]`: the token's block `b`).
    unsafe fn step<D: Dp, const T: usize>(
        p: &Self::P,
        b: usize,
        a: &[*const u8; T],
        q: &[*const Self::Q; T],
        acc: &mut [__m256; T],
        accm: &mut [__m256; T],
    );
    /// Blocks `0..cn` of the transposed chunk against one token (`a`, `q`: the token's first block
    /// of the chunk), unpacked and used in registers (no store of the unpacked chunk): the same
    /// operations per output as `pack` then `step`.
    unsafe fn one_token<D: Dp>(
        src: &TChunk,
        cn: usize,
        p: &mut Self::P,
        a: *const u8,
        q: *const Self::Q,
        acc: &mut __m256,
        accm: &mut __m256,
    );
    /// Whether [`Fmt::one_token_direct`] exists: the format's blocks are whole 16- and 32-byte
    /// loads, so one token can transpose them in registers without the [`TChunk`] round trip.
    const DIRECT: bool = false;
    /// [`Fmt::one_token`] for one block (`CHUNK` is 1) read straight from the 8 rows at byte
    /// offset `off`, transposed in registers: the same operations per output.
    #[allow(clippy::too_many_arguments)]
    unsafe fn one_token_direct<D: Dp>(
        _rows: &[*const u8; LANES],
        _off: usize,
        _p: &mut Self::P,
        _a: *const u8,
        _acc: &mut __m256,
        _accm: &mut __m256,
    ) {
        // Only called where `DIRECT` is true (a constant), and every such format overrides it.
        unreachable!("one_token_direct of a format without DIRECT")
    }
    /// Blocks per period of [`Fmt::one_token_stream`]; 0 where the format has none.
    const STREAM: usize = 0;
    /// Prepares the activation row (`nb` blocks) for [`Fmt::one_token_stream`] into `buf` (`bytes`:
    /// scratch).
    unsafe fn stream_acts(
        _a: *const u8,
        _nb: usize,
        _buf: &mut Vec<__m256i>,
        _bytes: &mut Vec<u8>,
    ) {
    }
    /// [`Fmt::one_token`] for blocks `b0..b0 + n` (`n` a multiple of [`Fmt::STREAM`]) read straight
    /// from the 8 rows a 16-byte window at a time and transposed in registers, each 4-byte window
    /// used as it arrives (no [`TChunk`] round trip, no realigning of blocks that do not start on
    /// a dword): the same integers per block and the same f32 chain. `acts` is what
    /// [`Fmt::stream_acts`] made, `q` the row's first prepared block.
    #[allow(clippy::too_many_arguments)]
    unsafe fn one_token_stream<D: Dp>(
        _rows: &[*const u8; LANES],
        _b0: usize,
        _n: usize,
        _acts: &[__m256i],
        _q: *const Self::Q,
        _acc: &mut __m256,
        _accm: &mut __m256,
    ) {
        // Only called where `STREAM` is nonzero (a constant), and every such format overrides it.
        unreachable!("one_token_stream of a format without STREAM")
    }
    /// The output from the two chains.
    unsafe fn finish(acc: __m256, accm: __m256) -> __m256;
}

/// `T` tokens from `j` through one chunk, accumulators loaded from and stored back to memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn group<F: Fmt, D: Dp, const T: usize>(
    p: &F::P,
    cn: usize,
    c0: usize,
    nb: usize,
    a: &[*const u8; PASS],
    q: *const F::Q,
    j: usize,
    acc: &mut [__m256; PASS],
    accm: &mut [__m256; PASS],
) {
    let mut ac = [_mm256_setzero_ps(); T];
    let mut am = [_mm256_setzero_ps(); T];
    ac.copy_from_slice(&acc[j..j + T]);
    am.copy_from_slice(&accm[j..j + T]);
    for b in 0..cn {
        let mut ab = [std::ptr::null::<u8>(); T];
        let mut qb = [std::ptr::null::<F::Q>(); T];
        for t in 0..T {
            ab[t] = a[j + t].add((c0 + b) * F::AB);
            qb[t] = q.add((j + t) * nb + c0 + b);
        }
        F::step::<D, T>(p, b, &ab, &qb, &mut ac, &mut am);
    }
    acc[j..j + T].copy_from_slice(&ac);
    accm[j..j + T].copy_from_slice(&am);
}

/// Per-thread scratch: the unpacked chunk, the transposed chunk, the accumulators (as 256-bit
/// registers), the prepared activation blocks (bytes) and the one-token stream's activation
/// windows, grown on first use and reused.
struct Scratch {
    regs: Vec<__m256i>,
    prep: Vec<u64>,
    stream: Vec<__m256i>,
    stream_bytes: Vec<u8>,
}

thread_local! {
    static SCRATCH: UnsafeCell<Scratch> = const {
        UnsafeCell::new(Scratch {
            regs: Vec::new(),
            prep: Vec::new(),
            stream: Vec::new(),
            stream_bytes: Vec::new(),
        })
    };
}

/// The chains of the kernels that read two sets of 8 rows at once (`legacy_groups::wide`,
/// `interleaved::two_pairs`): two per set of rows and token, kept in memory (they do not fit in
/// registers beside those kernels' integer sums).
pub(super) struct WideAcc {
    pub(super) acc: [[__m256; PASS]; 2],
    pub(super) accm: [[__m256; PASS]; 2],
}

thread_local! {
    static WIDE_ACC: UnsafeCell<Option<Box<WideAcc>>> = const { UnsafeCell::new(None) };
}

/// Prefetches (into L2) share `blk` of `nb` of the `span` bytes at `next`, one line at a time
/// (`wrapping_add`: past the buffer's end a prefetch is never read).
#[inline(always)]
pub(super) unsafe fn prefetch_share(next: *const u8, span: usize, blk: usize, nb: usize) {
    let share = span.div_ceil(nb).next_multiple_of(64);
    let mut o = blk * share;
    while o < ((blk + 1) * share).min(span) {
        _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(o).cast());
        o += 64;
    }
}

/// Prefetches the `len` bytes `l1` bytes past `p` into L1 and those `l2` bytes past it into L2,
/// one line per 64 bytes: what a one-token kernel streaming its weights from memory asks for
/// ahead of each block it reads, so that more lines are on their way than L1's fill buffers hold
/// (`wrapping_add`: a prefetch may point past the buffer; it never faults).
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(p: *const u8, len: usize, l1: usize, l2: usize) {
    let (near, far) = (p.wrapping_add(l1), p.wrapping_add(l2));
    let mut o = 0;
    while o < len {
        _mm_prefetch::<_MM_HINT_T0>(near.wrapping_add(o).cast());
        _mm_prefetch::<_MM_HINT_T1>(far.wrapping_add(o).cast());
        o += 64;
    }
}

/// The thread's [`WideAcc`], made on first use.
///
/// # Safety
/// Used by nothing else while the reference lives (kernels do not call each other).
#[inline(always)]
pub(super) unsafe fn wide_chains<'a>() -> &'a mut WideAcc {
    let c = &mut *WIDE_ACC.with(|s| s.get());
    // SAFETY: registers of f32, valid for any bit pattern.
    c.get_or_insert_with(|| Box::new(std::mem::zeroed()))
}

/// Rows of each lane a one-token call prefetches before it starts.
const FAR_FIRST_ROWS: usize = 4;

/// Registers of scratch: the unpacked chunk, the transposed chunk, two accumulators per token.
const P_REGS: usize = 160;
const SCRATCH_REGS: usize = P_REGS + MAX_DW + 2 * PASS;

/// The first byte of each of the `acts` (1..=[`PASS`] rows of `len` bytes each).
#[inline(always)]
fn act_ptrs(acts: &[&[u8]], len: usize) -> [*const u8; PASS] {
    debug_assert!((1..=PASS).contains(&acts.len()));
    let mut a = [std::ptr::null::<u8>(); PASS];
    for (a, r) in a.iter_mut().zip(acts) {
        debug_assert_eq!(r.len(), len);
        *a = r.as_ptr();
    }
    a
}

/// The thread's register scratch (grown on first use) as its regions: the unpacked chunk `P`, the
/// transposed chunk and the two accumulators per token.
///
/// # Safety
/// `regs` is the thread's own scratch, used by nothing else while the regions live (kernels do
/// not call each other), and `P` fits [`P_REGS`] registers.
#[inline(always)]
#[allow(clippy::type_complexity)]
unsafe fn regions<P>(
    regs: &mut Vec<__m256i>,
) -> (
    &mut P,
    &mut TChunk,
    &mut [__m256; PASS],
    &mut [__m256; PASS],
) {
    debug_assert!(std::mem::size_of::<P>() <= P_REGS * 32);
    if regs.is_empty() {
        regs.resize(SCRATCH_REGS, _mm256_setzero_si256());
    }
    // SAFETY: initialised memory of SCRATCH_REGS registers, 32-byte aligned; the regions do not
    // overlap, and every type placed there (registers, f32 and integer arrays) is valid for any
    // bit pattern.
    let base = regs.as_mut_ptr();
    (
        &mut *base.cast::<P>(),
        &mut *base.add(P_REGS).cast::<TChunk>(),
        &mut *base.add(P_REGS + MAX_DW).cast::<[__m256; PASS]>(),
        &mut *base.add(P_REGS + MAX_DW + PASS).cast::<[__m256; PASS]>(),
    )
}

/// Every activation block of the `nt` tokens at `a` (rows of `nb` blocks) prepared into `prep`
/// (grown as needed): token `j`'s block `b` at index `j * nb + b` of the returned pointer.
///
/// # Safety
/// `a[..nt]` point to rows of `nb` activation blocks of `F`.
#[inline(always)]
unsafe fn prepare<F: Fmt>(
    prep: &mut Vec<u64>,
    a: &[*const u8; PASS],
    nt: usize,
    nb: usize,
) -> *const F::Q {
    const { assert!(std::mem::align_of::<F::Q>() <= 8) };
    let qwords = (nt * nb * std::mem::size_of::<F::Q>()).div_ceil(8);
    if prep.len() < qwords {
        prep.resize(qwords, 0);
    }
    // SAFETY: `prep` holds nt * nb values of F::Q (8-byte aligned, F::Q at most 8-aligned), valid
    // for any bit pattern.
    let q = prep.as_mut_ptr().cast::<F::Q>();
    for j in 0..nt {
        for b in 0..nb {
            F::prep(a[j].add(b * F::AB), &mut *q.add(j * nb + b));
        }
    }
    q
}

/// An unpacked chunk `p` (blocks `c0..c0 + cn`) against all `nt` tokens, four at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn steps<F: Fmt, D: Dp>(
    p: &F::P,
    cn: usize,
    c0: usize,
    nb: usize,
    a: &[*const u8; PASS],
    q: *const F::Q,
    nt: usize,
    acc: &mut [__m256; PASS],
    accm: &mut [__m256; PASS],
) {
    let mut j = 0;
    while j < nt {
        match nt - j {
            1 => group::<F, D, 1>(p, cn, c0, nb, a, q, j, acc, accm),
            2 => group::<F, D, 2>(p, cn, c0, nb, a, q, j, acc, accm),
            3 => group::<F, D, 3>(p, cn, c0, nb, a, q, j, acc, accm),
            _ => group::<F, D, 4>(p, cn, c0, nb, a, q, j, acc, accm),
        }
        j += 4;
    }
}

/// Every row of `w` against the `acts` (at most [`PASS`]): element (row `i`, token `j`) goes to
/// `out[j * tok_stride + i * row_stride]`.
#[inline(always)]
pub(super) unsafe fn run<F: Fmt, D: Dp>(
    n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    let nb = n / F::BS;
    let nt = acts.len();
    let a = act_ptrs(acts, nb * F::AB);
    const { assert!(std::mem::size_of::<F::P>() <= P_REGS * 32) };
    // No closure around the work: it would not inherit the caller's target features, and every
    // intrinsic in it would become a call.
    // SAFETY: the thread's own scratch, used by nothing else while this call runs (kernels do not
    // call each other).
    let s = &mut *SCRATCH.with(|s| s.get());
    {
        let q = prepare::<F>(&mut s.prep, &a, nt, nb);
        let (p, tc, acc, accm) = regions::<F::P>(&mut s.regs);
        let per_lane = w.count.div_ceil(LANES);
        if nt == 1 {
            // The first rows of each lane (see `far` below), which wait on one load after another
            // until the hardware follows the lanes' streams.
            for l in 0..LANES {
                let from = (l * per_lane).min(w.count);
                let to = (from + FAR_FIRST_ROWS).min((l + 1) * per_lane).min(w.count);
                if from < to {
                    let rows = &w.data[from * w.stride..(to * w.stride).min(w.data.len())];
                    crate::simd::prefetch_l2(rows);
                }
            }
            if F::STREAM > 0 {
                F::stream_acts(a[0], nb, &mut s.stream, &mut s.stream_bytes);
            }
        }
        let n_chunks = nb.div_ceil(F::CHUNK);
        let end = w.data.as_ptr().add(w.data.len());
        // One token: lane `l` takes the rows of the `l`-th eighth of the call in turn, so each lane
        // reads its rows front to back, one after another, and the hardware follows 8 plain
        // streams. 8 neighbouring rows read 16 bytes at a time each, in turn, read at about half
        // the rate (Zen 1, one thread, rows of 360 bytes: 5.3-7.7 against 13.2-13.7 GB/s). Which
        // lane computes a row does not change its bits. Many tokens: 8 neighbouring rows.
        let far = nt == 1;
        for g in 0..per_lane {
            let mut idx = [usize::MAX; LANES];
            for (l, i) in idx.iter_mut().enumerate() {
                let r = if far { l * per_lane + g } else { g * LANES + l };
                if r < w.count {
                    *i = r;
                }
            }
            // Lane 0 always has a row; a lane without one reads it again and is not stored.
            let base = w.data.as_ptr().add(g * LANES * w.stride);
            let mut rows = [base; LANES];
            for (r, &i) in rows.iter_mut().zip(&idx) {
                *r = w
                    .data
                    .as_ptr()
                    .add(if i == usize::MAX { idx[0] } else { i } * w.stride);
            }
            for j in 0..nt {
                acc[j] = _mm256_setzero_ps();
                accm[j] = _mm256_setzero_ps();
            }
            let mut c0 = 0;
            while c0 < nb {
                let cn = (nb - c0).min(F::CHUNK);
                // The 8 rows are read a chunk at a time each: prefetch (into L2) the block of rows
                // after next, which usually follows in memory, front to back, a share per chunk.
                if !far {
                    let span = LANES * w.stride;
                    let share = span.div_ceil(n_chunks).next_multiple_of(64);
                    let from = c0 / F::CHUNK * share;
                    let next = base.wrapping_add(2 * span);
                    let mut o = from;
                    // One prefetch per line. Every other line (relying on an adjacent-line
                    // prefetcher for the rest) halved the streaming rate on Zen 4, which has none
                    // that follows: 1 token x 94 MB of Q4_1, 576 columns, one thread, 7.9 -> 15.9
                    // GB/s (`HEARTH_BENCH_ROWS=262144 HEARTH_BENCH_COLS=576 cargo bench --bench
                    // dot_min`), SmolLM2 decode 105 -> 143 t/s.
                    while o < (from + share).min(span) {
                        // `wrapping_add`: a prefetch may point past the buffer; it is never read.
                        _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(o).cast());
                        o += 64;
                    }
                }
                if nt == 1 && F::DIRECT {
                    debug_assert_eq!(F::CHUNK, 1);
                    let ab = a[0].add(c0 * F::AB);
                    F::one_token_direct::<D>(&rows, c0 * F::WB, p, ab, &mut acc[0], &mut accm[0]);
                    c0 += cn;
                    continue;
                }
                if nt == 1 && F::STREAM > 0 {
                    // Whole periods streamed; the rest of the chunk through the transposed chunk.
                    let full = cn / F::STREAM * F::STREAM;
                    if full > 0 {
                        let (ac, am) = (&mut acc[0], &mut accm[0]);
                        F::one_token_stream::<D>(&rows, c0, full, &s.stream, q, ac, am);
                    }
                    if full < cn {
                        let (b, rest) = (c0 + full, cn - full);
                        tc.load(&rows, end, b * F::WB, rest * F::WB);
                        let (ab, qb) = (a[0].add(b * F::AB), q.add(b));
                        F::one_token::<D>(tc, rest, p, ab, qb, &mut acc[0], &mut accm[0]);
                    }
                    c0 += cn;
                    continue;
                }
                tc.load(&rows, end, c0 * F::WB, cn * F::WB);
                if nt == 1 {
                    let (ab, qb) = (a[0].add(c0 * F::AB), q.add(c0));
                    F::one_token::<D>(tc, cn, p, ab, qb, &mut acc[0], &mut accm[0]);
                    c0 += cn;
                    continue;
                }
                F::pack::<D>(tc, cn, p);
                steps::<F, D>(p, cn, c0, nb, &a, q, nt, acc, accm);
                c0 += cn;
            }
            store::<F>(acc, accm, nt, &idx, out, tok_stride, row_stride);
        }
    }
}

/// The outputs of rows `idx[l]` (lane `l`; `usize::MAX`: none) for `nt` tokens.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn store<F: Fmt>(
    acc: &[__m256; PASS],
    accm: &[__m256; PASS],
    nt: usize,
    idx: &[usize; LANES],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    let r0 = idx[0];
    if row_stride == 1 && (0..LANES).all(|l| idx[l] == r0 + l) {
        for j in 0..nt {
            let dst = &mut out[j * tok_stride + r0..j * tok_stride + r0 + LANES];
            _mm256_storeu_ps(dst.as_mut_ptr(), F::finish(acc[j], accm[j]));
        }
    } else {
        let mut v = [0f32; LANES];
        for j in 0..nt {
            _mm256_storeu_ps(v.as_mut_ptr(), F::finish(acc[j], accm[j]));
            for (x, &i) in v.iter().zip(idx) {
                if i != usize::MAX {
                    out[j * tok_stride + i * row_stride] = *x;
                }
            }
        }
    }
}

/// The entry points of one format (see `crate::traits::MatrixFn`) through a driver (`run`, or a
/// driver over interleaved rows): plain AVX2, AVX-VNNI and, for formats without a 512-bit kernel,
/// AVX-512 VNNI on 256-bit registers.
macro_rules! entries {
    ($driver:ident, $F:ty, $avx2:ident, $vnni:ident $(, $avx512:ident)?) => {
        /// The AVX2 kernel of one weight type (see `crate::traits::MatrixFn`).
        ///
        /// # Safety
        /// As `crate::traits::MatrixFn` (a driver over interleaved rows: whole groups of rows),
        /// with AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $avx2(
            n: usize,
            w: &$crate::simd::Rows,
            acts: &[&[u8]],
            out: &mut [f32],
            ts: usize,
            rs: usize,
        ) {
            $driver::<$F, $crate::simd::ymm::Madd>(n, w, acts, out, ts, rs)
        }

        /// The AVX-VNNI kernel of one weight type (see `crate::traits::MatrixFn`).
        ///
        /// # Safety
        /// As the AVX2 kernel, with AVX-VNNI.
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        pub(crate) unsafe fn $vnni(
            n: usize,
            w: &$crate::simd::Rows,
            acts: &[&[u8]],
            out: &mut [f32],
            ts: usize,
            rs: usize,
        ) {
            $driver::<$F, $crate::simd::ymm::VexVnni>(n, w, acts, out, ts, rs)
        }

        $(
        /// The 256-bit AVX-512 VNNI kernel of one weight type (see `crate::traits::MatrixFn`).
        ///
        /// # Safety
        /// As `crate::traits::MatrixFn`, with AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(crate) unsafe fn $avx512(
            n: usize,
            w: &$crate::simd::Rows,
            acts: &[&[u8]],
            out: &mut [f32],
            ts: usize,
            rs: usize,
        ) {
            $driver::<$F, $crate::simd::ymm::EvexVnni>(n, w, acts, out, ts, rs)
        }
        )?
    };
}
pub(super) use entries;
