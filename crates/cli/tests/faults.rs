//! `hearth serve` under attack and faults, as a real process: a template bomb (given with
//! `--chat-template` and carried inside a GGUF), hundreds of idle sockets under a low open-file
//! limit, and a failpoint that makes an engine step panic. In each case the affected request gets a
//! clear error and the server goes on serving everyone else. A `--cache-dir` that cannot be made
//! stops the server at start, naming it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn shared(rel: &str) -> String {
    format!("{ROOT}/../shared/{rel}")
}

/// The template of the issue: 40 doublings of a string held in a namespace (a terabyte).
const BOMB: &str = "{% set s = namespace(v='x') %}{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v|length }}";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 exchange on a fresh connection: (status, body).
fn request(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// `hearth serve MODEL args...` (through `sh -c` when `prefix` sets up the shell, e.g. a
    /// `ulimit`), once `/health` answers.
    fn start(model: &str, args: &[&str], prefix: &str, env: &[(&str, &str)]) -> Server {
        let s = Server::spawn(model, args, prefix, env, Stdio::inherit());
        s.wait_health(200);
        s
    }

    /// `hearth serve MODEL args...` with its stderr going to `stderr`, once it listens.
    fn spawn(
        model: &str,
        args: &[&str],
        prefix: &str,
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> Server {
        let port = free_port();
        let mut cmd = format!(
            "{prefix} exec '{}' serve '{model}' --port {port} -c 512 --parallel 2 -t 2",
            env!("CARGO_BIN_EXE_hearth")
        );
        for a in args {
            cmd.push_str(&format!(" '{a}'"));
        }
        let child = Command::new("sh")
            .args(["-c", &cmd])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        port_or_wait(port);
        Server { child, port }
    }

    /// Waits until `/health` answers `status` (200: ready; 503 after loading: unhealthy).
    fn wait_health(&self, status: u16) -> String {
        let t0 = Instant::now();
        loop {
            let (got, body) = request(self.port, "GET", "/health", "");
            if got == status && !body.contains("loading") {
                return body;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "/health did not turn {status}: {got} {body}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Peak resident memory of the server process (kB), from /proc.
    fn peak_rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, body) = request(self.port, "GET", "/metrics", "");
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }

    /// `name` once it reads `want`, or its last reading after 5 s: the engine publishes its
    /// stats when it has finished a step, which may be just after a reply's last byte was sent.
    fn settled(&self, name: &str, want: f64) -> f64 {
        let t0 = Instant::now();
        loop {
            let v = self.metric(name);
            if v == want || t0.elapsed() > Duration::from_secs(5) {
                return v;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Waits until something listens on `port` (the server binds before loading).
fn port_or_wait(port: u16) -> u16 {
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(60), "nothing listens");
        std::thread::sleep(Duration::from_millis(50));
    }
    port
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn smollm2() -> String {
    std::env::var("HEARTH_SMOLLM2")
        .unwrap_or_else(|_| format!("{ROOT}/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
}

const CHAT: &str =
    r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0}"#;
const COMPLETION: &str = r#"{"prompt":"Once upon a time","max_tokens":4,"temperature":0}"#;

/// A copy of `src` whose `tokenizer.chat_template` is `template`.
fn with_template(src: &Path, template: &str, out: &Path) {
    let g = hearth_gguf::Gguf::open(src).unwrap();
    let mut b = hearth_gguf::GgufBuilder::new();
    for (k, v) in g.metadata().iter() {
        if k != "tokenizer.chat_template" && k != "general.alignment" {
            b = b.kv(k, v.clone());
        }
    }
    b = b.kv(
        "tokenizer.chat_template",
        hearth_gguf::Value::String(template.into()),
    );
    for t in g.tensors() {
        b = b.tensor(t.name.clone(), t.ty, &t.dims, g.tensor_data(t).to_vec());
    }
    std::fs::write(out, b.build().unwrap()).unwrap();
}

fn assert_bomb_contained(server: &Server) {
    let (status, body) = request(server.port, "POST", "/v1/chat/completions", CHAT);
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("memory budget"), "a clear error: {body}");
    // The server keeps serving: completions (no template), health, and the next chat request
    // gets the same clean error.
    let (status, body) = request(server.port, "POST", "/v1/completions", COMPLETION);
    assert_eq!(status, 200, "{body}");
    assert_eq!(request(server.port, "GET", "/health", "").0, 200);
    let (status, _) = request(server.port, "POST", "/v1/chat/completions", CHAT);
    assert_eq!(status, 500);
}

#[test]
fn a_template_bomb_fails_its_request_not_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.jinja");
    std::fs::write(&bomb, BOMB).unwrap();
    let server = Server::start(
        &smollm2(),
        &["--chat-template", bomb.to_str().unwrap()],
        "",
        &[],
    );
    assert_bomb_contained(&server);
    let peak = server.peak_rss_kb();
    assert!(
        peak < 500 * 1024,
        "peak RSS {peak} kB: the bomb's memory must not land in the server"
    );
    // The same template inside a model file: SmolLM2 with its template swapped for the bomb.
    let model = dir.path().join("bomb.gguf");
    with_template(&PathBuf::from(smollm2()), BOMB, &model);
    let server = Server::start(model.to_str().unwrap(), &[], "", &[]);
    assert_bomb_contained(&server);
    let peak = server.peak_rss_kb();
    assert!(
        peak < 500 * 1024,
        "peak RSS {peak} kB with the bomb in the file"
    );
}

#[test]
fn idle_sockets_beyond_the_file_limit_do_not_lock_clients_out() {
    let server = Server::start(
        &shared("fixtures/tiny-qwen3.q4_0.gguf"),
        &["--header-timeout", "60"],
        "ulimit -n 256;",
        &[],
    );
    // 300 connections that send nothing, more than the process may hold open.
    let idle: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", server.port)).ok())
        .collect();
    assert!(idle.len() >= 250, "opened {}", idle.len());
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let (status, body) = request(server.port, "POST", "/v1/completions", COMPLETION);
    assert_eq!(status, 200, "a normal client is served: {body}");
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert!(server.metric("hearth_open_connections") < 256.0);
    drop(idle);
}

#[test]
fn an_idle_connection_is_closed_after_the_header_timeout() {
    let server = Server::start(
        &shared("fixtures/tiny-qwen3.q4_0.gguf"),
        &["--header-timeout", "1", "--idle-timeout", "1"],
        "",
        &[],
    );
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Half a request head, then nothing: closed (read returns 0) within a few seconds.
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

/// Every engine failpoint through the real server: the affected request fails with a clear 500
/// (or, streamed, an error frame after the tokens already sent), the next request is served,
/// `/health` stays 200 and no sequence stays active.
#[test]
fn each_failpoint_fails_one_request_and_the_server_goes_on() {
    const STREAM: &str =
        r#"{"prompt":"Once upon a time","max_tokens":4,"temperature":0,"stream":true}"#;
    for (fp, body, want) in [
        (
            "engine::step=1*panic(injected)",
            COMPLETION,
            "internal error: injected",
        ),
        (
            "pool::task=1*panic(injected task)",
            COMPLETION,
            "injected task",
        ),
        (
            "kv::alloc=1*return",
            COMPLETION,
            "KV cache could not be allocated",
        ),
        (
            "kv::alloc=1*panic(injected admission)",
            COMPLETION,
            "aborted",
        ),
        // The second step (the first decode) fails: the stream has its first token, then the error.
        (
            "engine::step=1*off->1*panic(injected)",
            STREAM,
            "internal error: injected",
        ),
    ] {
        let server = Server::start(
            &shared("fixtures/tiny-qwen3moe.q4_k_m.gguf"),
            &[],
            "",
            &[("FAILPOINTS", fp)],
        );
        let t0 = Instant::now();
        let (status, text) = request(server.port, "POST", "/v1/completions", body);
        assert!(t0.elapsed() < Duration::from_secs(30), "{fp}: no hang");
        if body == STREAM {
            assert_eq!(status, 200, "{fp}: {text}");
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect();
            assert!(data.len() >= 2, "{fp}: a token, then the error: {text}");
            assert!(data[0].contains("\"text\""), "{fp}: {text}");
            assert!(data.last().unwrap().contains(want), "{fp}: {text}");
            assert!(!text.contains("[DONE]"), "{fp}: {text}");
        } else {
            assert_eq!(status, 500, "{fp}: {text}");
            assert!(text.contains(want), "{fp}: {text}");
        }
        let (status, text) = request(server.port, "POST", "/v1/completions", COMPLETION);
        assert_eq!(status, 200, "{fp}: the next request is served: {text}");
        assert_eq!(request(server.port, "GET", "/health", "").0, 200, "{fp}");
        assert_eq!(server.settled("hearth_active_sequences", 0.0), 0.0, "{fp}");
    }
}

/// Every disk-cache write fails: requests are served from memory all the same, nothing is left
/// in the cache directory, and a shutdown (which writes the cache out) still ends promptly.
#[test]
fn failing_disk_cache_writes_cost_the_cache_not_the_requests() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("kv");
    let log = dir.path().join("stderr.log");
    let mut server = Server::spawn(
        &shared("fixtures/tiny-qwen3.q4_0.gguf"),
        &[
            "--cache-dir",
            cache.to_str().unwrap(),
            "--cache-disk",
            "64M",
        ],
        "",
        &[("FAILPOINTS", "cache::write=return")],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    server.wait_health(200);
    // Two full KV blocks of prompt, so finished sequences hand blocks to the disk tier.
    let long = format!(
        r#"{{"prompt":"{}","max_tokens":4,"temperature":0}}"#,
        "Beautiful is better than ugly. ".repeat(24)
    );
    for _ in 0..2 {
        let (status, text) = request(server.port, "POST", "/v1/completions", &long);
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(server.settled("hearth_active_sequences", 0.0), 0.0);
    let t0 = Instant::now();
    // SAFETY: kill(2) on the child's pid, which this test owns and has not reaped.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let status = loop {
        if let Some(st) = server.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the server did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        stderr.contains("failpoint cache::write"),
        "the writes were attempted and failed: {stderr}"
    );
    let blocks = walk(&cache)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "blk" || e == "tmp"))
        .count();
    assert_eq!(blocks, 0, "no block file (or temporary) is left");
}

/// Files under `dir`, recursively.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// An engine thread that dies (a panic outside any one request's step): `/health` turns 503 with
/// the reason and generating requests get 503, while the server itself keeps answering.
#[test]
fn a_dead_engine_makes_health_and_requests_503() {
    let server = Server::spawn(
        &shared("fixtures/tiny-qwen3.q4_0.gguf"),
        &[],
        "",
        &[("FAILPOINTS", "engine::loop=panic(injected engine death)")],
        Stdio::inherit(),
    );
    let body = server.wait_health(503);
    assert!(body.contains("injected engine death"), "{body}");
    assert!(body.contains("\"error\""), "{body}");
    for (path, body) in [
        ("/v1/completions", COMPLETION),
        ("/v1/chat/completions", CHAT),
    ] {
        let (status, text) = request(server.port, "POST", path, body);
        assert_eq!(status, 503, "{path}: {text}");
        assert!(text.contains("cannot serve"), "{path}: {text}");
    }
    assert_eq!(request(server.port, "GET", "/v1/models", "").0, 200);
}

#[test]
fn a_cache_dir_that_cannot_be_made_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let model = shared("fixtures/tiny-qwen3.q4_0.gguf");
    let serve = |extra: &[&str]| {
        let port = free_port().to_string();
        let mut args = vec!["serve", &model, "--port", &port];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // A file where the directory should be: the error names it.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = serve(&["--cache-dir", file.to_str().unwrap()]);
    assert!(err.contains("not-a-dir"), "{err}");
    // A size without a directory is a usage error.
    let err = serve(&["--cache-disk", "1G"]);
    assert!(err.contains("--cache-dir"), "{err}");
    // A directory that does not exist yet is made, and the server runs.
    let good = dir.path().join("cache/kv");
    let server = Server::start(
        &model,
        &["--cache-dir", good.to_str().unwrap(), "--cache-disk", "64M"],
        "",
        &[],
    );
    assert!(good.is_dir());
    let (status, body) = request(server.port, "POST", "/v1/completions", COMPLETION);
    assert_eq!(status, 200, "{body}");
}
