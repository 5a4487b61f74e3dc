//! A persistent thread pool for the forward pass.
//!
//! Work is expressed as `n_tasks` independent tasks; threads claim task indices from an atomic counter.
//! Which thread runs a task never changes what the task computes, so results do not depend on the
//! thread count (each output element is reduced by exactly one task, in a fixed order).
//!
//! A forward pass issues hundreds of small parallel steps, so hand-off latency matters: workers spin
//! on the generation counter for a short while before parking on a condition variable, and the caller
//! spins until the last worker is done.
//!
//! A task that panics (an `assert!` in a kernel, a failpoint) does not break the pool: every thread
//! stops taking tasks of that batch, [`ThreadPool::run`] waits until no worker is inside the task
//! closure any more (the closure borrows the caller's stack, so returning earlier would leave
//! workers reading freed memory), and then resumes the first panic on the caller's thread. The
//! workers survive and the pool runs the next batch normally.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Job = dyn Fn(usize) + Sync;

/// Spins before a worker parks (a few tens of microseconds).
const SPIN_LIMIT: u32 = 1 << 11;

/// Most byte ranges of a [`ThreadPool::prefetch_after`] hint.
const MAX_HINTS: usize = 3;

/// Lines a thread prefetches between looks at whether the pool needs it again.
const HINT_LINES_PER_LOOK: usize = 8;

struct Shared {
    generation: AtomicU64,
    job: AtomicPtr<JobRef>,
    n_tasks: AtomicUsize,
    next: AtomicUsize,
    pending: AtomicUsize,
    shutdown: AtomicBool,
    /// Workers parked or about to park on `wake`; `run` notifies only if there are any.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// A task of the current batch panicked: nobody takes further tasks of it.
    failed: AtomicBool,
    /// The first panic of the current batch, resumed on the caller once the batch is over.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// What the threads prefetch once the current batch has no tasks left for them (see
    /// [`ThreadPool::prefetch_after`]): start and length of each range, and bytes per thread.
    hints: [(AtomicUsize, AtomicUsize); MAX_HINTS],
    hint_budget: AtomicUsize,
}

/// A copy of the pool's hint, taken by a thread before it signals the end of its batch.
#[derive(Clone, Copy)]
struct Hint {
    ranges: [(usize, usize); MAX_HINTS],
    budget: usize,
}

impl Hint {
    fn take(sh: &Shared) -> Hint {
        Hint {
            ranges: std::array::from_fn(|i| {
                let (a, n) = &sh.hints[i];
                (a.load(Ordering::Relaxed), n.load(Ordering::Relaxed))
            }),
            budget: sh.hint_budget.load(Ordering::Relaxed),
        }
    }

    /// Thread `me`'s share (of `n`) of every range, up to the budget spread over them, prefetched
    /// into L2 a few lines at a time while `idle()` holds.
    fn prefetch(&self, me: usize, n: usize, idle: impl Fn() -> bool) {
        self.lines(me, n, idle, |at| {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(at as *const i8);
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = at;
        });
    }

    /// The address of every 64-byte line of thread `me`'s share, to `f`, while `idle()` holds
    /// (asked every [`HINT_LINES_PER_LOOK`] lines).
    fn lines(&self, me: usize, n: usize, idle: impl Fn() -> bool, mut f: impl FnMut(usize)) {
        let used = self.ranges.iter().filter(|r| r.1 > 0).count();
        if used == 0 || self.budget == 0 {
            return;
        }
        let per_range = self.budget / used;
        for &(start, len) in &self.ranges {
            let share = len.div_ceil(n);
            let from = start.wrapping_add(me * share);
            let bytes = share.min(len.saturating_sub(me * share)).min(per_range);
            let mut o = 0;
            while o < bytes {
                if !idle() {
                    return;
                }
                for _ in 0..HINT_LINES_PER_LOOK {
                    if o >= bytes {
                        break;
                    }
                    f(from.wrapping_add(o));
                    o += 64;
                }
            }
        }
    }
}

