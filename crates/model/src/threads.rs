//! A persistent thread pool for the forward pass.
//!
//! Work is expressed as `n_tasks` independent tasks; workers claim task indices from an atomic counter.
//! Which thread runs a task never changes what the task computes, so results do not depend on the
//! thread count (each output element is reduced by exactly one task, in a fixed order).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Job = dyn Fn(usize) + Sync;

struct Shared {
    state: Mutex<State>,
    start: Condvar,
    done: Condvar,
    next: AtomicUsize,
}

struct State {
    generation: u64,
    job: Option<JobPtr>,
    n_tasks: usize,
    running: usize,
    shutdown: bool,
}

/// A type-erased pointer to the job of the current generation. It is only dereferenced while
/// [`ThreadPool::run`] is blocked waiting for every worker to finish, so the borrow it erases is live.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointee is `Sync` and outlives every use (see `JobPtr`).
unsafe impl Send for JobPtr {}

/// A fixed set of worker threads that run batches of indexed tasks.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
}

impl ThreadPool {
    /// A pool running tasks on `n_threads` threads in all: the caller plus `n_threads - 1` workers.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                job: None,
                n_tasks: 0,
                running: 0,
                shutdown: false,
            }),
            start: Condvar::new(),
            done: Condvar::new(),
            next: AtomicUsize::new(0),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("hearth-worker-{i}"))
                    .spawn(move || worker(&shared))
                    .expect("spawning a worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            n_threads,
        }
    }

    /// Number of threads that run tasks (caller included).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(i)` for every `i` in `0..n_tasks`, spread over the pool; returns when all are done.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        // SAFETY: we erase the lifetime of `f`; every worker finishes with it before we return below.
        let job =
            JobPtr(
                unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Job>(f) }
                    as *const Job,
            );
        {
            let mut st = self.shared.state.lock().unwrap();
            self.shared.next.store(0, Ordering::SeqCst);
            st.job = Some(job);
            st.n_tasks = n_tasks;
            st.running = self.workers.len();
            st.generation += 1;
            self.shared.start.notify_all();
        }
        drain(&self.shared, f, n_tasks);
        let mut st = self.shared.state.lock().unwrap();
        while st.running > 0 {
            st = self.shared.done.wait(st).unwrap();
        }
        st.job = None;
    }
}

fn drain(shared: &Shared, f: &(dyn Fn(usize) + Sync + '_), n_tasks: usize) {
    loop {
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        if i >= n_tasks {
            break;
        }
        f(i);
    }
}

fn worker(shared: &Shared) {
    let mut seen = 0u64;
    loop {
        let (job, n_tasks) = {
            let mut st = shared.state.lock().unwrap();
            while st.generation == seen && !st.shutdown {
                st = shared.start.wait(st).unwrap();
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            (
                st.job.expect("a job is set with each generation"),
                st.n_tasks,
            )
        };
        // SAFETY: `run` keeps the job alive until `running` drops to zero.
        let f: &Job = unsafe { &*job.0 };
        drain(shared, f, n_tasks);
        let mut st = shared.state.lock().unwrap();
        st.running -= 1;
        if st.running == 0 {
            shared.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().shutdown = true;
        self.shared.start.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer to a mutable output buffer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub *mut T);
// SAFETY: users guarantee that tasks write disjoint elements and that the buffer outlives the run.
unsafe impl<T: Send> Send for SharedMut<T> {}
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        SharedMut(s.as_mut_ptr())
    }
    /// The raw pointer (a method, so closures capture the `Sync` wrapper, not the field).
    pub(crate) fn ptr(&self) -> *mut T {
        self.0
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
}
