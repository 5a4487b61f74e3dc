//! The connection layer: accepts sockets and serves HTTP/1.1 on them with the bounds a server facing
//! outside clients needs, which `axum::serve` does not offer.
//!
//! - **Header timeout**: a connection that opens and sends nothing, or trickles a request head,
//!   is closed after `header_timeout` (slowloris).
//! - **Idle timeout**: a keep-alive connection with no request for `idle_timeout` is closed.
//! - **Body timeout**: a request body that stalls for `body_timeout` between chunks fails the
//!   request (408).
//! - **Write timeout**: a connection whose socket has not taken a byte for `write_timeout` (the
//!   client stopped reading) is closed; that drops the response body it was writing, which
//!   cancels the request's sequence.
//! - **Connection limit**: at most `max_connections` sockets are held, below the process's file
//!   limit so `accept` itself never runs out of descriptors. At the limit the longest-idle
//!   connection (no request in flight) is closed to make room; only when every connection is busy
//!   is the newcomer answered 503 and closed.
//! - **Graceful shutdown**: when `shutdown` resolves, no more sockets are accepted, idle
//!   connections close, and requests in flight finish; [`serve`] returns when the last connection
//!   has closed (the caller bounds the wait).
//!
//! Streamed replies also time out one level up, when their frames stop leaving (see
//! [`crate::stream`]); the socket-level timeout here covers what is already in hyper's buffers,
//! whole replies, and frees the connection itself.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;

/// Bounds on connections.
#[derive(Clone, Copy, Debug)]
pub struct ConnConfig {
    /// Longest a connection may take to send a whole request head (also a new connection's
    /// first one).
    pub header_timeout: Duration,
    /// Longest a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Longest a request body may stall between chunks.
    pub body_timeout: Duration,
    /// Longest a write to the socket may wait for the client to read.
    pub write_timeout: Duration,
    /// Most open connections.
    pub max_connections: usize,
}

impl Default for ConnConfig {
    fn default() -> ConnConfig {
        ConnConfig {
            header_timeout: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
            max_connections: default_max_connections(),
        }
    }
}

/// Descriptors kept free for everything that is not a client socket (the model file, logs,
/// pipes of render workers, the disk cache).
const RESERVED_FDS: u64 = 64;

/// `accept`'s "too many open files" errors (process and system limits; the same numbers on Linux,
/// macOS and the BSDs).
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

/// The process's soft limit on open files, where the platform says.
pub fn fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given and nothing else.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
            // `rlim_t` is u64 on Linux but not on every libc.
            #[allow(clippy::useless_conversion)]
            return u64::try_from(r.rlim_cur).ok();
        }
    }
    None
}

/// 512 connections, or fewer when the file limit is lower: always `RESERVED_FDS` below it.
pub fn default_max_connections() -> usize {
    let cap = fd_limit().map_or(512, |n| n.saturating_sub(RESERVED_FDS).max(1));
    cap.min(512) as usize
}

/// Milliseconds since `base`, for atomics.
fn ms_since(base: Instant) -> u64 {
    base.elapsed().as_millis() as u64
}

/// What the watchdog of one connection knows about it.
struct ConnState {
    base: Instant,
    /// Requests whose response has not finished.
    in_flight: AtomicUsize,
    /// When the connection last became idle (opened, or its last response ended), ms since `base`.
    idle_since: AtomicU64,
    /// When the first byte of the next request arrived while idle, ms since `base` + 1 (0: none).
    head_started: AtomicU64,
    /// Whether it has served a request (the idle timeout applies then, the header timeout before).
    served: AtomicUsize,
    /// Asks the connection to close.
    close: Notify,
    /// It has been asked to close (to make room) and will go soon: not a victim again.
    closing: AtomicBool,
    /// Since when a write has been waiting for the socket to take bytes, ms since `base` + 1
    /// (0: not waiting).
    write_blocked: AtomicU64,
}

impl ConnState {
    fn new() -> ConnState {
        ConnState {
            base: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            served: AtomicUsize::new(0),
            close: Notify::new(),
            closing: AtomicBool::new(false),
            write_blocked: AtomicU64::new(0),
        }
    }

    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// How long since this connection did anything useful.
    fn idle_for(&self) -> Duration {
        let since = self.idle_since.load(Ordering::Acquire);
        Duration::from_millis(ms_since(self.base).saturating_sub(since))
    }

