//! `hearth serve` driven by the official Python clients (`openai`, `anthropic`, `ollama`):
//! crates/server/tests/py/test_clients.py runs against the real binary on a tiny fixture model, and
//! again against the scripted backend for the reasoning and tool-call paths. Then SIGTERM while a
//! reply streams: the reply finishes and the server exits 0. test_structured.py checks structured
//! output (schemas, grammars, forced tool calls) on the tiny dense Qwen3 with the Qwen3 template, and
//! test_tool_calls.py every tool-call case (XML and JSON calls, typed arguments, several calls, an
//! unoffered tool, an unparseable or cut-off call) through each SDK, streamed and whole.
//!
//! Needs the clients: `.venv/bin/pip install -r requirements-test.txt` (HEARTH_PYTHON picks the
//! interpreter; default the repository's .venv).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn shared(rel: &str) -> String {
    format!("{}/../shared/{rel}", ROOT)
}

fn python() -> PathBuf {
    let p = std::env::var("HEARTH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(format!("{ROOT}/.venv/bin/python")));
    let ok = Command::new(&p)
        .args([
            "-c",
            "import openai, anthropic, ollama, pytest, httpx, jsonschema",
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} cannot import openai, anthropic, ollama, pytest, httpx and jsonschema: run `.venv/bin/pip install -r requirements-test.txt` \
         (or point HEARTH_PYTHON at an interpreter that has them)",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A minimal HTTP/1.1 exchange; returns the raw response.
fn http(port: u16, req: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    s.write_all(req.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Server::start_model("fixtures/tiny-qwen3moe.q4_k_m.gguf", extra)
    }

    fn start_model(model: &str, extra: &[&str]) -> Server {
        let port = free_port();
        let mut args = vec![
            "serve".to_string(),
            shared(model),
            "--port".into(),
            port.to_string(),
        ];
        if !extra.contains(&"-c") {
            args.extend(["-c", "1024"].map(String::from));
        }
        args.extend(["--parallel", "4", "-t", "2"].map(String::from));
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let s = Server { child, port };
        let t0 = Instant::now();
        loop {
            let r = http(
                port,
                "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            );
            if r.as_ref().is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
                assert!(r.unwrap().contains(r#"{"status":"ok"}"#));
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "server did not become healthy: {r:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn pytest(&self, env: &[(&str, &str)]) {
        self.pytest_file("test_clients.py", env);
    }

    fn pytest_file(&self, file: &str, env: &[(&str, &str)]) {
        let status = Command::new(python())
            .args([
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                &format!("{ROOT}/crates/server/tests/py/{file}"),
            ])
            .env("HEARTH_URL", self.url())
            .envs(env.iter().copied())
            .status()
            .unwrap();
        assert!(
            status.success(),
            "the Python client tests failed (see above)"
        );
    }

    /// SIGTERM, then the exit status.
    fn terminate(mut self) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if t0.elapsed() > Duration::from_secs(40) {
                let _ = self.child.kill();
                panic!("server did not exit after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn python_clients_against_the_real_model_then_graceful_sigterm() {
    let server = Server::start(&["--alias", "tiny-moe"]);
    server.pytest(&[("HEARTH_ALIAS", "tiny-moe")]);

    // A long streamed reply is under way when SIGTERM arrives: it still ends with [DONE], and the
    // server exits 0.
    let body = r#"{"messages":[{"role":"user","content":"go on"}],"max_tokens":600,"temperature":0,"stream":true}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut first = [0u8; 64];
    let n = s.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    let pid = server.child.id();
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = s.read_to_string(&mut rest);
        rest
    });
    let status = server.terminate();
    let rest = reader.join().unwrap();
    assert!(
        rest.contains("data: [DONE]"),
        "the reply in flight was cut off (pid {pid}): ...{}",
        &rest[rest.len().saturating_sub(300)..]
    );
    assert!(status.success(), "exit status after SIGTERM: {status}");
}

#[test]
fn python_clients_reasoning_and_tools_through_the_scripted_backend() {
    let reply = format!("{ROOT}/crates/server/tests/py/qwen3_reply.txt");
    let template = shared("templates/Qwen-Qwen3-0.6B.jinja");
    // With an API key from a file: every client authenticates, a wrong key is refused.
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "s3cret-key\n").unwrap();
    let key_file = key_file.to_str().unwrap();
    let server = Server::start(&[
        "--scripted",
        &reply,
        "--chat-template",
        &template,
        "--api-key-file",
        key_file,
    ]);
    server.pytest(&[("HEARTH_SCRIPTED", "1"), ("HEARTH_API_KEY", "s3cret-key")]);
    assert!(server.terminate().success());
}

#[test]
fn python_clients_structured_output() {
    let template = shared("templates/Qwen-Qwen3-0.6B.jinja");
    let server = Server::start_model(
        "fixtures/tiny-qwen3.q4_0.gguf",
        &["--chat-template", &template],
    );
    server.pytest_file("test_structured.py", &[]);
}

#[test]
fn python_clients_parse_every_tool_call_case() {
    // One reply per case of crates/server/tests/py/test_tool_calls.py, on the real Qwen3
    // vocabulary's token boundaries (the fixture's tokenizer) and the Qwen3 template.
    let replies = format!("{ROOT}/crates/server/tests/py/tool_call_replies.txt");
    let template = shared("templates/Qwen-Qwen3-0.6B.jinja");
    // The Qwen3 template's tool list and reply 0's 613 characters (cut into pieces) pass 1024.
    let server = Server::start(&[
        "--scripted",
        &replies,
        "--chat-template",
        &template,
        "-c",
        "4096",
    ]);
    server.pytest_file("test_tool_calls.py", &[("HEARTH_SCRIPTED_TOOLS", "1")]);
}
