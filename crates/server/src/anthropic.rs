//! Anthropic: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! Requests are converted to the OpenAI-style messages chat templates read: `system` becomes a
//! system message, `tool_use` blocks become `tool_calls`, `tool_result` blocks become `tool`
//! messages, `thinking` blocks become `reasoning_content`. Replies are content blocks (`thinking`,
//! `text`, `tool_use`); streamed, they follow the Messages event sequence: `message_start`, then per
//! block `content_block_start` / `content_block_delta`… / `content_block_stop`, then
//! `message_delta` (stop reason, output tokens) and `message_stop`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_engine::{Event, FinishReason, Request};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::{Api, ApiError};
use crate::gen::{self, ChunkTx, Sampling};
use crate::parse::{Delta, Parsed, StreamParser};
use crate::state::{AppState, Loaded};
use crate::structured::{self, ToolForce};

const API: Api = Api::Anthropic;

/// `thinking`.
#[derive(Deserialize, Debug)]
pub struct Thinking {
    /// `enabled` or `disabled`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// The fields of a Messages request that Hearth reads.
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
    /// Ignored.
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<Value>,
    /// System prompt.
    pub system: Option<Value>,
    /// Tools.
    pub tools: Option<Vec<Value>>,
    /// Thinking.
    pub thinking: Option<Thinking>,
}

fn text_of(v: &Value) -> Result<String, ApiError> {
    gen::content_text(API, Some(v))
}

/// Converts Anthropic messages (and `system`) to template messages.
fn to_messages(system: Option<&Value>, raw: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(s) = system {
        out.push(json!({"role": "system", "content": text_of(s)?}));
    }
    for (i, m) in raw.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        let role = match role {
            Some(r @ ("user" | "assistant")) => r,
            _ => {
                return Err(ApiError::bad_request(
                    API,
                    format!("messages.{i}.role: must be \"user\" or \"assistant\""),
                ))
            }
        };
        let content = m.get("content").unwrap_or(&Value::Null);
        let blocks = match content {
            Value::String(s) => {
                out.push(json!({"role": role, "content": s}));
                continue;
            }
            Value::Array(b) => b,
            _ => {
                return Err(ApiError::bad_request(
                    API,
                    format!("messages.{i}.content: must be a string or a list of blocks"),
                ))
            }
        };
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        for b in blocks {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
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
                        Some(v) => text_of(v)?,
                    };
                    results.push(json!({
                        "role": "tool",
                        "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                        "content": c,
                    }));
                }
                Some("image" | "document") => {
                    return Err(ApiError::bad_request(API, "this model accepts text only"))
                }
                _ => {
                    return Err(ApiError::bad_request(
                        API,
                        format!("messages.{i}.content: unknown block type"),
                    ))
                }
            }
        }
        // Tool results answer the previous assistant turn; they go first, as the template expects.
        out.extend(results);
        if !text.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
            let mut msg = json!({"role": role, "content": text});
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