/// A fat `&dyn Fn` behind a thin pointer, so it fits an `AtomicPtr`.
struct JobRef(*const Job);

/// A fixed set of worker threads that run batches of indexed tasks.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    running: Mutex<()>,
}

impl ThreadPool {
    /// A pool running tasks on `n_threads` threads in all: the caller plus `n_threads - 1` workers.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            n_tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            failed: AtomicBool::new(false),
            panic: Mutex::new(None),
            hints: std::array::from_fn(|_| (AtomicUsize::new(0), AtomicUsize::new(0))),
            hint_budget: AtomicUsize::new(0),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("hearth-worker-{i}"))
                    .spawn(move || worker(&shared, i, n_threads))
                    .expect("spawning a worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            n_threads,
            running: Mutex::new(()),
        }
    }

    /// Number of threads that run tasks (caller included).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(i)` for every `i` in `0..n_tasks`, spread over the pool; returns when all are done.
    ///
    /// # Panics
    /// If a task panics: the first panic is resumed here, after every thread has left `f` (the
    /// remaining tasks of the batch are not run).
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || n_tasks == 1 {
            (0..n_tasks).for_each(|i| task(f, i));
            return;
        }
        // One batch at a time per pool (callers on several threads queue here).
        let _guard = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        sh.failed.store(false, Ordering::Relaxed);
        // SAFETY: the erased borrow of `f` is only used by workers before `pending` reaches zero,
        // and this function does not return or unwind before that: the caller's own share of the
        // tasks runs under `catch_unwind` below, and the wait loop cannot panic.
        let f_static =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Job>(f) };
        let mut job = JobRef(f_static as *const Job);
        sh.job.store(&mut job, Ordering::Relaxed);
        sh.n_tasks.store(n_tasks, Ordering::Relaxed);
        sh.next.store(0, Ordering::Relaxed);
        sh.pending.store(self.workers.len(), Ordering::Relaxed);
        sh.generation.fetch_add(1, Ordering::SeqCst);
        // A worker registers as a sleeper before its last look at `generation` (both SeqCst), so
        // either it sees the new generation or this load sees it: no wake-up is lost, and spinning
        // workers cost no lock or futex call per job. The notify is under the lock, so a worker
        // about to park sees either the new generation or the notify.
        if sh.sleepers.load(Ordering::SeqCst) != 0 {
            let _l = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake.notify_all();
        }
        drain(sh, f, n_tasks);
        let hint = Hint::take(sh);
        hint.prefetch(0, self.n_threads, || {
            sh.pending.load(Ordering::Acquire) != 0
        });
        let mut spins = 0u32;
        while sh.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < SPIN_LIMIT {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // Every worker has its copy of the hint: it was for this batch alone.
        self.clear_hint();
        sh.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        let panic = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = panic {
            resume_unwind(p);
        }
    }
}

