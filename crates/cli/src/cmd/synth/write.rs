//! Streaming the file: declare every tensor, write the header, then generate and quantize each tensor
//! slab by slab (a few MB of output at a time) on all threads, writing slabs in order. Nothing but the
//! header and one slab is ever in memory, so the 18 GB preset writes in a few hundred MB.
//!
//! Determinism: a tensor is cut into chunks of a fixed number of rows (fixed by its row length alone)
//! and each chunk draws from its own stream ([`super::rng::stream`]), so the bytes depend only on the
//! seed, never on the thread count or the slab size.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};
use hearth_gguf::GgufWriter;
use hearth_quant::{quantize_row, row_len};

use super::layout::{Init, TensorSpec};
use super::rng::stream;

/// Values drawn per chunk (rounded to whole rows): small enough to balance threads, large enough that
/// scheduling costs nothing.
const CHUNK_VALUES: usize = 1 << 16;
/// Output bytes per slab.
const SLAB_BYTES: usize = 32 << 20;

/// Rows per chunk of a tensor with rows of `cols` values.
pub fn chunk_rows(cols: usize) -> usize {
    (CHUNK_VALUES / cols.max(1)).max(1)
}

/// Generates and writes the data of every tensor declared on `w` (whose header is written), calling
/// `progress` with the bytes of each slab.
pub fn write_tensors<W: Write>(
    w: &mut GgufWriter<W>,
    specs: &[TensorSpec],
    seed: u64,
    n_threads: usize,
    mut progress: impl FnMut(u64),
) -> Result<()> {
    for t in specs {
        let (cols, rows) = (t.cols(), t.rows());
        let row_bytes =
            row_len(t.ty, cols).with_context(|| format!("{}: {} rows of {cols}", t.name, t.ty))?;
        let crows = chunk_rows(cols);
        let chunks_per_slab = (SLAB_BYTES / (row_bytes * crows).max(1)).max(1);
        let slab_rows = crows * chunks_per_slab;
        let mut slab = vec![0u8; slab_rows.min(rows) * row_bytes];
        let mut r0 = 0;
        while r0 < rows {
            let n = slab_rows.min(rows - r0);
            let out = &mut slab[..n * row_bytes];
            fill(t, out, r0, n, crows, row_bytes, seed, n_threads)?;
            w.write_tensor_data(out)
                .with_context(|| format!("writing {}", t.name))?;
            progress(out.len() as u64);
            r0 += n;
        }
    }
    Ok(())
}

/// Rows `r0..r0 + n` of `t` (`r0` a multiple of `crows`) into `out`, chunk by chunk on `n_threads`.
#[allow(clippy::too_many_arguments)]
fn fill(
    t: &TensorSpec,
    out: &mut [u8],
    r0: usize,
    n: usize,
    crows: usize,
    row_bytes: usize,
    seed: u64,
    n_threads: usize,
) -> Result<()> {
    let cols = t.cols();
    let chunks: Vec<&mut [u8]> = out.chunks_mut(crows * row_bytes).collect();
    let n_chunks = chunks.len();
    let chunks: Vec<std::sync::Mutex<&mut [u8]>> =
        chunks.into_iter().map(std::sync::Mutex::new).collect();
    let next = AtomicUsize::new(0);
    let first_chunk = r0 / crows;
    let work = || -> Result<()> {
        let mut vals = vec![0f32; crows * cols];
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n_chunks {
                return Ok(());
            }
            let mut dst = chunks[i].lock().expect("no thread panics holding a chunk");
            let rows_here = dst.len() / row_bytes;
            let v = &mut vals[..rows_here * cols];
            let mut rng = stream(seed, &t.name, (first_chunk + i) as u64);
            match t.init {
                Init::Norm => rng.fill_normal(v, 1.0, 0.02),
                Init::Normal(std) => rng.fill_normal(v, 0.0, std),
            }
            // Rows are whole blocks, so a run of rows quantizes like each row alone.
            quantize_row(t.ty, v, &mut dst)
                .with_context(|| format!("quantizing {} to {}", t.name, t.ty))?;
        }
    };
    let threads = n_threads.clamp(1, n_chunks.max(1));
    debug_assert!(n > 0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut result = work();
        for h in handles {
            let r = h.join().expect("synth worker panicked");
            result = result.and(r);
        }
        result
    })
}