fn kwargs(thinking: Option<&Thinking>) -> Map<String, Value> {
    let mut k = Map::new();
    if let Some(t) = thinking {
        k.insert("enable_thinking".into(), Value::Bool(t.kind == "enabled"));
    }
    k
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

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: MessagesRequest = gen::parse_body(API, body)?;
    let l = state.loaded(API)?;
    let max_tokens = gen::max_tokens(API, "max_tokens", req.max_tokens)?;
    let sampling = Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        ..Sampling::default()
    };
    let sampler = sampling.config(API, 0)?;
    let seed = sampler.seed;
    let msgs = to_messages(req.system.as_ref(), &req.messages)?;
    let force = structured::anthropic_tool_force(req.tool_choice.as_ref())?;
    let tool_spec = match &force {
        ToolForce::None => None,
        _ => structured::tool_spec(&l, API, req.tools.as_deref().unwrap_or(&[]), &force)?,
    };
    let constraint = tool_spec
        .as_ref()
        .map(|s| structured::compile(&l, API, structured::param_of(s, API), s))
        .transpose()?;
    let tools = to_tools(req.tools, req.tool_choice.as_ref());
    let mut kw = kwargs(req.thinking.as_ref());
    if constraint.is_some() {
        kw = structured::no_thinking(kw);
    }
    let prompt = gen::chat_prompt(&l, API, msgs, tools.clone(), kw)?;
    let constrained = constraint.is_some();
    let stops: Vec<String> = req
        .stop_sequences
        .unwrap_or_default()
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    let rx = gen::submit(
        &l,
        API,
        Request {
            prompt: prompt.ids.clone(),
            max_tokens,
            sampler,
            stop: stops.clone(),
            logprobs: None,
            constraint,
        },
    )?;
    let tools_v = tools.map(Value::Array);
    let mut parser = StreamParser::new(gen::parser_config(
        &l,
        tools_v.as_ref(),
        prompt.in_think,
        constrained,
        seed,
    ));
    let model = req.model.unwrap_or_else(|| l.info().alias.clone());
    let id = gen::new_id("msg_");
    let n_prompt = prompt.ids.len();

    if req.stream.unwrap_or(false) {
        let (tx, resp) = gen::stream_response("text/event-stream");
        tokio::spawn(stream(l, tx, rx, parser, id, model, n_prompt, stops));
        return Ok(resp);
    }
    let out = gen::collect(API, rx).await?;
    let mut deltas = parser.push(&out.text);
    deltas.extend(parser.finish());
    let parsed = Parsed::from_deltas(deltas);
    let mut content = Vec::new();
    if let Some(r) = parsed.reasoning {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if !parsed.content.is_empty() {
        content.push(json!({"type": "text", "text": parsed.content}));
    }
    for c in &parsed.tool_calls {
        content.push(json!({"type": "tool_use", "id": tool_use_id(&c.id), "name": c.name, "input": parse_input(&c.arguments)}));
    }
    let stop = gen::matched_stop(&l, &out, &stops);
    Ok(Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(out.finish, !parsed.tool_calls.is_empty(), &stop),
        "stop_sequence": stop,
        "usage": {"input_tokens": out.n_prompt, "output_tokens": out.n_gen, "cache_read_input_tokens": out.n_cached, "cache_creation_input_tokens": 0},
    }))
    .into_response())
}

/// The kind of the content block being streamed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Block {
    Thinking,
    Text,
    Tool(usize),
}

struct BlockWriter<'a> {
    tx: &'a ChunkTx,
    open: Option<Block>,
    index: usize,
    tools: bool,
}

