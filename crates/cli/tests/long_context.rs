//! Agent-sized prompts against `hearth serve` with default settings: a 20,000-token prompt on a
//! model trained for 131,072 tokens is served without `-c` (the context is the trained one limited
//! by memory, and the KV pool is shared by the sequences), its next turn comes from the prefix
//! cache, and with `--cache-dir` the cache is still there after a restart.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/fixtures/tiny-qwen3-yarn.q8_0.gguf"
);

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(["serve", MODEL, "--port", &port.to_string(), "-t", "2"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let s = Server { child, port };
        let t0 = Instant::now();
        while s
            .get("/health")
            .is_none_or(|r| !r.starts_with("HTTP/1.1 200"))
        {
            assert!(t0.elapsed() < Duration::from_secs(60), "not healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    fn exchange(&self, req: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(600))).ok()?;
        s.write_all(req.as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    fn get(&self, path: &str) -> Option<String> {
        self.exchange(&format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ))
    }

    /// A completion of `prompt`; the JSON reply.
    fn complete(&self, prompt: &str) -> Value {
        let body = json!({"prompt": prompt, "max_tokens": 2, "temperature": 0}).to_string();
        let r = self
            .exchange(&format!(
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ))
            .expect("a reply");
        assert!(r.starts_with("HTTP/1.1 200"), "{}", &r[..r.len().min(600)]);
        serde_json::from_str(&r[r.find("\r\n\r\n").unwrap() + 4..]).unwrap()
    }

    /// SIGTERM, and the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Text of about `n` tokens of the tiny models' byte-level vocabulary (a few characters each).
fn text(n: usize) -> String {
    let zen = "Beautiful is better than ugly. Explicit is better than implicit. Simple is better \
               than complex. Complex is better than complicated. Flat is better than nested. ";
    let mut s = String::new();
    let mut i = 0;
    while s.len() < n * 3 {
        s.push_str(&format!("{i}: {zen}"));
        i += 1;
    }
    s
}

fn usage(r: &Value) -> (u64, u64) {
    let u = &r["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    )
}

#[test]
fn a_20k_token_prompt_is_served_with_default_settings_and_its_next_turn_is_cached() {
    let s = Server::start(&[]);
    let first = text(20_000);
    let (n, cached) = usage(&s.complete(&first));
    assert!(n >= 20_000, "{n} prompt tokens");
    assert_eq!(cached, 0);
    // The next turn: the same text and more. All but the last partial block come from the cache.
    let (n2, cached2) = usage(&s.complete(&format!("{first} And then some more.")));
    assert!(n2 > n && cached2 + 64 >= n, "{cached2} of {n2} cached");
}

#[test]
fn the_prefix_cache_is_there_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("kv");
    let args = ["--cache-dir", cache.to_str().unwrap(), "--cache-disk", "1G"];
    let prompt = text(3000);
    let s = Server::start(&args);
    let (n, cached) = usage(&s.complete(&prompt));
    assert_eq!(cached, 0);
    assert!(s.stop().success());
    let s = Server::start(&args);
    let (_, cached) = usage(&s.complete(&prompt));
    assert!(
        cached >= n / 64 * 64 - 64 && cached < n,
        "{cached} of {n} from disk"
    );
    let metrics = s.get("/metrics").unwrap();
    assert!(
        metrics.contains("hearth_prefix_cache_disk_tokens_total"),
        "{metrics}"
    );
}
