//! The real coding agents against `hearth serve`: Claude Code, Codex, opencode and Qwen Code, the
//! releases pinned in tests/data/agents/package-lock.json (`scripts/install-agents` installs them
//! into .cache/npm; `HEARTH_AGENTS_BIN` points elsewhere). The server plays, on a model with the
//! real Qwen3 vocabulary and template (`hearth synth --tokenizer ../shared/tokenizers/qwen3`), a
//! tool call that writes a file and then, once the tool result is in the prompt, a final answer.
//! Each client runs headless in an empty home and project directory and must run the tool (the
//! file appears with its content), print the final answer and exit 0 within its time limit.
//!
//! Every client is kept off the network: its base URL is the local server and its telemetry,
//! update checks and plugin downloads are switched off (see each client's environment below; the
//! capture notes in crates/server/tests/data/clients/README.md show how this was checked).
//!
//! Without the clients installed these tests say so and pass, unless `HEARTH_REQUIRE_AGENTS` is
//! set (as .ci/run does), when a missing client fails its test.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
/// Longest a client may take for its two turns.
const CLIENT_LIMIT: Duration = Duration::from_secs(90);

fn shared(rel: &str) -> String {
    format!("{ROOT}/../shared/{rel}")
}

/// The model: a one-layer synthetic Qwen3-MoE with the real Qwen3 tokenizer and chat template,
/// written once per test run (the scripted backend reads only its vocabulary and template).
fn model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("agents-qwen3-vocab.gguf");
        let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args([
                "synth",
                "qwen3-moe-tiny",
                "--layers",
                "1",
                "--quant",
                "q8_0",
            ])
            .args(["--tokenizer", &shared("tokenizers/qwen3"), "-o"])
            .arg(&path)
            .output()
            .expect("running hearth synth");
        assert!(
            out.status.success(),
            "hearth synth: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        path
    })
}