    /// Why the watchdog should close it now, if it should.
    fn expired(&self, cfg: &ConnConfig) -> Option<&'static str> {
        let now = ms_since(self.base);
        let blocked = self.write_blocked.load(Ordering::Acquire);
        if blocked > 0 && Duration::from_millis(now.saturating_sub(blocked - 1)) > cfg.write_timeout
        {
            return Some("the client stopped reading");
        }
        if !self.is_idle() {
            return None;
        }
        let head = self.head_started.load(Ordering::Acquire);
        if head > 0 {
            let started = Duration::from_millis(now.saturating_sub(head - 1));
            return (started > cfg.header_timeout).then_some("request head not complete");
        }
        let limit = if self.served.load(Ordering::Acquire) > 0 {
            cfg.idle_timeout
        } else {
            cfg.header_timeout
        };
        (self.idle_for() > limit).then_some("no request")
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(0, Ordering::Release);
        self.served.fetch_add(1, Ordering::AcqRel);
    }

    fn request_ended(&self) {
        self.idle_since
            .store(ms_since(self.base), Ordering::Release);
        self.head_started.store(0, Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn bytes_read(&self) {
        if self.is_idle() && self.head_started.load(Ordering::Acquire) == 0 {
            self.head_started
                .store(ms_since(self.base) + 1, Ordering::Release);
        }
    }
}

/// The socket, telling its connection's state when request bytes arrive.
struct Watched {
    io: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.state.bytes_read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        let blocked = &self.state.write_blocked;
        if r.is_pending() {
            if blocked.load(Ordering::Acquire) == 0 {
                blocked.store(ms_since(self.state.base) + 1, Ordering::Release);
            }
        } else {
            blocked.store(0, Ordering::Release);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Ends a request's in-flight count when its response body is done (or dropped).
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// A response body that holds its request's [`InFlight`] until it is dropped.
struct TrackedBody {
    body: Body,
    _guard: InFlight,
}

impl http_body::Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Open connections, for the limit and for shutdown.
#[derive(Default)]
struct Registry {
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
    next: AtomicU64,
    /// Connections answered 503 because every slot was busy.
    refused: AtomicU64,
}

impl Registry {
    fn len(&self) -> usize {
        self.conns.lock().map_or(0, |c| c.len())
    }

    /// Asks the longest-idle connection without a request in flight to close; false if every
    /// connection is busy.
    fn evict_idle(&self) -> bool {
        let Ok(conns) = self.conns.lock() else {
            return false;
        };
        // A connection asked to close before still holds its socket until its task runs; picking
        // it again would let a burst of accepts pass the limit (and then run out of descriptors,
        // with nothing left to evict until the header timeout).
        let victim = conns
            .values()
            .filter(|c| c.is_idle() && !c.closing.load(Ordering::Acquire))
            .max_by_key(|c| c.idle_for());
        match victim {
            Some(c) => {
                c.closing.store(true, Ordering::Release);
                c.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Counters of the connection layer, for `/metrics`.
#[derive(Clone, Default)]
pub struct ConnStats(Arc<Registry>);

impl ConnStats {
    /// Open connections now.
    pub fn open(&self) -> usize {
        self.0.len()
    }

    /// Connections refused with 503 because all slots held requests.
    pub fn refused(&self) -> u64 {
        self.0.refused.load(Ordering::Relaxed)
    }
}

/// Serves `app` on `listener` until `shutdown` resolves and every connection has closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    cfg: ConnConfig,
    stats: ConnStats,
    shutdown: impl Future<Output = ()> + Send,
) {
    let registry = stats.0;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    let mut last_accept_error = Instant::now() - Duration::from_secs(60);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let sock = match accepted {
            Ok((sock, _peer)) => sock,
            Err(e) => {
                // Out of descriptors (or another transient failure): make room if an idle
                // connection can go, and back off instead of spinning.
                if matches!(e.raw_os_error(), Some(EMFILE | ENFILE)) {
                    registry.evict_idle();
                }
                if last_accept_error.elapsed() > Duration::from_secs(1) {
                    tracing::warn!("accept failed: {e}");
                    last_accept_error = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        if registry.len() >= cfg.max_connections && !registry.evict_idle() {
            registry.refused.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(refuse(sock));
            continue;
        }
        let state = Arc::new(ConnState::new());
        let id = registry.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut c) = registry.conns.lock() {
            c.insert(id, state.clone());
        }
        let registry = registry.clone();
        let app = app.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            connection(sock, app, cfg, state, &mut stop).await;
            if let Ok(mut c) = registry.conns.lock() {
                c.remove(&id);
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Wait for the connections to finish their requests and close.
    while registry.len() > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Serves one connection under its watchdog.
async fn connection(
    sock: TcpStream,
    app: Router,
    cfg: ConnConfig,
    state: Arc<ConnState>,
    stop: &mut watch::Receiver<bool>,
) {
    let io = TokioIo::new(Watched {
        io: sock,
        state: state.clone(),
    });
    let st = state.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        st.request_started();
        let guard = InFlight(st.clone());
        let req = req.map(|b| Body::new(TimeoutBody::new(cfg.body_timeout, b)));
        let app = app.clone();
        async move {
            let resp = app.oneshot(req).await?;
            Ok::<_, std::convert::Infallible>(resp.map(|body| TrackedBody {
                body,
                _guard: guard,
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).keep_alive(true);
    // The watchdog below times request heads (hyper's own header timer would also cut idle
    // keep-alive waits at the header timeout).
    builder.header_read_timeout(None);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut stopping = *stop.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            _ = state.close.notified() => {
                tracing::debug!("closing an idle connection to make room for a new one");
                return;
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tick.tick() => {
                if let Some(why) = state.expired(&cfg) {
                    tracing::debug!("closing a connection: {why}");
                    return;
                }
            }
        }
    }
}

/// Answers a connection over the limit with 503 and closes it.
async fn refuse(mut sock: TcpStream) {
    const BODY: &str = r#"{"error":{"message":"too many open connections; retry shortly","type":"server_error","param":null,"code":"unavailable"}}"#;
    let resp = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), sock.write_all(resp.as_bytes())).await;
    let _ = sock.shutdown().await;
}
