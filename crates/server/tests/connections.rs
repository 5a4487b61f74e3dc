//! The connection layer over real sockets (the server in process, on the scripted backend): a
//! client that stops reading its stream loses the stream, its sequence and its connection after
//! the write timeout; an idle keep-alive connection is closed after the idle timeout; a body that
//! stalls is a 408; past the connection limit an idle connection makes room, and when every
//! connection is busy a newcomer gets 503.

mod common;

use std::time::{Duration, Instant};

use common::*;
use hearth_engine::Backend;
use hearth_server::listen::{self, ConnConfig, ConnStats};
use hearth_server::scripted::{Cuts, Script};
use hearth_server::stream::StreamConfig;
use hearth_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

struct Live {
    port: u16,
    setup: Setup,
    conns: ConnStats,
}

/// Short timeouts for tests: one second each, 64 connections.
fn short() -> ConnConfig {
    ConnConfig {
        header_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(1),
        write_timeout: Duration::from_secs(1),
        max_connections: 64,
    }
}

async fn start(script: Script, cfg: ConnConfig) -> Live {
    let config = ServerConfig {
        stream: StreamConfig {
            write_timeout: cfg.write_timeout,
        },
        ..ServerConfig::default()
    };
    let setup = setup_with(script, Tpl::Fixture, config, 1 << 20);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let conns = setup.state.connections().clone();
    tokio::spawn(listen::serve(
        listener,
        setup.app(),
        cfg,
        conns.clone(),
        std::future::pending(),
    ));
    Live { port, setup, conns }
}

fn post_head(path: &str, body: &str, close: bool) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "Connection: close\r\n" } else { "" }
    )
}

/// Reads until the peer closes (or `limit` passes): what arrived, and whether it closed.
async fn read_to_close(s: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&out).into(), true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&out).into(), false),
        }
    }
}

/// Reads until `needle` has arrived.
async fn read_until(s: &mut TcpStream, needle: &str) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !String::from_utf8_lossy(&out).contains(needle) {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before {needle:?}");
            out.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("no answer");
    String::from_utf8_lossy(&out).into()
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool, limit: Duration) -> Duration {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_loses_its_stream_and_connection() {
    // A reply that would stream for more than 30 s: ~31,000 pieces, one a millisecond.
    let mut script = Script::new(&"word ".repeat(400_000));
    script.cuts = Cuts::Chars(64);
    script.delay = Duration::from_millis(1);
    let live = start(script, short()).await;
    // A small receive buffer, so the server's writes back up soon.
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock
        .connect(([127, 0, 0, 1], live.port).into())
        .await
        .unwrap();
    let body = r#"{"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    s.write_all(post_head("/v1/chat/completions", body, false).as_bytes())
        .await
        .unwrap();
    let backend = live.setup.backend.clone();
    wait_for(
        "the stream starts",
        || backend.stats().active == 1,
        Duration::from_secs(5),
    )
    .await;
    // The client reads nothing more. Its sequence is cancelled and its connection closed once the
    // buffers are full and nothing leaves for the write timeout.
    let t = wait_for(
        "the stalled stream is cancelled",
        || backend.stats().active == 0,
        Duration::from_secs(20),
    )
    .await;
    let conns = live.conns.clone();
    wait_for(
        "its connection is closed",
        || conns.open() == 0,
        Duration::from_secs(5),
    )
    .await;
    assert!(t < Duration::from_secs(20), "{t:?}");
    // What the client can still read ends: the server has closed the socket.
    let (_, closed) = read_to_close(&mut s, Duration::from_secs(10)).await;
    assert!(closed);
    // The server goes on serving.
    let mut c = TcpStream::connect(("127.0.0.1", live.port)).await.unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (text, _) = read_to_close(&mut c, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let cfg = ConnConfig {
        header_timeout: Duration::from_secs(10),
        ..short()
    };
    let live = start(Script::new("ok"), cfg).await;
    let mut s = TcpStream::connect(("127.0.0.1", live.port)).await.unwrap();
    for _ in 0..2 {
        // Two requests on the connection, kept alive between them.
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let text = read_until(&mut s, "{\"status\":\"ok\"}").await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }
    // Then nothing: closed after the idle timeout (1 s), not the header timeout (10 s).
    let t0 = Instant::now();
    let (rest, closed) = read_to_close(&mut s, Duration::from_secs(5)).await;
    assert!(closed && rest.is_empty(), "{rest:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(900) && t0.elapsed() < Duration::from_secs(4),
        "{:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_is_408() {
    let live = start(Script::new("ok"), short()).await;
    for path in ["/v1/chat/completions", "/v1/messages", "/api/chat"] {
        let mut s = TcpStream::connect(("127.0.0.1", live.port)).await.unwrap();
        // 10 of the 100 bytes announced, then nothing.
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"messages"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let t0 = Instant::now();
        let text = read_until(&mut s, "stalled").await;
        assert!(text.starts_with("HTTP/1.1 408"), "{path}: {text}");
        assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    }
    assert_eq!(live.setup.backend.stats().active, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_limit_idle_ones_make_room_and_busy_ones_refuse() {
    let mut script = Script::new(&"word ".repeat(100));
    script.delay = Duration::from_millis(15);
    let cfg = ConnConfig {
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
        max_connections: 2,
        ..short()
    };
    let live = start(script, cfg).await;
    let health = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    // Two idle connections fill the limit; a third is served, and one idle one is closed for it.
    let idle1 = TcpStream::connect(("127.0.0.1", live.port)).await.unwrap();
    let idle2 = TcpStream::connect(("127.0.0.1", live.port)).await.unwrap();
    let conns = live.conns.clone();
    wait_for("two open", || conns.open() == 2, Duration::from_secs(5)).await;
    let mut c = TcpStream::connect(("127.0.0.1", live.port)).await.unwrap();
    c.write_all(health).await.unwrap();
    let (text, _) = read_to_close(&mut c, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(live.conns.refused(), 0);
    drop((idle1, idle2));
    wait_for("all closed", || conns.open() == 0, Duration::from_secs(5)).await;
    // Two connections with streams in flight fill it; a third is refused with 503.
    let body = r#"{"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(("127.0.0.1", live.port)).await.unwrap();
        s.write_all(post_head("/v1/chat/completions", body, true).as_bytes())
            .await
            .unwrap();
        read_until(&mut s, "data: ").await;
        busy.push(s);
    }
    let mut c = TcpStream::connect(("127.0.0.1", live.port)).await.unwrap();
    let (text, closed) = read_to_close(&mut c, Duration::from_secs(5)).await;
    assert!(closed && text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("too many open connections"), "{text}");
    assert_eq!(live.conns.refused(), 1);
    // The streams finish whole, and then a newcomer is served again.
    for mut s in busy {
        let (text, _) = read_to_close(&mut s, Duration::from_secs(10)).await;
        assert!(text.contains("data: [DONE]"), "{text}");
    }
    wait_for("all closed", || conns.open() == 0, Duration::from_secs(5)).await;
    let mut c = TcpStream::connect(("127.0.0.1", live.port)).await.unwrap();
    c.write_all(health).await.unwrap();
    let (text, _) = read_to_close(&mut c, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(live.setup.backend.stats().active, 0);
}
