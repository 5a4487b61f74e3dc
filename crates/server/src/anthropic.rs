//! Anthropic: `POST /v1/messages` and `POST /v1/messages/count_tokens` (also with `?beta=true`), as
//! current clients such as Claude Code send them.
//!
//! Requests become the OpenAI-style messages chat templates read: `system` (a string or text
//! blocks) becomes the first system message, and `{"role": "system"}` messages inside `messages`
//! stay where they stand (the pipeline merges them into the first one, in order, for templates that
//! reject or drop a system message after the start). `tool_use` blocks become `tool_calls`,
//! `tool_result` blocks become `tool` messages, `thinking` blocks become `reasoning_content`;
//! several text blocks of one message are joined with a blank line. Per-request metadata that is
//! not meant for the model is not rendered, so that what a client resends renders to the same
//! tokens and the prefix cache holds: Claude Code's billing header (`x-anthropic-billing-header:
//! ...;` at the start of a system text, its fields changing per conversation or per request; see
//! `strip_billing_header`), `metadata` (`user_id`: device and session ids) and `cache_control`
//! (breakpoints Claude Code moves to the newest message every turn).
//! `thinking` `enabled` or `adaptive` turns the template's thinking on, `disabled` off; with
//! `display: "omitted"` the reply carries no thinking blocks. Fields Hearth has no use for
//! (`metadata`, `context_management`, `output_config`, `cache_control`, ...) are ignored, and so are
//! block types it does not know (with a warning); `image` and `document` blocks are refused with a
//! 400, as the model reads text only.
//!
//! Replies are content blocks (`thinking`, `text`, `tool_use`). Streamed, they follow the Messages
//! event sequence: `message_start`, then per block `content_block_start`, its deltas
//! (`thinking_delta`, `text_delta`, `input_json_delta`) and `content_block_stop`, with a `ping` after
//! the first block opens (and every 15 s while nothing else is sent), then `message_delta` (stop
//! reason, stop sequence, usage) and `message_stop`. No `signature_delta` is sent: Hearth does not
//! sign its thinking.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_engine::FinishReason;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::{Api, ApiError};
use crate::fields::{self, Sampling};
use crate::parse::Delta;
use crate::pipeline::{self, GenRequest, Piece, PromptInput, Whole};
use crate::state::AppState;
use crate::stream::{self, Frames, Render};
use crate::structured;

/// `thinking`.
#[derive(Deserialize, Debug, Clone)]
pub struct Thinking {
    /// `enabled`, `adaptive` or `disabled`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `summarized` (default) or `omitted`.
    pub display: Option<String>,
}

impl Thinking {
    fn on(&self) -> Result<bool, ApiError> {
        match self.kind.as_str() {
            "enabled" | "adaptive" => Ok(true),
            "disabled" => Ok(false),
            other => Err(ApiError::bad_request(format!(
                "thinking.type: must be \"enabled\", \"adaptive\" or \"disabled\", got \"{other}\""
            ))),
        }
    }

    fn shown(&self) -> bool {
        self.display.as_deref() != Some("omitted")
    }
}

/// The fields of a Messages request that Hearth reads (others are ignored).
#[derive(Deserialize, Debug)]
pub struct MessagesRequest {
    /// Echoed back.
    pub model: Option<String>,
    /// Token budget (required by Anthropic; optional here).
    pub max_tokens: Option<i64>,
    /// The conversation.
    pub messages: Vec<Value>,
    /// A string or text blocks.
    pub system: Option<Value>,
    /// Stop strings.
    pub stop_sequences: Option<Vec<String>>,
    /// Temperature.
    pub temperature: Option<f64>,
    /// Top-p.
    pub top_p: Option<f64>,
    /// Top-k.
    pub top_k: Option<i64>,
    /// Stream events.
    pub stream: Option<bool>,
    /// Tools (`name`, `description`, `input_schema`).
    pub tools: Option<Vec<Value>>,
    /// `{"type": "none"}` hides the tools.
    pub tool_choice: Option<Value>,
    /// Extended thinking on or off.
    pub thinking: Option<Thinking>,
}

/// The fields of a count_tokens request.
#[derive(Deserialize, Debug)]
pub struct CountRequest {
    /// The conversation.
    pub messages: Vec<Value>,
    /// System prompt.
    pub system: Option<Value>,
    /// Tools.
    pub tools: Option<Vec<Value>>,
    /// `{"type": "none"}` hides the tools.
    pub tool_choice: Option<Value>,
    /// Thinking.
    pub thinking: Option<Thinking>,
}

/// The prefix of Claude Code's billing header in `system`: metadata, not prompt.
const BILLING_HEADER: &str = "x-anthropic-billing-header:";