/// One task, with the `pool::task` failpoint in front of it (tests make tasks panic with it).
fn task(f: &(dyn Fn(usize) + Sync + '_), i: usize) {
    fail::fail_point!("pool::task");
    f(i);
}

/// Takes tasks of the current batch until none are left or one has panicked; a panic is recorded
/// for [`ThreadPool::run`] to resume, never unwound through here.
fn drain(shared: &Shared, f: &(dyn Fn(usize) + Sync + '_), n_tasks: usize) {
    let run = catch_unwind(AssertUnwindSafe(|| loop {
        if shared.failed.load(Ordering::Relaxed) {
            break;
        }
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        if i >= n_tasks {
            break;
        }
        task(f, i);
    }));
    if let Err(p) = run {
        shared.failed.store(true, Ordering::Relaxed);
        let mut first = shared.panic.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(p);
    }
}

fn worker(sh: &Shared, me: usize, n_threads: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        loop {
            if sh.shutdown.load(Ordering::Acquire) {
                return;
            }
            if sh.generation.load(Ordering::Acquire) != seen {
                break;
            }
            spins += 1;
            if spins < SPIN_LIMIT {
                std::hint::spin_loop();
                continue;
            }
            let guard = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            if sh.generation.load(Ordering::SeqCst) == seen && !sh.shutdown.load(Ordering::SeqCst) {
                drop(sh.wake.wait(guard).unwrap_or_else(|e| e.into_inner()));
            } else {
                drop(guard);
            }
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
            spins = 0;
        }
        seen = sh.generation.load(Ordering::Acquire);
        // SAFETY: `run` published the job before bumping the generation and keeps it alive until
        // `pending` drops to zero, which this worker has not signalled yet.
        let job = unsafe { &*sh.job.load(Ordering::Relaxed) };
        let f: &Job = unsafe { &*job.0 };
        drain(sh, f, sh.n_tasks.load(Ordering::Relaxed));
        let hint = Hint::take(sh);
        sh.pending.fetch_sub(1, Ordering::Release);
        // The hint may name memory freed since the batch ended: a prefetch never faults.
        hint.prefetch(me, n_threads, || {
            sh.generation.load(Ordering::Relaxed) == seen
        });
    }
}

impl ThreadPool {
    /// Asks the threads of the next [`ThreadPool::run`] of more than one task to prefetch (into
    /// L2), once that batch has no tasks left for them, a share each of `ranges` (thread `i` the
    /// `i`-th of `n_threads` equal parts of every range), `budget` bytes per thread at most. For
    /// decode, whose steps stream their weights from memory: the weights of the step after the
    /// next run, asked for while a thread would otherwise wait (for the others' tasks, or for the
    /// caller's work between runs). Only a hint: it changes no result, and a thread stops as soon
    /// as the pool needs it again. Runs of one task (run in place) leave it to the next run.
    pub fn prefetch_after(&self, ranges: &[&[u8]], budget: usize) {
        if self.workers.is_empty() {
            return;
        }
        let sh = &*self.shared;
        for (i, (a, n)) in sh.hints.iter().enumerate() {
            let r = ranges
                .get(i)
                .map_or((0, 0), |r| (r.as_ptr() as usize, r.len()));
            a.store(r.0, Ordering::Relaxed);
            n.store(r.1, Ordering::Relaxed);
        }
        sh.hint_budget.store(budget, Ordering::Relaxed);
    }

    fn clear_hint(&self) {
        self.shared.hint_budget.store(0, Ordering::Relaxed);
    }

    /// Runs `f(rows, first_row)` over `data` (rows of `row_len` elements) in parallel, in slices of
    /// `rows_per_task` whole rows; `f` sees each row exactly once. For row-wise elementwise work.
    pub fn for_rows<T: Send>(
        &self,
        data: &mut [T],
        row_len: usize,
        rows_per_task: usize,
        f: &(dyn Fn(&mut [T], usize) + Sync),
    ) {
        assert!(row_len > 0 && rows_per_task > 0 && data.len().is_multiple_of(row_len));
        let n_rows = data.len() / row_len;
        let out = SharedMut::new(data);
        self.run(n_rows.div_ceil(rows_per_task), &|task| {
            let r0 = task * rows_per_task;
            let r1 = (r0 + rows_per_task).min(n_rows);
            // SAFETY: tasks cover disjoint row ranges of `data`.
            let rows = unsafe { out.slice(r0 * row_len, (r1 - r0) * row_len) };
            f(rows, r0);
        });
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer to a mutable output buffer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(*mut T);
// SAFETY: users guarantee that tasks write disjoint elements and that the buffer outlives the run.
unsafe impl<T: Send> Send for SharedMut<T> {}
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        SharedMut(s.as_mut_ptr())
    }

    /// A placeholder that must not be written through.
    pub(crate) fn dangling() -> Self {
        SharedMut(std::ptr::NonNull::dangling().as_ptr())
    }

    /// # Safety
    /// `start..start+len` must be in bounds and written by one task only.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(start), len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn runs_every_task_once() {
        for threads in 1..4 {
            let pool = ThreadPool::new(threads);
            for n in [0usize, 1, 2, 7, 100] {
                let sum = AtomicU64::new(0);
                pool.run(n, &|i| {
                    sum.fetch_add(i as u64 + 1, Ordering::Relaxed);
                });
                assert_eq!(sum.into_inner(), (n * (n + 1) / 2) as u64);
            }
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_goes_on() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for bad in [0usize, 5, 63] {
                let done = AtomicU64::new(0);
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    pool.run(64, &|i| {
                        assert!(i != bad, "task {i} fails");
                        done.fetch_add(1, Ordering::Relaxed);
                    })
                }));
                let msg = r.expect_err("the panic is propagated");
                let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
                assert_eq!(msg, format!("task {bad} fails"));
                assert!(done.load(Ordering::Relaxed) < 64);
                // The next batch runs every task.
                let sum = AtomicU64::new(0);
                pool.run(100, &|i| {
                    sum.fetch_add(i as u64, Ordering::Relaxed);
                });
                assert_eq!(sum.into_inner(), 4950);
            }
        }
    }

    #[test]
    fn a_hint_splits_its_ranges_over_the_threads_within_the_budget() {
        let hint = Hint {
            ranges: [(1 << 20, 1000), (2 << 20, 64 * 100), (0, 0)],
            budget: 2 * 64 * 40,
        };
        let lines = |me: usize, n: usize| {
            let mut v = Vec::new();
            hint.lines(me, n, || true, |a| v.push(a));
            v
        };
        // Two threads: halves of each range, 40 lines of each at most.
        let base = |r: usize, o: usize| (r << 20) + o;
        let t0: Vec<usize> = (0..8)
            .map(|i| base(1, 64 * i))
            .chain((0..40).map(|i| base(2, 64 * i)))
            .collect();
        assert_eq!(lines(0, 2), t0);
        let t1: Vec<usize> = (0..8)
            .map(|i| base(1, 500 + 64 * i))
            .chain((0..40).map(|i| base(2, 3200 + 64 * i)))
            .collect();
        assert_eq!(lines(1, 2), t1);
        // One thread: the first 40 lines of each.
        assert_eq!(lines(0, 1).len(), 16 + 40);
        // A thread that is needed again stops at its next look.
        let looks = std::cell::Cell::new(0);
        let mut seen = 0;
        hint.lines(
            0,
            1,
            || {
                looks.set(looks.get() + 1);
                looks.get() <= 2
            },
            |_| seen += 1,
        );
        assert_eq!(seen, 2 * HINT_LINES_PER_LOOK);
        // No budget, no ranges: nothing.
        let none = Hint { budget: 0, ..hint };
        none.lines(0, 1, || true, |_| panic!("no line"));
        let empty = Hint {
            ranges: [(0, 0); MAX_HINTS],
            ..hint
        };
        empty.lines(0, 1, || true, |_| panic!("no line"));
    }

    #[test]
    fn a_hint_serves_the_next_run_alone_and_never_faults() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            let data = vec![7u8; 1 << 20];
            let freed = vec![1u8; 1 << 16];
            pool.prefetch_after(&[&data, &freed], 1 << 18);
            // Whatever the hint points at may be gone by the time threads act on it.
            drop(freed);
            let sum = AtomicU64::new(0);
            pool.run(50, &|i| {
                sum.fetch_add(i as u64, Ordering::Relaxed);
            });
            assert_eq!(sum.into_inner(), 1225);
            assert_eq!(pool.shared.hint_budget.load(Ordering::Relaxed), 0);
            // A one-task run (in place) leaves the hint to the next run of several.
            pool.prefetch_after(&[&data], 4096);
            pool.run(1, &|_| {});
            let left = pool.shared.hint_budget.load(Ordering::Relaxed);
            assert_eq!(left, if threads > 1 { 4096 } else { 0 });
            pool.run(2, &|_| {});
            assert_eq!(pool.shared.hint_budget.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn many_small_batches_and_idle_parking() {
        let pool = ThreadPool::new(3);
        let count = AtomicU64::new(0);
        for round in 0..2000 {
            pool.run(5, &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            if round == 1000 {
                // Long enough for the workers to park.
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        assert_eq!(count.into_inner(), 10_000);
    }
}
