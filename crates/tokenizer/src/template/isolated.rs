//! Rendering in worker processes, so that no template can take its host down.
//!
//! A template's instruction budget and output cap bound a render's time and result, but not the
//! strings and lists it builds on the way: MiniJinja has no hook on `~`, `+`, `*`, filters or
//! namespace assignments, so `{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}` asks
//! for a terabyte, and an allocation failure aborts the process; a list nested deep enough
//! overflows the stack when it is dropped, which aborts too. Both are template bombs (the class of
//! CVE-2024-34359) that a downloaded model file can carry.
//!
//! So a server renders through [`Workers`]: each render runs in a child process (the same
//! binary, started with [`WorkerCommand`]'s arguments) that set its own data-segment limit before
//! compiling the template. A render that runs out of memory or stack kills only its worker; the
//! caller gets [`TemplateError::ResourceLimit`] and the next render starts a fresh worker. A render
//! that takes longer than the timeout is killed the same way. Workers are reused between renders
//! and at most `max_workers` run at once, so concurrent renders share no unbounded resource.
//!
//! Wire format on the worker's stdin / stdout: frames of a little-endian `u32` length and JSON. The
//! first frame parent → worker is the `Init` (source and limits); then each request is a
//! [`ChatInput`] and each answer a `Reply`.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{ChatInput, ChatTemplate, Limits, TemplateError};

/// How to start a render worker.
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    /// The executable (usually the running binary).
    pub program: PathBuf,
    /// Arguments that make it run [`worker_main`].
    pub args: Vec<OsString>,
    /// The worker's data-segment limit in bytes (heap and anonymous mappings).
    pub memory_bytes: u64,
    /// Longest one render may take.
    pub timeout: Duration,
    /// Most workers running at once.
    pub max_workers: usize,
}

impl WorkerCommand {
    /// `program args...` with the defaults: 256 MiB, 10 s, 2 workers.
    pub fn new(program: PathBuf, args: Vec<OsString>) -> WorkerCommand {
        WorkerCommand {
            program,
            args,
            memory_bytes: 256 << 20,
            timeout: Duration::from_secs(10),
            max_workers: 2,
        }
    }
}

/// The environment variable that passes the memory limit to a worker.
const MEMORY_ENV: &str = "HEARTH_RENDER_MEMORY";

/// Largest frame accepted (a rendered prompt is capped far below this).
const MAX_FRAME: usize = 256 << 20;

/// The first message to a worker.
#[derive(Serialize, Deserialize)]
struct Init {
    source: String,
    fuel: u64,
    max_output_bytes: usize,
    recursion_limit: usize,
}

/// A worker's answer to one render.
#[derive(Serialize, Deserialize)]
enum Reply {
    Ok(String),
    Err(WireError),
}

/// [`TemplateError`] as it crosses the pipe.
#[derive(Serialize, Deserialize)]
enum WireError {
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    Raised(String),
    Render {
        message: String,
        line: Option<usize>,
    },
    OutOfFuel {
        fuel: u64,
    },
    OutputTooLarge {
        limit: usize,
    },
    InvalidInput(String),
}

impl From<TemplateError> for WireError {
    fn from(e: TemplateError) -> WireError {
        match e {
            TemplateError::Syntax {
                line,
                column,
                message,
            } => WireError::Syntax {
                line,
                column,
                message,
            },
            TemplateError::Raised(m) => WireError::Raised(m),
            TemplateError::OutOfFuel { fuel } => WireError::OutOfFuel { fuel },
            TemplateError::OutputTooLarge { limit } => WireError::OutputTooLarge { limit },
            TemplateError::InvalidInput(m) => WireError::InvalidInput(m),
            other => WireError::Render {
                message: other.to_string(),
                line: None,
            },
        }
    }
}

impl From<WireError> for TemplateError {
    fn from(e: WireError) -> TemplateError {
        match e {
            WireError::Syntax {
                line,
                column,
                message,
            } => TemplateError::Syntax {
                line,
                column,
                message,
            },
            WireError::Raised(m) => TemplateError::Raised(m),
            WireError::Render { message, line } => TemplateError::Render { message, line },
            WireError::OutOfFuel { fuel } => TemplateError::OutOfFuel { fuel },
            WireError::OutputTooLarge { limit } => TemplateError::OutputTooLarge { limit },
            WireError::InvalidInput(m) => TemplateError::InvalidInput(m),
        }
    }
}

