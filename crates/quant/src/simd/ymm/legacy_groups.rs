//! The legacy formats over their interleaved layout (`crate::interleave`): groups of 8 rows whose
//! blocks already sit as the 8-lane kernels of `legacy.rs` hold them, dword `k` of row `r` in lane
//! `r` of one 32-byte load.
//!
//! The file's rows make a one-token product either transpose 16-byte windows of 8 rows in
//! registers (the stream of `legacy.rs`) or copy them through the transposed chunk; a group is
//! read with plain loads, each register once, front to back. One or two tokens use each unpacked
//! block in registers; more go through the unpacked chunk and `super::steps`, as the file's rows
//! do. Every block meets the same registers and the same operations as on the file's layout
//! (`L::block`), so the results are the same bits.

use std::arch::x86_64::*;

use super::legacy::{
    Iq4Nl, Kind, Legacy, LegacyP, LegacyQ, L, LCHUNK, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
};
use super::{
    act_ptrs, prefetch_ahead, prefetch_share, prepare, regions, steps, store, wide_chains, Dp, Fmt,
    LANES, SCRATCH,
};
use crate::interleave::LEGACY_GROUP_ROWS;
use crate::simd::{Rows, PASS};

/// Bytes ahead of the block being read that the one-token kernel prefetches (into L1). Reading
/// 131072 × 576 Q4_1 / Q8_0 from memory on Zen 3, one thread, GB/s, two runs each (a noisy host):
/// none 17.1, 13.7 / 13.5, 12.6; 1024 bytes 13.2, 17.2 / 13.8, 16.7; 2048 19.7, 19.0 / 14.1, 16.1;
/// 4096 22.9, 20.8 / 16.3, 17.9.
const AHEAD: usize = 4096;

/// Bytes ahead that the one- and two-token kernel also prefetches into L2, so that more lines are
/// on their way from memory than L1's fill buffers hold (as `interleaved::AHEAD_L2`). `hearth
/// bench -p 0 -n 128`, 2 threads, the Intel Xeon, alternating pairs, t/s: Gemma3-270M (its tied
/// Q8_0 LM head 178 MB of 253) 82.0 / 86.3 / 91.5 / 92.9 -> 104.6 / 105.8 / 100.5 / 104.5, AVX2
/// 73.9 / 74.6 / 75.1 -> 96.4 / 97.7 / 93.5; SmolLM2 Q4_1 298 / 305 / 299 / 310 -> 381 / 378 /
/// 376 / 423, AVX2 295 / 259 / 271 -> 360 / 366 / 358. L1 at 2048 or 4096 and L2 at 8192 to
/// 20480 bytes ahead were within the noise of each other.
const AHEAD_L2: usize = 12288;

/// `T` tokens (1 or 2) against the group at `g` (`nb` blocks), each block unpacked once in
/// registers.
#[inline(always)]
unsafe fn few<W: Legacy, D: Dp, const T: usize>(
    g: *const u8,
    nb: usize,
    a: &[*const u8],
    q: *const LegacyQ,
    acc: &mut [__m256],
    accm: &mut [__m256],
) {
    let gb = LANES * W::WB;
    let (mut ac, mut am) = ([_mm256_setzero_ps(); T], [_mm256_setzero_ps(); T]);
    for b in 0..nb {
        let blk = g.add(b * gb);
        // The group's block (144 to 272 bytes) `AHEAD` bytes on into L1, `AHEAD_L2` into L2.
        prefetch_ahead(blk, gb, AHEAD, AHEAD_L2);
        let mut w = [_mm256_setzero_si256(); 8];
        let (d, m) = W::unpack_group(blk, &mut w);
        let ab: [*const u8; T] = std::array::from_fn(|t| a[t].add(b * <L<W> as Fmt>::AB));
        let qb: [*const LegacyQ; T] = std::array::from_fn(|t| q.add(t * nb + b));
        L::<W>::block::<D, T>(&w, d, m, &ab, &qb, &mut ac, &mut am);
    }
    acc[..T].copy_from_slice(&ac);
    accm[..T].copy_from_slice(&am);
}