/// The directory with the clients' executables, or `None` (with a note) when `client` is not
/// installed and the run does not require it.
fn client_bin(client: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("HEARTH_AGENTS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("{ROOT}/.cache/npm/node_modules/.bin")));
    let bin = dir.join(client);
    if bin.exists() {
        return Some(bin);
    }
    let msg = format!(
        "{} is not installed: run scripts/install-agents (or set HEARTH_AGENTS_BIN)",
        bin.display()
    );
    assert!(std::env::var_os("HEARTH_REQUIRE_AGENTS").is_none(), "{msg}");
    eprintln!("note: {msg}; skipping");
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn get(port: u16, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// `hearth serve --scripted` on [`model`], stopped when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(script: &Path, template: Option<&str>) -> Server {
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
        cmd.arg("serve")
            .arg(model())
            .args(["--port", &port.to_string(), "--scripted"])
            .arg(script)
            // Claude Code's first prompt is ~12k tokens; the scripted backend holds no cache.
            .args(["-c", "131072", "--parallel", "4"]);
        if let Some(t) = template {
            cmd.args(["--chat-template", t]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let server = Server { child, port };
        let t0 = Instant::now();
        loop {
            if get(port, "/health").is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
                return server;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the server did not become healthy"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The replies of one client's session: a tool call that writes `PROOF`, then the final answer.
fn script(dir: &Path, tool_call: &str) -> PathBuf {
    let path = dir.join("reply.txt");
    let text = format!("I'll write the file.\n{tool_call}\n--- next reply ---\n{ANSWER}");
    std::fs::write(&path, text).unwrap();
    path
}

const PROOF: &str = "hearth-proof.txt";
const ANSWER: &str = "All done: the file is written.";

/// A client run: its own home and project directory, an environment of only what it needs.
struct Run {
    dir: tempfile::TempDir,
}

impl Run {
    fn new() -> Run {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        std::fs::create_dir_all(dir.path().join("project")).unwrap();
        Run { dir }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn project(&self) -> PathBuf {
        self.dir.path().join("project")
    }

    /// Runs `bin args` in the project directory with `env`, and checks the session: exit 0 in
    /// time, the proof file written by the tool with `content`, the final answer printed.
    fn check(&self, bin: &Path, args: &[&str], env: &[(&str, String)], content: &str) {
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .current_dir(self.project())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home())
            .env("TERM", "dumb")
            .env("NO_COLOR", "1")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Its own process group, so a client that hangs is stopped with the tools it started.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let t0 = Instant::now();
        let mut child = cmd.spawn().expect("starting the client");
        let read = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut s = Vec::new();
                let _ = r.read_to_end(&mut s);
                String::from_utf8_lossy(&s).into_owned()
            })
        };
        let out = read(Box::new(child.stdout.take().unwrap()));
        let err = read(Box::new(child.stderr.take().unwrap()));
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if t0.elapsed() > CLIENT_LIMIT {
                let _ = Command::new("kill")
                    .args(["-KILL", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let (out, err) = (out.join().unwrap(), err.join().unwrap());
        let took = t0.elapsed();
        let what = format!(
            "{} {args:?} after {took:.1?}\n--- stdout\n{out}\n--- stderr\n{err}",
            bin.display()
        );
        let status = status.unwrap_or_else(|| panic!("did not finish in {CLIENT_LIMIT:?}: {what}"));
        let proof = std::fs::read_to_string(self.project().join(PROOF));
        assert!(
            proof.as_deref().ok() == Some(content),
            "the tool did not write {PROOF} ({proof:?}): {what}"
        );
        assert!(status.success(), "exit status {status}: {what}");
        assert!(out.contains(ANSWER), "no final answer: {what}");
        eprintln!("{} finished in {took:.1?}", bin.display());
    }
}

/// Claude Code (Anthropic Messages, streaming) with the Qwen3-Coder template's XML calls.
#[test]
fn claude_code_runs_a_tool() {
    let Some(bin) = client_bin("claude") else {
        return;
    };
    let run = Run::new();
    let reply = script(
        run.dir.path(),
        "<tool_call>\n<function=Bash>\n<parameter=command>\nprintf 'written by claude\\n' > hearth-proof.txt\n</parameter>\n<parameter=description>\nWrite the proof file\n</parameter>\n</function>\n</tool_call>",
    );
    let server = Server::start(&reply, Some(&shared("templates/Qwen3-Coder.jinja")));
    let env = [
        ("ANTHROPIC_BASE_URL", server.url()),
        ("ANTHROPIC_API_KEY", "sk-local".into()),
        // No telemetry, error reports, update checks or preconnects (which resolve
        // api.anthropic.com even with a base URL).
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
    ];
    let args = [
        "-p",
        "Write the proof file.",
        "--max-turns",
        "2",
        "--allowedTools",
        "Bash",
    ];
    run.check(&bin, &args, &env, "written by claude\n");
}

/// Codex (OpenAI Responses, streaming) with the Qwen3 template's JSON calls.
#[test]
fn codex_runs_a_tool() {
    let Some(bin) = client_bin("codex") else {
        return;
    };
    let run = Run::new();
    let reply = script(
        run.dir.path(),
        "<tool_call>\n{\"name\": \"exec_command\", \"arguments\": {\"cmd\": \"printf 'written by codex\\\\n' > hearth-proof.txt\"}}\n</tool_call>",
    );
    let server = Server::start(&reply, None);
    let codex_home = run.dir.path().join("codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    // No update check, no analytics, no curated-plugin sync (a git clone from github.com).
    let config = format!(
        "model = \"hearth\"\nmodel_provider = \"hearth\"\ncheck_for_update_on_startup = false\n\n\
         [features]\nplugins = false\n\n[analytics]\nenabled = false\n\n\
         [model_providers.hearth]\nname = \"Hearth\"\nbase_url = \"{}/v1\"\nwire_api = \"responses\"\n",
        server.url()
    );
    std::fs::write(codex_home.join("config.toml"), config).unwrap();
    let env = [("CODEX_HOME", codex_home.display().to_string())];
    let args = [
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "Write the proof file.",
    ];
    run.check(&bin, &args, &env, "written by codex\n");
}

/// opencode (chat completions through `@ai-sdk/openai-compatible`, streaming) with the Qwen3
/// template's JSON calls.
#[test]
fn opencode_runs_a_tool() {
    let Some(bin) = client_bin("opencode") else {
        return;
    };
    let run = Run::new();
    let reply = script(
        run.dir.path(),
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"printf 'written by opencode\\\\n' > hearth-proof.txt\", \"description\": \"Write the proof file\"}}\n</tool_call>",
    );
    let server = Server::start(&reply, None);
    let config = serde_json::json!({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"hearth": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Hearth",
            "options": {"baseURL": format!("{}/v1", server.url()), "apiKey": "sk-local"},
            "models": {"hearth": {"name": "Hearth", "tool_call": true}}
        }},
        "model": "hearth/hearth"
    });
    let config_path = run.dir.path().join("opencode.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let env = [
        ("OPENCODE_CONFIG", config_path.display().to_string()),
        ("OPENCODE_DISABLE_AUTOUPDATE", "1".into()),
        // The model list from models.dev, plugins, LSP servers, sharing.
        ("OPENCODE_DISABLE_MODELS_FETCH", "1".into()),
        ("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1".into()),
        ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".into()),
        ("OPENCODE_DISABLE_SHARE", "1".into()),
        ("OPENCODE_DISABLE_CLAUDE_CODE", "1".into()),
        ("OPENCODE_DISABLE_EXTERNAL_SKILLS", "1".into()),
        // It still asks the npm registry for packages it installs in the background (its plugin
        // SDK, tree-sitter): a closed local port makes that fail at once, as offline.
        ("npm_config_registry", "http://127.0.0.1:9/".into()),
    ];
    run.check(
        &bin,
        &["run", "Write the proof file."],
        &env,
        "written by opencode\n",
    );
}

/// Qwen Code (chat completions, streaming) with the Qwen3-Coder template's XML calls.
#[test]
fn qwen_code_runs_a_tool() {
    let Some(bin) = client_bin("qwen") else {
        return;
    };
    let run = Run::new();
    let reply = script(
        run.dir.path(),
        "<tool_call>\n<function=run_shell_command>\n<parameter=command>\nprintf 'written by qwen\\n' > hearth-proof.txt\n</parameter>\n<parameter=is_background>\nfalse\n</parameter>\n</function>\n</tool_call>",
    );
    let server = Server::start(&reply, Some(&shared("templates/Qwen3-Coder.jinja")));
    // No usage statistics (sent to an Aliyun RUM endpoint otherwise), telemetry or update checks.
    let settings = run.home().join(".qwen");
    std::fs::create_dir_all(&settings).unwrap();
    std::fs::write(
        settings.join("settings.json"),
        r#"{"privacy": {"usageStatisticsEnabled": false}, "telemetry": {"enabled": false},
            "general": {"disableAutoUpdate": true, "disableUpdateNag": true}}"#,
    )
    .unwrap();
    let env = [
        ("OPENAI_BASE_URL", format!("{}/v1", server.url())),
        ("OPENAI_API_KEY", "sk-local".into()),
        ("OPENAI_MODEL", "hearth".into()),
        ("QWEN_CODE_SUPPRESS_YOLO_WARNING", "1".into()),
    ];
    run.check(
        &bin,
        &["-p", "Write the proof file.", "--yolo"],
        &env,
        "written by qwen\n",
    );
}
