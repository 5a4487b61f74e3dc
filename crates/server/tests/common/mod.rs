//! Shared helpers of the in-memory HTTP tests: a scripted backend on the tiny Qwen3 fixture's
//! tokenizer, a request helper, and parsers of SSE and NDJSON bodies.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use hearth_server::scripted::{Script, ScriptedBackend};
use hearth_server::{app, AppState, ServerConfig};
use hearth_tokenizer::template::ChatTemplate;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

pub fn shared(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/")).join(rel)
}

/// Which template the server renders with.
pub enum Tpl {
    /// The fixture's own (ChatML-like, no tools).
    Fixture,
    /// Qwen3 (JSON tool calls, `<think>`).
    Qwen3,
    /// Qwen3-Coder (XML tool calls).
    Coder,
    /// ChatML that ends the prompt inside `<think>\n`.
    OpensThink,
    /// This source.
    Custom(String),
}

pub struct Setup {
    pub backend: Arc<ScriptedBackend>,
    pub state: AppState,
}

impl Setup {
    pub fn app(&self) -> Router {
        app(self.state.clone())
    }

    /// The rendered text of the last prompt submitted.
    pub fn last_prompt(&self) -> String {
        use hearth_engine::Backend;
        let p = self
            .backend
            .take_prompts()
            .pop()
            .expect("a prompt was submitted");
        self.backend.tokenizer().decode(&p, true)
    }
}

pub fn setup_with(script: Script, tpl: Tpl, config: ServerConfig, n_ctx: usize) -> Setup {
    let (b, src) =
        ScriptedBackend::from_gguf(&shared("fixtures/tiny-qwen3.q4_0.gguf"), n_ctx, 4, script)
            .expect("fixture");
    let template = match tpl {
        Tpl::Fixture => ChatTemplate::new(&src.expect("fixture template")).unwrap(),
        Tpl::Qwen3 => ChatTemplate::from_path(&shared("templates/Qwen-Qwen3-0.6B.jinja")).unwrap(),
        Tpl::Coder => ChatTemplate::from_path(&shared("templates/Qwen3-Coder.jinja")).unwrap(),
        Tpl::OpensThink => ChatTemplate::new(&format!(
            "{}{{%- if add_generation_prompt %}}{{{{- '<think>\\n' }}}}{{%- endif %}}",
            hearth_tokenizer::template::CHATML_TEMPLATE
        ))
        .unwrap(),
        Tpl::Custom(src) => ChatTemplate::new(&src).unwrap(),
    };
    let backend = Arc::new(b);
    let state = AppState::new(config, backend.clone(), template);
    Setup { backend, state }
}

pub fn setup(text: &str, tpl: Tpl) -> Setup {
    setup_with(Script::new(text), tpl, ServerConfig::default(), 4096)
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub async fn send(
    app: Router,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = app
        .oneshot(b.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

pub async fn post(app: Router, path: &str, body: &Value) -> Reply {
    send(app, "POST", path, &body.to_string(), &[]).await
}

/// SSE frames as (event name, data); asserts the framing (`field: value` lines, blank line after each frame).
pub fn sse_frames(body: &str) -> Vec<(Option<String>, String)> {
    assert!(
        body.ends_with("\n\n"),
        "SSE body must end with a blank line: {body:?}"
    );
    body.trim_end_matches('\n')
        .split("\n\n")
        .map(|frame| {
            let mut event = None;
            let mut data = None;
            for line in frame.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = Some(e.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    assert!(data.is_none(), "one data line per frame");
                    data = Some(d.to_string());
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            (event, data.expect("frame without data"))
        })
        .collect()
}

pub fn ndjson_lines(body: &str) -> Vec<Value> {
    assert!(body.ends_with('\n'), "NDJSON must end with a newline");
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad NDJSON line {l:?}: {e}")))
        .collect()
}