/// Every row of `w` (whole groups of 8 interleaved rows) against the `acts` (at most `PASS`):
/// element (row `i`, token `j`) to `out[j * tok_stride + i * row_stride]`.
#[inline(always)]
unsafe fn run<W: Legacy, D: Dp>(
    n: usize,
    w: &Rows,
    acts: &[&[u8]],
    out: &mut [f32],
    tok_stride: usize,
    row_stride: usize,
) {
    const { assert!(LEGACY_GROUP_ROWS == LANES) };
    let nb = n / 32;
    let nt = acts.len();
    let a = act_ptrs(acts, nb * <L<W> as Fmt>::AB);
    // SAFETY: as in `super::run`: the thread's own scratch, used by nothing else while this call
    // runs.
    let s = &mut *SCRATCH.with(|s| s.get());
    let q = prepare::<L<W>>(&mut s.prep, &a, nt, nb);
    let (p, _, acc, accm) = regions::<LegacyP>(&mut s.regs);
    let gb = LANES * W::WB;
    let groups = w.count / LANES;
    assert!(w.data.len() >= groups * nb * gb);
    // One or two tokens stream the weights from memory, and a call starts a new stream: its first
    // `AHEAD` bytes asked for at once, not one line per block as the loop gets to them (as
    // `prefetch_first_rows` for the file's rows). SmolLM2 `hearth bench -p 0 -n 128`, Zen 3, 12
    // alternating pairs on a noisy host: the pairs' median ratio 1.04, medians 278 -> 288 t/s.
    if nt <= 2 {
        let start = w.data.as_ptr();
        let mut o = 0;
        while o < AHEAD.min(groups * nb * gb) {
            _mm_prefetch::<_MM_HINT_T0>(start.add(o).cast());
            o += 64;
        }
    }
    let mut g = 0;
    while g < groups {
        if nt > 2 && L::<W>::WIDE && !D::VNNI {
            let ga = (groups - g).min(WIDE_GROUPS);
            let dst = (&mut *out, tok_stride, row_stride);
            const { assert!(WIDE_GROUPS == 2) };
            match ga {
                2 => wide::<W, D, 2>(w, g, nb, &a, q, nt, dst),
                _ => wide::<W, D, 1>(w, g, nb, &a, q, nt, dst),
            }
            g += ga;
            continue;
        }
        let gp = w.data.as_ptr().add(g * nb * gb);
        match nt {
            1 => few::<W, D, 1>(gp, nb, &a, q, acc, accm),
            2 => few::<W, D, 2>(gp, nb, &a, q, acc, accm),
            _ => {
                acc[..nt].fill(_mm256_setzero_ps());
                accm[..nt].fill(_mm256_setzero_ps());
                let mut c0 = 0;
                while c0 < nb {
                    let cn = (nb - c0).min(LCHUNK);
                    for b in 0..cn {
                        let (d, m) = W::unpack_group(gp.add((c0 + b) * gb), &mut p.q[b]);
                        (p.d[b], p.m[b]) = (d, m);
                    }
                    steps::<L<W>, D>(p, cn, c0, nb, &a, q, nt, acc, accm);
                    c0 += cn;
                }
            }
        }
        let idx: [usize; LANES] = std::array::from_fn(|l| g * LANES + l);
        store::<L<W>>(acc, accm, nt, &idx, out, tok_stride, row_stride);
        g += 1;
    }
}

/// Groups whose blocks [`wide`] reads together, each activation broadcast meeting all of them.
const WIDE_GROUPS: usize = 2;

/// Tokens per step of [`wide`]. `prefill_min` Q4_1 (1536 × 576, calls of 64 rows, one thread,
/// Zen 3), G multiply-adds/s at 8 / 64 tokens, groups × tokens per step: 2 × 4 81 / 91, 3 × 3
/// 78 / 88, 4 × 2 67-75 / 74-80, 2 × 6 67 / 74-78; 3 × 4 (12 sums, 3 quant registers and the
/// broadcast: all 16 registers) spilled and ran below the one-group kernel's 70 / 78.
const WIDE_T: usize = 4;

