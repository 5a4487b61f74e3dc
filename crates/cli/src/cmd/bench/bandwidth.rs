//! The machine's streaming read bandwidth, for the decode roofline of `hearth bench`.
//!
//! A decode step of a large model streams every weight it uses from DRAM once, so tokens per second
//! cannot exceed read bandwidth ÷ weight bytes per token. The probe must therefore measure DRAM, not
//! the caches: its buffer is at least 1 GiB and at least 8× the largest cache the kernel reports (a VM
//! may report a smaller L3 than the host really has, hence the 1 GiB floor), every page is written
//! before timing (a calloc'ed buffer that is only read maps the kernel's single zero page, which then
//! sits in L1, and first-touch page faults would be timed too), one untimed pass warms the TLBs, and
//! the best of several timed passes is kept (other processes on the machine only ever slow a pass).
//!
//! The sum is plain `u64` arithmetic in eight independent lanes: at opt-level 3 it compiles to packed
//! SSE2 adds, which retire far faster than DRAM delivers, so wider vectors would not change the figure.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use hearth_model::{advise_huge_pages, ThreadPool};

use crate::cmd::common::mem_available_bytes;

/// Smallest probe buffer.
const MIN_BYTES: u64 = 1 << 30;
/// Largest probe buffer, whatever the caches say.
const MAX_BYTES: u64 = 4 << 30;
/// The buffer spans this many times the largest cache.
const CACHE_MULTIPLE: u64 = 8;
/// Untimed passes (TLB and prefetcher warm-up), then timed ones.
const WARMUP_PASSES: usize = 1;
const TIMED_PASSES: usize = 7;
/// Tasks per thread: contiguous slices of the buffer that threads claim in order, small enough that a
/// thread preempted by another process does not leave the pass waiting on one half of the buffer.
const TASKS_PER_THREAD: usize = 8;

/// What one probe measured.
#[derive(Debug, Clone)]
pub struct Bandwidth {
    /// Threads that read concurrently.
    pub n_threads: usize,
    /// Size of the buffer read on each pass.
    pub buffer_bytes: u64,
    /// Bytes per second of each timed pass, in order.
    pub passes: Vec<f64>,
}

impl Bandwidth {
    /// Best pass, bytes per second: the figure the roofline uses.
    pub fn best(&self) -> f64 {
        self.passes.iter().copied().fold(0.0, f64::max)
    }

    /// Median pass, bytes per second: how far below the best a loaded machine drags it.
    pub fn median(&self) -> f64 {
        super::median(&self.passes)
    }
}

/// Measures the read bandwidth of `n_threads` threads streaming over a buffer much larger than the
/// caches. The buffer is freed (unmapped: it is far above the allocator's mmap threshold) on return.
pub fn measure(n_threads: usize) -> Bandwidth {
    let buffer_bytes = buffer_bytes(largest_cache_bytes(), mem_available_bytes());
    let pool = ThreadPool::new(n_threads);
    let n = (buffer_bytes / 8) as usize;
    let n_tasks = pool.n_threads() * TASKS_PER_THREAD;
    let chunk = n.div_ceil(n_tasks);

    let mut buf = vec![0u64; n]; // [n]: lazily mapped zero pages until written below
                                 // 2 MiB pages, as the weights get when read into memory (`--load read`): on 4 KiB pages the probe
                                 // would pay TLB misses the weights do not, and the roofline would sit below what decoding reaches.
    advise_huge_pages(&mut buf);
    {
        // Written by the threads that will read it, so on a NUMA machine each part is local.
        let parts: Vec<Mutex<&mut [u64]>> = buf.chunks_mut(chunk).map(Mutex::new).collect();
        pool.run(parts.len(), &|i| {
            let mut part = parts[i].lock().expect("each part is locked once");
            for (j, x) in part.iter_mut().enumerate() {
                *x = (i * chunk + j) as u64;
            }
        });
    }

    let sink = AtomicU64::new(0);
    let mut passes = Vec::with_capacity(TIMED_PASSES);
    for pass in 0..WARMUP_PASSES + TIMED_PASSES {
        let t0 = Instant::now();
        pool.run(n_tasks, &|i| {
            let part = &buf[(i * chunk).min(n)..((i + 1) * chunk).min(n)];
            sink.fetch_add(sum(part), Ordering::Relaxed);
        });
        let secs = t0.elapsed().as_secs_f64();
        if pass >= WARMUP_PASSES {
            passes.push((n * 8) as f64 / secs);
        }
    }
    // The sums must be used, or the reads could be optimised away.
    std::hint::black_box(sink.into_inner());
    Bandwidth {
        n_threads: pool.n_threads(),
        buffer_bytes: (n * 8) as u64,
        passes,
    }
}

/// Wrapping sum in eight independent lanes, so the adds never wait on each other.
fn sum(s: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut blocks = s.chunks_exact(8);
    for b in &mut blocks {
        for k in 0..8 {
            acc[k] = acc[k].wrapping_add(b[k]);
        }
    }
    let tail = blocks
        .remainder()
        .iter()
        .fold(0u64, |a, &b| a.wrapping_add(b));
    acc.iter().fold(tail, |a, &b| a.wrapping_add(b))
}

/// Probe size: `CACHE_MULTIPLE` × the largest cache, within [`MIN_BYTES`, `MAX_BYTES`], and never more
/// than a quarter of the memory available (a small machine gets a smaller, less exact probe rather
/// than an out-of-memory kill).
fn buffer_bytes(largest_cache: Option<u64>, available: Option<u64>) -> u64 {
    let want = largest_cache
        .map_or(0, |c| c.saturating_mul(CACHE_MULTIPLE))
        .clamp(MIN_BYTES, MAX_BYTES);
    let cap = available.map_or(u64::MAX, |a| a / 4).max(64 << 20);
    want.min(cap) & !((1 << 20) - 1)
}

/// Largest data or unified cache of CPU 0, from sysfs (`index*/size`, e.g. `32768K`).
fn largest_cache_bytes() -> Option<u64> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter(|e| {
            std::fs::read_to_string(e.path().join("type")).is_ok_and(|t| t.trim() != "Instruction")
        })
        .filter_map(|e| parse_size(&std::fs::read_to_string(e.path().join("size")).ok()?))
        .max()
}

/// A sysfs cache size: `32K`, `1024K`, `32M`, or plain bytes.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_sizes_parse() {
        assert_eq!(parse_size("32K\n"), Some(32 << 10));
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("99999999999999999999K"), None);
    }

    #[test]
    fn buffer_is_large_against_the_caches_but_fits_memory() {
        // This machine: 32 MiB L3 -> 256 MiB would be too close to what a VM host's caches may hold.
        assert_eq!(buffer_bytes(Some(32 << 20), Some(20 << 30)), 1 << 30);
        assert_eq!(buffer_bytes(None, None), 1 << 30);
        assert_eq!(buffer_bytes(Some(256 << 20), Some(64 << 30)), 2 << 30);
        assert_eq!(buffer_bytes(Some(1 << 30), Some(64 << 30)), 4 << 30);
        assert_eq!(buffer_bytes(Some(32 << 20), Some(2 << 30)), 512 << 20);
    }

    #[test]
    fn sum_covers_every_element() {
        let v: Vec<u64> = (1..=19).collect();
        assert_eq!(sum(&v), 190);
        assert_eq!(sum(&[]), 0);
    }
}
