//! The recorded coding-agent sessions of `scripts/agent-sessions` (what Claude Code, opencode,
//! Qwen Code and Codex really sent, turn after turn), rendered by the server's own handlers with
//! the real Qwen3 tokenizer and the Qwen3 and Qwen3-Coder templates.
//!
//! A prefix cache only pays if what a client resends renders to the same tokens. So:
//! - the first request of a session recorded twice (`*-rerun`) renders to the same prompt both
//!   times: everything that changed between the two recordings (ids, nonces, cache markers) is
//!   metadata the server does not render;
//! - each request's prompt begins with all of the previous request's prompt but its last few
//!   tokens: what the earlier turn left in the KV cache is reused, and only the generation prompt
//!   (and what the template renders differently for the latest assistant turn) is lost.
//!
//! `cargo test -p hearth-server --test agent_sessions -- --nocapture` prints the shared tokens of
//! every pair of consecutive requests.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use hearth_engine::ModelInfo;
use hearth_server::scripted::{Script, ScriptedBackend};
use hearth_server::{AppState, ServerConfig};
use hearth_tokenizer::template::ChatTemplate;
use hearth_tokenizer::{hf, Tokenizer};
use serde_json::Value;

fn sessions_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/agent-sessions")
}

/// A recorded session: its header and requests (`api`, `path`, `body`).
struct Session {
    name: String,
    requests: Vec<(String, String, Value)>,
}

fn load(path: &Path) -> Session {
    let raw = std::fs::read(path).unwrap();
    let mut text = Vec::new();
    lzma_rs::xz_decompress(&mut raw.as_slice(), &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap());
    let header = lines.next().unwrap();
    assert_eq!(
        header["format"],
        "hearth-agent-session/1",
        "{}",
        path.display()
    );
    let requests = lines
        .map(|r| {
            (
                r["api"].as_str().unwrap().to_string(),
                r["path"].as_str().unwrap().to_string(),
                r["body"].clone(),
            )
        })
        .collect();
    Session {
        name: header["name"].as_str().unwrap().to_string(),
        requests,
    }
}

fn all_sessions() -> Vec<Session> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(sessions_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".jsonl.xz"))
        .collect();
    paths.sort();
    assert!(
        !paths.is_empty(),
        "no sessions in {}",
        sessions_dir().display()
    );
    paths.iter().map(|p| load(p)).collect()
}

/// The real Qwen3 tokenizer (from ../shared/tokenizers/qwen3) behind a scripted backend.
fn server(template: &str) -> (Arc<ScriptedBackend>, AppState) {
    let pairs = hf::convert_dir(&shared("tokenizers/qwen3"), &hf::HfOptions::default()).unwrap();
    let tok = Tokenizer::from_gguf(&hf::to_metadata(&pairs)).unwrap();
    let n_ctx = 1 << 17;
    let info = ModelInfo {
        alias: "qwen3".into(),
        arch: "qwen3moe".into(),
        n_ctx,
        n_ctx_train: n_ctx,
        parallel: 1,
        n_vocab: tok.vocab_size(),
        n_params: 0,
        file_size: 0,
        chat_template: None,
        quantization: None,
    };
    let backend = Arc::new(ScriptedBackend::new(Arc::new(tok), info, Script::new("ok")));
    let template = ChatTemplate::from_path(&shared(template)).unwrap();
    let state = AppState::new(ServerConfig::default(), backend.clone(), template);
    (backend, state)
}

/// The prompt the server renders for one recorded request (sent whole, one token of reply).
async fn render(
    b: &ScriptedBackend,
    s: &AppState,
    api: &str,
    path: &str,
    body: &Value,
) -> Vec<u32> {
    let mut body = body.clone();
    body["stream"] = Value::Bool(false);
    match api {
        "responses" => body["max_output_tokens"] = 1.into(),
        _ => body["max_tokens"] = 1.into(),
    }
    if let Some(o) = body.as_object_mut() {
        o.remove("max_completion_tokens");
        o.remove("stream_options");
    }
    b.take_prompts();
    let r = post(hearth_server::app(s.clone()), path, &body).await;
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    b.take_prompts().pop().expect("a prompt was submitted")
}

fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

const TEMPLATES: [&str; 2] = [
    "templates/Qwen-Qwen3-0.6B.jinja",
    "templates/Qwen3-Coder.jinja",
];

/// Most tokens of the best-matching earlier prompt a turn may fail to reuse. Measured: none; every
/// prompt so far is a prefix of the next turn's, generation prompt included, with both templates.
const LOST_AT_MOST: usize = 16;

/// Fresh prompts a session may start (sharing less than half of any earlier one): the first
/// request, and a side request with its own prompt (opencode's title, Qwen Code's memory agent),
/// after which the main conversation starts afresh once.
const FRESH_AT_MOST: usize = 3;

/// Clients that rewrite an earlier message of the conversation on every user turn, which no
/// server can undo without changing what the model reads: Qwen Code moves its "The current date
/// is ..." reminder from the previous user message to the newest one, so each user turn re-reads
/// everything from the previous user message on. For them only the overall share is checked.
const REWRITES_HISTORY: &[&str] = &["qwen-"];

/// The share of earlier tokens such a client must still reuse overall (measured: 97%).
const REWRITING_SHARE_AT_LEAST: f64 = 0.95;

#[tokio::test(flavor = "multi_thread")]
async fn consecutive_turns_share_their_prefix() {
    let sessions = all_sessions();
    for tpl in TEMPLATES {
        let (b, s) = server(tpl);
        let (mut total, mut shared_total) = (0, 0);
        for sess in &sessions {
            let mut earlier: Vec<Vec<u32>> = Vec::new();
            let (mut worst, mut fresh) = (0, 0);
            let (mut t, mut sh) = (0, 0);
            let rewrites = REWRITES_HISTORY.iter().any(|c| sess.name.starts_with(c));
            for (i, (api, path, body)) in sess.requests.iter().enumerate() {
                let ids = render(&b, &s, api, path, body).await;
                // What a prefix cache holding every earlier prompt of the session reuses.
                let best = earlier
                    .iter()
                    .map(|p| (lcp(p, &ids), p.len()))
                    .max()
                    .unwrap_or((0, 0));
                if best.0 * 2 < best.1 || earlier.is_empty() {
                    fresh += 1;
                } else {
                    let lost = best.1 - best.0;
                    worst = worst.max(lost);
                    assert!(
                        lost <= LOST_AT_MOST || rewrites,
                        "{tpl}, {}: request {i} keeps only {} of an earlier prompt's {} tokens",
                        sess.name,
                        best.0,
                        best.1
                    );
                    t += best.1;
                    sh += best.0;
                }
                earlier.push(ids);
            }
            let share = sh as f64 / t.max(1) as f64;
            eprintln!(
                "{tpl} {:<28} {:>2} requests, {fresh} fresh: the others reuse {sh} of {t} earlier tokens ({:.2}%), at most {worst} lost",
                sess.name,
                sess.requests.len(),
                100.0 * share
            );
            assert!(
                !rewrites || share >= REWRITING_SHARE_AT_LEAST,
                "{tpl}, {}: reuses only {:.1}% of earlier tokens",
                sess.name,
                100.0 * share
            );
            assert!(
                fresh <= FRESH_AT_MOST,
                "{tpl}, {}: {fresh} requests start afresh",
                sess.name
            );
            total += t;
            shared_total += sh;
        }
        eprintln!(
            "{tpl}: all sessions reuse {shared_total} of {total} tokens ({:.2}%)",
            100.0 * shared_total as f64 / total.max(1) as f64
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_turn_recorded_twice_renders_the_same() {
    let sessions = all_sessions();
    let mut pairs = 0;
    for rerun in sessions.iter().filter(|s| s.name.ends_with("-rerun")) {
        let first = rerun.name.trim_end_matches("-rerun");
        let orig = sessions
            .iter()
            .find(|s| s.name == first)
            .unwrap_or_else(|| panic!("{} has no {first}", rerun.name));
        // The requests before the first tool result: the two recordings ran the same commands,
        // but a tool's output (file times in `ls -la`) is content and may differ.
        let before_tools = |r: &&(String, String, Value)| {
            let j = r.2.to_string();
            !["tool_result", "\"role\":\"tool\"", "function_call_output"]
                .iter()
                .any(|k| j.contains(k))
        };
        let n = rerun.requests.iter().take_while(before_tools).count();
        assert!(n >= 1, "{}", rerun.name);
        for tpl in TEMPLATES {
            let (b, s) = server(tpl);
            for k in 0..n {
                let (api, path, body) = &orig.requests[k];
                let a = render(&b, &s, api, path, body).await;
                let (api, path, body) = &rerun.requests[k];
                let c = render(&b, &s, api, path, body).await;
                let shared = lcp(&a, &c);
                eprintln!(
                    "{tpl} {first} request {k}: the two recordings share {shared} of {} / {} tokens",
                    a.len(),
                    c.len()
                );
                assert_eq!(
                    a, c,
                    "{tpl}, {first}: request {k} renders differently when recorded again (the prompts part at token {shared})"
                );
            }
        }
        pairs += 1;
    }
    assert!(pairs >= 4, "expected reruns of the four clients");
}

/// Conversations of one client in different projects: what a prefix cache shared by all
/// conversations can reuse of another's prompt. Claude Code's billing header differs between them
/// (its version suffix is per conversation), so rendered it would end the shared prefix at once;
/// without it they share the system prompt up to its first per-project line (the memory
/// directory's path). Also printed: the same with the header rendered, as before it was dropped.
#[tokio::test(flavor = "multi_thread")]
async fn conversations_of_one_client_share_their_start() {
    let sessions = all_sessions();
    let (b, s) = server(TEMPLATES[1]);
    for client in ["claude", "codex", "opencode"] {
        let firsts: Vec<&Session> = sessions
            .iter()
            .filter(|x| x.name.starts_with(client) && !x.name.ends_with("-rerun"))
            .collect();
        assert!(firsts.len() >= 3, "{client}");
        // The first request with tools: the conversation's own first turn.
        let main = |x: &Session| {
            x.requests
                .iter()
                .find(|r| r.2.get("tools").is_some())
                .cloned()
                .unwrap()
        };
        let mut least = usize::MAX;
        let mut least_raw = usize::MAX;
        for (i, x) in firsts.iter().enumerate() {
            for y in &firsts[i + 1..] {
                let (mx, my) = (main(x), main(y));
                let a = render(&b, &s, &mx.0, &mx.1, &mx.2).await;
                let c = render(&b, &s, &my.0, &my.1, &my.2).await;
                least = least.min(lcp(&a, &c));
                // As a server that renders the header would see them.
                let raw = |r: &(String, String, Value)| {
                    let t = r.2.to_string().replace(
                        "x-anthropic-billing-header:",
                        "x-anthropic-billing-header (rendered):",
                    );
                    serde_json::from_str::<Value>(&t).unwrap()
                };
                let a = render(&b, &s, &mx.0, &mx.1, &raw(&mx)).await;
                let c = render(&b, &s, &my.0, &my.1, &raw(&my)).await;
                least_raw = least_raw.min(lcp(&a, &c));
            }
        }
        eprintln!(
            "{client}: first turns of different conversations share at least {least} tokens ({least_raw} with a billing header rendered)"
        );
        if client == "claude" {
            assert!(least >= 500, "{client}: {least}");
            assert!(
                least_raw < 50,
                "the header differs per conversation: {least_raw}"
            );
        }
    }
}