/// `text` without a leading Claude Code billing header: `x-anthropic-billing-header:` and its
/// `key=value;` fields (`cc_version=2.1.328.286; cc_entrypoint=cli; cch=a5145;`), and the line
/// break after them. Claude Code sends it as its own first `system` block, but the fields change
/// from conversation to conversation (the version's suffix) or from request to request (the `cch`
/// nonce), so rendered it would end the shared prefix of every prompt a few tokens in. Clients
/// and proxies that flatten `system` into one string put the real system prompt right after the
/// last `;` (llama.cpp's server sees `...; cch=a5145;You are Claude Code, ...`): that text is kept.
/// A text that does not start with the header and at least one field is returned whole.
fn strip_billing_header(text: &str) -> &str {
    let Some(mut rest) = text.strip_prefix(BILLING_HEADER) else {
        return text;
    };
    let mut fields = 0;
    loop {
        let field = rest.trim_start_matches([' ', '\t']);
        let key_len = field
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(field.len());
        let value = match field.get(key_len..) {
            Some(v) if key_len > 0 && v.starts_with('=') => &v[1..],
            _ => break,
        };
        match value.find([';', '\n']) {
            Some(end) if value[end..].starts_with(';') => rest = &value[end + 1..],
            _ => break,
        }
        fields += 1;
    }
    if fields == 0 {
        // The words without the fields are not Claude Code's header: text like any other.
        return text;
    }
    let rest = rest.trim_start_matches([' ', '\t']);
    rest.strip_prefix("\r\n")
        .or_else(|| rest.strip_prefix('\n'))
        .unwrap_or(rest)
}

/// Text of a content value (a string or blocks), text blocks joined with a blank line. `where_`
/// names the field in errors.
fn text_of(v: &Value, where_: &str) -> Result<String, ApiError> {
    texts(v, where_, |t| t)
}

/// [`text_of`] for a system prompt: a billing header at the start of a text is not rendered.
fn system_text_of(v: &Value, where_: &str) -> Result<String, ApiError> {
    texts(v, where_, strip_billing_header)
}

/// [`text_of`] with `keep` applied to every text (string or block).
fn texts(v: &Value, where_: &str, keep: fn(&str) -> &str) -> Result<String, ApiError> {
    let blocks = match v {
        Value::Null => return Ok(String::new()),
        Value::String(s) => return Ok(keep(s).to_string()),
        Value::Array(b) => b,
        _ => {
            return Err(ApiError::bad_request(format!(
                "{where_}: must be a string or a list of blocks"
            )))
        }
    };
    let mut parts: Vec<&str> = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                let t = b.get("text").and_then(Value::as_str).unwrap_or("");
                let kept = keep(t);
                // A block that was only the header goes (no blank line left for it).
                if kept.len() == t.len() || !kept.is_empty() {
                    parts.push(kept);
                }
            }
            Some(t @ ("image" | "document")) => {
                return Err(ApiError::bad_request(format!(
                    "{where_}: `{t}` blocks are not supported: this model accepts text only"
                )))
            }
            other => ignore_block(other, where_),
        }
    }
    Ok(parts.join("\n\n"))
}

fn ignore_block(kind: Option<&str>, where_: &str) {
    tracing::warn!(
        "ignoring a `{}` block in {where_}: Hearth does not read it",
        kind.unwrap_or("untyped")
    );
}

/// Converts Anthropic messages (and `system`) to template messages.
fn to_messages(system: Option<&Value>, raw: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(s) = system {
        let text = system_text_of(s, "system")?;
        if !text.is_empty() {
            out.push(json!({"role": "system", "content": text}));
        }
    }
    for (i, m) in raw.iter().enumerate() {
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant" | "system")) => r,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "messages.{i}.role: must be \"user\", \"assistant\" or \"system\""
                )))
            }
        };
        let where_ = format!("messages.{i}.content");
        let content = m.get("content").unwrap_or(&Value::Null);
        let blocks = match content {
            Value::String(s) if role == "system" => {
                out.push(json!({"role": role, "content": strip_billing_header(s)}));
                continue;
            }
            Value::String(s) => {
                out.push(json!({"role": role, "content": s}));
                continue;
            }
            Value::Array(b) if role != "system" => b,
            Value::Array(_) => {
                out.push(json!({"role": "system", "content": system_text_of(content, &where_)?}));
                continue;
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "{where_}: must be a string or a list of blocks"
                )))
            }
        };
        let mut text: Vec<String> = Vec::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        for b in blocks {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => {
                    text.push(b.get("text").and_then(Value::as_str).unwrap_or("").into())
                }
                Some("thinking") => {
                    reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
                }
                Some("redacted_thinking") => {}
                Some("tool_use") => calls.push(json!({
                    "id": b.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {
                        "name": b.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": b.get("input").cloned().unwrap_or_else(|| json!({})),
                    },
                })),
                Some("tool_result") => {
                    let c = match b.get("content") {
                        None => String::new(),
                        Some(v) => text_of(v, &format!("{where_}.tool_result"))?,
                    };
                    results.push(json!({
                        "role": "tool",
                        "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                        "content": c,
                    }));
                }
                Some(t @ ("image" | "document")) => {
                    return Err(ApiError::bad_request(format!(
                        "{where_}: `{t}` blocks are not supported: this model accepts text only"
                    )))
                }
                other => ignore_block(other, &where_),
            }
        }
        // Tool results answer the previous assistant turn; they go first, as the template expects.
        out.extend(results);
        if !text.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
            let mut msg = json!({"role": role, "content": text.join("\n\n")});
            if !reasoning.is_empty() {
                msg["reasoning_content"] = Value::String(reasoning);
            }
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        }
    }
    Ok(out)
}