fn write_frame(w: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    let len =
        u32::try_from(data.len()).map_err(|_| std::io::Error::other("frame larger than 4 GiB"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(data)?;
    w.flush()
}

fn read_frame(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("frame of {len} bytes")));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// The worker process: limits its own memory, compiles the template it is sent, and renders
/// requests until its input closes. Returns the process exit code.
pub fn worker_main() -> i32 {
    if let Some(bytes) = std::env::var(MEMORY_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        limit_memory(bytes);
    }
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let Ok(init) = read_frame(&mut stdin) else {
        return 2;
    };
    let Ok(init) = serde_json::from_slice::<Init>(&init) else {
        return 2;
    };
    let limits = Limits {
        fuel: init.fuel,
        max_output_bytes: init.max_output_bytes,
        recursion_limit: init.recursion_limit,
    };
    let template = ChatTemplate::with_limits(&init.source, limits);
    while let Ok(frame) = read_frame(&mut stdin) {
        let reply = match serde_json::from_slice::<ChatInput>(&frame) {
            Err(e) => Reply::Err(WireError::InvalidInput(e.to_string())),
            Ok(input) => match &template {
                Ok(t) => match t.render_here(&input) {
                    Ok(s) => Reply::Ok(s),
                    Err(e) => Reply::Err(e.into()),
                },
                Err(e) => Reply::Err(WireError::Render {
                    message: e.to_string(),
                    line: None,
                }),
            },
        };
        let Ok(bytes) = serde_json::to_vec(&reply) else {
            return 2;
        };
        if write_frame(&mut stdout, &bytes).is_err() {
            return 0;
        }
    }
    0
}

#[cfg(unix)]
fn limit_memory(bytes: u64) {
    let r = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: setrlimit reads the struct it is given; lowering one's own limit is always allowed.
    unsafe {
        libc::setrlimit(libc::RLIMIT_DATA, &r);
    }
}

#[cfg(not(unix))]
fn limit_memory(_bytes: u64) {}

/// One running worker.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    stderr: ChildStderr,
}