impl BlockWriter<'_> {
    fn send(&self, event: &str, data: Value) -> bool {
        gen::sse(self.tx, Some(event), &data)
    }

    fn close(&mut self) -> bool {
        if let Some(b) = self.open.take() {
            if b == Block::Thinking
                && !self.send("content_block_delta", json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "signature_delta", "signature": ""}}))
            {
                return false;
            }
            if !self.send(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.index}),
            ) {
                return false;
            }
            self.index += 1;
        }
        true
    }

    fn open(&mut self, b: Block, start: Value) -> bool {
        if self.open == Some(b) {
            return true;
        }
        if !self.close() {
            return false;
        }
        self.open = Some(b);
        self.send(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": start}),
        )
    }

    fn delta(&mut self, d: Delta) -> bool {
        let idx = self.index;
        match d {
            Delta::Reasoning(s) => {
                self.open(Block::Thinking, json!({"type": "thinking", "thinking": "", "signature": ""}))
                    && self.send("content_block_delta", json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "thinking_delta", "thinking": s}}))
            }
            Delta::Content(s) => {
                if s.is_empty() {
                    return true;
                }
                self.open(Block::Text, json!({"type": "text", "text": ""}))
                    && self.send("content_block_delta", json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": s}}))
            }
            Delta::ToolCallStart { index, id, name } => {
                self.tools = true;
                self.open(Block::Tool(index), json!({"type": "tool_use", "id": tool_use_id(&id), "name": name, "input": {}}))
            }
            Delta::ToolCallArgs { index, fragment } => {
                if self.open != Some(Block::Tool(index)) {
                    return true;
                }
                self.send("content_block_delta", json!({"type": "content_block_delta", "index": idx, "delta": {"type": "input_json_delta", "partial_json": fragment}}))
            }
            Delta::ToolCallEnd { index } => {
                if self.open == Some(Block::Tool(index)) {
                    self.close()
                } else {
                    true
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn stream(
    l: std::sync::Arc<Loaded>,
    tx: ChunkTx,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    mut parser: StreamParser,
    id: String,
    model: String,
    n_prompt: usize,
    stops: Vec<String>,
) {
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": n_prompt, "output_tokens": 0},
    }});
    if !gen::sse(&tx, Some("message_start"), &start)
        || !gen::sse(&tx, Some("ping"), &json!({"type": "ping"}))
    {
        return;
    }
    let mut w = BlockWriter {
        tx: &tx,
        open: None,
        index: 0,
        tools: false,
    };
    let mut tokens = Vec::new();
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token {
                id,
                text: t,
                logprob,
            } => {
                text.push_str(&t);
                tokens.push(gen::Token {
                    id,
                    text: t.clone(),
                    logprob,
                });
                for d in parser.push(&t) {
                    if !w.delta(d) {
                        return;
                    }
                }
            }
            Event::Done {
                finish,
                text: t,
                n_prompt,
                n_cached,
                n_gen,
            } => {
                text.push_str(&t);
                let mut ds = parser.push(&t);
                ds.extend(parser.finish());
                for d in ds {
                    if !w.delta(d) {
                        return;
                    }
                }
                if !w.close() {
                    return;
                }
                let out = gen::Output {
                    text: std::mem::take(&mut text),
                    tokens: std::mem::take(&mut tokens),
                    finish,
                    n_prompt,
                    n_cached,
                    n_gen,
                };
                let stop = gen::matched_stop(&l, &out, &stops);
                let md = json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(finish, w.tools, &stop), "stop_sequence": stop},
                    "usage": {"output_tokens": n_gen}});
                if gen::sse(&tx, Some("message_delta"), &md) {
                    let _ = gen::sse(&tx, Some("message_stop"), &json!({"type": "message_stop"}));
                }
                return;
            }
            Event::Error(e) => {
                let _ = gen::sse(&tx, Some("error"), &ApiError::internal(API, e).body());
                return;
            }
        }
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's token count as the template renders it.
pub async fn count_tokens(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CountRequest = gen::parse_body(API, body)?;
    let l = state.loaded(API)?;
    let msgs = to_messages(req.system.as_ref(), &req.messages)?;
    let tools = to_tools(req.tools, None);
    let _ = req.model;
    // count_tokens does not check the context size: the caller wants to know how big it is.
    let input = hearth_tokenizer::template::ChatInput {
        messages: msgs,
        tools,
        add_generation_prompt: true,
        kwargs: kwargs(req.thinking.as_ref()),
        bos_token: l
            .tok()
            .bos_id()
            .map(|i| l.tok().token_text(i).to_string())
            .unwrap_or_default(),
        eos_token: l
            .tok()
            .eos_id()
            .map(|i| l.tok().token_text(i).to_string())
            .unwrap_or_default(),
    };
    let ids = l
        .encoder
        .prompt(l.tok(), &l.template, &input)
        .map_err(|e| ApiError::bad_request(API, e.to_string()))?;
    Ok(Json(json!({"input_tokens": ids.len()})).into_response())
}

/// Anthropic spells tool-use ids `toolu_…`; the parser's ids are OpenAI's `call_…`.
fn tool_use_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.strip_prefix("call_").unwrap_or(call_id))
}