/// Anthropic tools as OpenAI-style function tools (what templates read).
fn to_tools(tools: Option<Vec<Value>>, choice: Option<&Value>) -> Option<Vec<Value>> {
    if choice.and_then(|c| c.get("type")).and_then(Value::as_str) == Some("none") {
        return None;
    }
    let t: Vec<Value> = tools?
        .into_iter()
        .filter_map(|t| {
            let name = t.get("name")?.clone();
            Some(json!({"type": "function", "function": {
                "name": name,
                "description": t.get("description").cloned().unwrap_or(Value::from("")),
                "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"})),
            }}))
        })
        .collect();
    (!t.is_empty()).then_some(t)
}

fn stop_reason(finish: FinishReason, tools: bool, stop: &Option<String>) -> &'static str {
    match finish {
        FinishReason::Length => "max_tokens",
        _ if tools => "tool_use",
        _ if stop.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

fn parse_input(args: &str) -> Value {
    serde_json::from_str(args).unwrap_or_else(|_| json!({}))
}

/// Anthropic spells tool-use ids `toolu_…`; the parser's ids are OpenAI's `call_…`.
fn tool_use_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.strip_prefix("call_").unwrap_or(call_id))
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: MessagesRequest = fields::parse_body(body)?;
    let l = state.loaded()?;
    let thinking = req.thinking.as_ref().map(Thinking::on).transpose()?;
    let show_thinking = req.thinking.as_ref().is_none_or(Thinking::shown);
    let gen = GenRequest {
        thinking,
        sampling: Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            ..Sampling::default()
        },
        max_tokens: fields::max_tokens("max_tokens", req.max_tokens)?,
        stop: req
            .stop_sequences
            .unwrap_or_default()
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect(),
        tool_force: structured::anthropic_tool_force(req.tool_choice.as_ref())?,
        ..GenRequest::new(PromptInput::Chat {
            messages: to_messages(req.system.as_ref(), &req.messages)?,
            tools: to_tools(req.tools, req.tool_choice.as_ref()),
            kwargs: Map::new(),
        })
    };
    let (mut replies, n_prompt) = pipeline::start(l.clone(), gen).await?;
    let model = req.model.unwrap_or_else(|| l.info().alias.clone());
    let id = fields::new_id("msg_");
    if req.stream.unwrap_or(false) {
        let render = MessageStream {
            id,
            model,
            n_prompt,
            show_thinking,
            open: None,
            index: 0,
            pinged: false,
        };
        let cfg = state.config().stream;
        return Ok(stream::respond("text/event-stream", render, replies, cfg));
    }
    let reply = replies
        .pop()
        .ok_or_else(|| ApiError::internal("no reply"))?;
    let w = reply.fold().await?;
    Ok(Json(message_json(&w, &id, &model, show_thinking)).into_response())
}

/// A whole reply as a `message` object.
fn message_json(w: &Whole, id: &str, model: &str, show_thinking: bool) -> Value {
    let mut content = Vec::new();
    if let Some(r) = w.reasoning.as_ref().filter(|_| show_thinking) {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if !w.content.is_empty() {
        content.push(json!({"type": "text", "text": w.content}));
    }
    for c in &w.tool_calls {
        content.push(json!({"type": "tool_use", "id": tool_use_id(&c.id), "name": c.name, "input": parse_input(&c.arguments)}));
    }
    let u = &w.usage;
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(w.finish, !w.tool_calls.is_empty(), &w.stop),
        "stop_sequence": w.stop,
        "usage": {
            "input_tokens": u.n_prompt - u.n_cached,
            "output_tokens": u.n_gen,
            "cache_read_input_tokens": u.n_cached,
            "cache_creation_input_tokens": 0,
        },
    })
}

/// The kind of the content block being streamed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Block {
    Thinking,
    Text,
    Tool(usize),
}