impl Worker {
    fn spawn(cmd: &WorkerCommand, init: &[u8]) -> Result<Worker, TemplateError> {
        let spawn_err = |e: std::io::Error| {
            TemplateError::Worker(format!(
                "cannot start the template worker {}: {e}",
                cmd.program.display()
            ))
        };
        let mut child = Command::new(&cmd.program)
            .args(&cmd.args)
            .env(MEMORY_ENV, cmd.memory_bytes.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            return Err(TemplateError::Worker(
                "the template worker has no pipes".into(),
            ));
        };
        if let Err(e) = write_frame(&mut stdin, init) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(spawn_err(e));
        }
        Ok(Worker {
            child,
            stdin,
            stdout,
            stderr,
        })
    }

    /// Sends one render; the worker is returned when it is still usable.
    fn render(
        mut self,
        input: &[u8],
        cmd: &WorkerCommand,
    ) -> (Result<String, TemplateError>, Option<Worker>) {
        let sent = write_frame(&mut self.stdin, input);
        let ready = sent.is_ok() && wait_readable(&self.stdout, cmd.timeout);
        if !ready {
            let timed_out = sent.is_ok();
            return (Err(self.died(cmd, timed_out)), None);
        }
        match read_frame(&mut self.stdout) {
            Ok(frame) => match serde_json::from_slice::<Reply>(&frame) {
                Ok(Reply::Ok(s)) => (Ok(s), Some(self)),
                Ok(Reply::Err(e)) => (Err(e.into()), Some(self)),
                Err(e) => (
                    Err(TemplateError::Worker(format!(
                        "the template worker answered garbage: {e}"
                    ))),
                    None,
                ),
            },
            Err(_) => (Err(self.died(cmd, false)), None),
        }
    }

    /// Kills the worker and says why it stopped answering.
    fn died(mut self, cmd: &WorkerCommand, timed_out: bool) -> TemplateError {
        if timed_out {
            let _ = self.child.kill();
        }
        let status = self.child.wait();
        let mut err = String::new();
        let _ = (&mut self.stderr).take(4096).read_to_string(&mut err);
        if timed_out {
            return TemplateError::Timeout {
                seconds: cmd.timeout.as_secs_f64(),
            };
        }
        tracing_hint(&err);
        match status {
            // Killed by a signal (abort on a failed allocation, a stack overflow) or exited
            // non-zero: the render hit the worker's limits.
            Ok(s) if !s.success() => TemplateError::ResourceLimit {
                limit_bytes: cmd.memory_bytes,
            },
            _ => TemplateError::Worker(format!(
                "the template worker stopped: {}",
                err.lines().last().unwrap_or("no message")
            )),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a dying worker printed, for whoever debugs it (the caller's error is the clean one).
fn tracing_hint(stderr: &str) {
    // Rust's own abort message, not the backtrace notes after it.
    let line = stderr
        .lines()
        .find(|l| l.contains("memory allocation") || l.contains("overflowed its stack"))
        .or_else(|| stderr.lines().next());
    if let Some(line) = line {
        tracing::warn!("the template worker stopped: {line}");
    }
}

/// Waits until `out` has something to read (or was closed); false after `timeout`.
#[cfg(unix)]
fn wait_readable(out: &ChildStdout, timeout: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fd = libc::pollfd {
            fd: out.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        if n > 0 {
            return true;
        }
        if n == 0 || left.is_zero() {
            return false;
        }
        // EINTR: try again until the deadline.
    }
}

#[cfg(not(unix))]
fn wait_readable(_out: &ChildStdout, _timeout: Duration) -> bool {
    true
}

/// A pool of render workers for one template.
pub struct Workers {
    cmd: WorkerCommand,
    init: Vec<u8>,
    idle: Mutex<(Vec<Worker>, usize)>, // (idle workers, workers in use)
    freed: Condvar,
}

impl Workers {
    /// A pool that renders `template` with `cmd`'s workers; started lazily.
    pub fn new(template: &ChatTemplate, cmd: WorkerCommand) -> Workers {
        let l = template.limits();
        let init = Init {
            source: template.source().to_string(),
            fuel: l.fuel,
            max_output_bytes: l.max_output_bytes,
            recursion_limit: l.recursion_limit,
        };
        Workers {
            init: serde_json::to_vec(&init).unwrap_or_default(),
            cmd: WorkerCommand {
                max_workers: cmd.max_workers.max(1),
                ..cmd
            },
            idle: Mutex::new((Vec::new(), 0)),
            freed: Condvar::new(),
        }
    }

    /// Renders `input` in a worker.
    pub fn render(&self, input: &ChatInput) -> Result<String, TemplateError> {
        let request =
            serde_json::to_vec(input).map_err(|e| TemplateError::InvalidInput(e.to_string()))?;
        let worker = self.take()?;
        let worker = match worker {
            Some(w) => w,
            None => match Worker::spawn(&self.cmd, &self.init) {
                Ok(w) => w,
                Err(e) => {
                    self.give_back(None);
                    return Err(e);
                }
            },
        };
        let (result, worker) = worker.render(&request, &self.cmd);
        self.give_back(worker);
        result
    }

    /// An idle worker (`None`: start one), waiting while `max_workers` are busy, at most as long
    /// as one render may take: renders queued behind slow templates give up ([`TemplateError::Busy`])
    /// rather than pile up on the blocking pool.
    fn take(&self) -> Result<Option<Worker>, TemplateError> {
        let deadline = Instant::now() + self.cmd.timeout;
        let mut g = self
            .idle
            .lock()
            .map_err(|_| TemplateError::Worker("the worker pool is poisoned".into()))?;
        loop {
            if let Some(w) = g.0.pop() {
                g.1 += 1;
                return Ok(Some(w));
            }
            if g.1 < self.cmd.max_workers {
                g.1 += 1;
                return Ok(None);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TemplateError::Busy {
                    seconds: self.cmd.timeout.as_secs_f64(),
                });
            }
            g = self
                .freed
                .wait_timeout(g, left)
                .map_err(|_| TemplateError::Worker("the worker pool is poisoned".into()))?
                .0;
        }
    }

    fn give_back(&self, worker: Option<Worker>) {
        if let Ok(mut g) = self.idle.lock() {
            g.1 -= 1;
            if let Some(w) = worker {
                g.0.push(w);
            }
        }
        self.freed.notify_one();
    }
}