/// The `GA` groups from group `g0` (`nb` blocks each) against all `nt` (3 to [`PASS`]) tokens,
/// block by block: each block of the `GA` groups unpacked once, then met by the tokens
/// [`WIDE_T`] at a time through [`L::block_wide`], the chains kept in memory (one per group and
/// token does not fit in registers beside the sums); type 1's minimums' chains first, in a pass
/// of their own ([`L::min_chains`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn wide<W: Legacy, D: Dp, const GA: usize>(
    w: &Rows,
    g0: usize,
    nb: usize,
    a: &[*const u8; PASS],
    q: *const LegacyQ,
    nt: usize,
    (out, tok_stride, row_stride): (&mut [f32], usize, usize),
) {
    // SAFETY: the thread's own scratch, used by nothing else while this call runs (kernels do
    // not call each other).
    let ch = wide_chains();
    const { assert!(GA <= 2) };
    let gb = LANES * W::WB;
    let gp: [*const u8; GA] = std::array::from_fn(|g| w.data.as_ptr().add((g0 + g) * nb * gb));
    for g in 0..GA {
        ch.acc[g][..nt].fill(_mm256_setzero_ps());
        if W::KIND == Kind::Type1 {
            L::<W>::min_chains(gp[g], gb, nb, q, nt, &mut ch.accm[g]);
        } else {
            ch.accm[g][..nt].fill(_mm256_setzero_ps());
        }
    }
    // The next `GA` groups (they follow these), into L2, a share per block: at a few tokens the
    // weights come from memory, and the hardware prefetchers fell behind the two streams.
    let span = GA * nb * gb;
    let next = gp[0].wrapping_add(span);
    for b in 0..nb {
        prefetch_share(next, span, b, nb);
        let mut wq = [[_mm256_setzero_si256(); 8]; GA];
        let mut dx = [_mm256_setzero_ps(); GA];
        for g in 0..GA {
            dx[g] = W::unpack_group(gp[g].add(b * gb), &mut wq[g]).0;
        }
        let mut j = 0;
        while j < nt {
            macro_rules! step {
                ($t:expr) => {{
                    let ab: [*const u8; $t] =
                        std::array::from_fn(|t| a[j + t].add(b * <L<W> as Fmt>::AB));
                    let qb: [*const LegacyQ; $t] = std::array::from_fn(|t| q.add((j + t) * nb + b));
                    let ac = ch.acc.as_mut_ptr().cast::<__m256>().add(j);
                    L::<W>::block_wide::<D, GA, $t>(&wq, &dx, &ab, &qb, ac);
                }};
            }
            const { assert!(WIDE_T == 4) };
            match nt - j {
                1 => step!(1),
                2 => step!(2),
                3 => step!(3),
                _ => step!(4),
            }
            j += WIDE_T;
        }
    }
    for g in 0..GA {
        let idx: [usize; LANES] = std::array::from_fn(|l| (g0 + g) * LANES + l);
        let (ac, am) = (&ch.acc[g], &ch.accm[g]);
        store::<L<W>>(ac, am, nt, &idx, out, tok_stride, row_stride);
    }
}

super::entries!(run, Q4_0, q4_0, q4_0_vnni, q4_0_avx512);
super::entries!(run, Q4_1, q4_1, q4_1_vnni, q4_1_avx512);
super::entries!(run, Q5_0, q5_0, q5_0_vnni, q5_0_avx512);
super::entries!(run, Q5_1, q5_1, q5_1_vnni, q5_1_avx512);
super::entries!(run, Q8_0, q8_0, q8_0_vnni, q8_0_avx512);
super::entries!(run, Iq4Nl, iq4_nl, iq4_nl_vnni, iq4_nl_avx512);