/// The Messages event sequence of one reply.
struct MessageStream {
    id: String,
    model: String,
    n_prompt: usize,
    show_thinking: bool,
    open: Option<Block>,
    index: usize,
    pinged: bool,
}

impl MessageStream {
    fn close(&mut self, out: &mut Frames) {
        if self.open.take().is_some() {
            out.sse(
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": self.index}),
            );
            self.index += 1;
        }
    }

    fn open(&mut self, b: Block, start: Value, out: &mut Frames) {
        if self.open == Some(b) {
            return;
        }
        self.close(out);
        self.open = Some(b);
        out.sse(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": self.index, "content_block": start}),
        );
        self.ping_once(out);
    }

    /// Anthropic sends a `ping` after the first block opens.
    fn ping_once(&mut self, out: &mut Frames) {
        if !self.pinged {
            self.pinged = true;
            out.sse(Some("ping"), &json!({"type": "ping"}));
        }
    }

    fn delta(&mut self, delta: Value, out: &mut Frames) {
        out.sse(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        );
    }

    fn push(&mut self, d: &Delta, out: &mut Frames) {
        match d {
            Delta::Reasoning(s) => {
                if self.show_thinking {
                    let start = json!({"type": "thinking", "thinking": "", "signature": ""});
                    self.open(Block::Thinking, start, out);
                    self.delta(json!({"type": "thinking_delta", "thinking": s}), out);
                }
            }
            Delta::Content(s) => {
                if !s.is_empty() {
                    self.open(Block::Text, json!({"type": "text", "text": ""}), out);
                    self.delta(json!({"type": "text_delta", "text": s}), out);
                }
            }
            Delta::ToolCallStart { index, id, name } => {
                let start =
                    json!({"type": "tool_use", "id": tool_use_id(id), "name": name, "input": {}});
                self.open(Block::Tool(*index), start, out);
            }
            Delta::ToolCallArgs { index, fragment } => {
                if self.open == Some(Block::Tool(*index)) {
                    self.delta(
                        json!({"type": "input_json_delta", "partial_json": fragment}),
                        out,
                    );
                }
            }
            Delta::ToolCallEnd { index } => {
                if self.open == Some(Block::Tool(*index)) {
                    self.close(out);
                }
            }
        }
    }
}

impl Render for MessageStream {
    fn open(&mut self, out: &mut Frames) {
        out.sse(
            Some("message_start"),
            &json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.n_prompt, "output_tokens": 0},
            }}),
        );
    }

    fn piece(&mut self, _choice: usize, piece: &Piece, out: &mut Frames) {
        match piece {
            Piece::Token { deltas, .. } => deltas.iter().for_each(|d| self.push(d, out)),
            Piece::Done(end) => {
                end.deltas.iter().for_each(|d| self.push(d, out));
                self.close(out);
                self.ping_once(out);
                let u = &end.usage;
                out.sse(
                    Some("message_delta"),
                    &json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason(end.finish, end.tool_calls, &end.stop), "stop_sequence": end.stop},
                        "usage": {
                            "input_tokens": u.n_prompt - u.n_cached,
                            "output_tokens": u.n_gen,
                            "cache_read_input_tokens": u.n_cached,
                            "cache_creation_input_tokens": 0,
                        }}),
                );
                out.sse(Some("message_stop"), &json!({"type": "message_stop"}));
            }
            Piece::Error(_) => {}
        }
    }

    fn keepalive(&mut self, out: &mut Frames) {
        out.sse(Some("ping"), &json!({"type": "ping"}));
    }

    fn keepalive_every(&self) -> Option<Duration> {
        Some(Duration::from_secs(15))
    }

    fn fail(&mut self, err: &ApiError, out: &mut Frames) {
        out.sse(Some("error"), &err.body(Api::Anthropic));
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's token count as the template renders it, for the
/// same request shapes as `/v1/messages` (the context size is not checked: the caller wants to know
/// how big the prompt is).
pub async fn count_tokens(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CountRequest = fields::parse_body(body)?;
    let l = state.loaded()?;
    let messages = to_messages(req.system.as_ref(), &req.messages)?;
    let tools = to_tools(req.tools, req.tool_choice.as_ref());
    let mut kwargs = Map::new();
    if let Some(t) = &req.thinking {
        kwargs.insert("enable_thinking".into(), Value::Bool(t.on()?));
    }
    let n = tokio::task::spawn_blocking(move || {
        pipeline::chat_prompt(&l, messages, tools, kwargs).map(|(ids, _)| ids.len())
    })
    .await
    .map_err(|e| ApiError::internal(format!("counting tokens failed: {e}")))??;
    Ok(Json(json!({"input_tokens": n})).into_response())
}
