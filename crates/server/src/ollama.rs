//! Ollama: `POST /api/chat`, `POST /api/generate` (NDJSON streaming, on by default), `GET /api/tags`,
//! `POST /api/show`, `GET /api/version`, `GET /api/ps`, and `GET /` / `HEAD /` which clients probe.
//! Reasoning goes to `message.thinking` (`thinking` for generate); tool calls to
//! `message.tool_calls` with arguments as objects, sent whole once complete.
//!
//! `keep_alive` (a number of seconds, or a Go duration such as `"5m"`; negative means forever) is
//! checked and otherwise has no effect: the server serves one model, loaded at start and kept
//! until it exits. Ollama's load and unload requests (`/api/generate` without a prompt, `/api/chat`
//! with no messages) answer as Ollama does, `done_reason` `"load"`, or `"unload"` when
//! `keep_alive` is 0, without generating; the model stays loaded either way.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_engine::{FinishReason, Usage};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::{Api, ApiError};
use crate::fields::{self, Sampling, StopField};
use crate::parse::Delta;
use crate::pipeline::{self, GenRequest, Piece, PromptInput, Reply};
use crate::state::{AppState, Loaded};
use crate::stream::{self, Frames, Render};
use crate::structured;

/// `options`.
#[derive(Deserialize, Debug, Default)]
pub struct Options {
    /// Temperature.
    pub temperature: Option<f64>,
    /// Token budget; negative means no limit.
    pub num_predict: Option<i64>,
    /// Seed.
    pub seed: Option<i64>,
    /// Top-k.
    pub top_k: Option<i64>,
    /// Top-p.
    pub top_p: Option<f64>,
    /// Min-p.
    pub min_p: Option<f64>,
    /// Repetition penalty.
    pub repeat_penalty: Option<f64>,
    /// Presence penalty.
    pub presence_penalty: Option<f64>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f64>,
    /// Stop strings.
    pub stop: Option<StopField>,
    /// Context size of this request, up to the server's context per sequence.
    pub num_ctx: Option<i64>,
}

/// The fields of `/api/chat` that Hearth reads.
#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    /// Echoed back.
    pub model: Option<String>,
    /// The conversation; empty or absent is a load request.
    #[serde(default)]
    pub messages: Vec<Value>,
    /// Stream NDJSON (default true).
    pub stream: Option<bool>,
    /// Thinking on or off (`"high"` etc. mean on).
    pub think: Option<Value>,
    /// Tools.
    pub tools: Option<Vec<Value>>,
    /// `"json"` or a JSON schema the reply must follow.
    pub format: Option<Value>,
    /// Sampling options.
    pub options: Option<Options>,
    /// How long the model should stay loaded (see the module docs).
    pub keep_alive: Option<Value>,
}

/// The fields of `/api/generate` that Hearth reads.
#[derive(Deserialize, Debug)]
pub struct GenerateRequest {
    /// Echoed back.
    pub model: Option<String>,
    /// The prompt.
    pub prompt: Option<String>,
    /// System prompt (templated mode).
    pub system: Option<String>,
    /// Send the prompt as is, without the chat template.
    pub raw: Option<bool>,
    /// Stream NDJSON (default true).
    pub stream: Option<bool>,
    /// Thinking on or off.
    pub think: Option<Value>,
    /// `"json"` or a JSON schema the reply must follow.
    pub format: Option<Value>,
    /// Sampling options.
    pub options: Option<Options>,
    /// How long the model should stay loaded (see the module docs).
    pub keep_alive: Option<Value>,
}

/// Ollama's `think`: a boolean, or a level (`"high"`...) that means on.
fn thinking(think: Option<&Value>) -> Result<Option<bool>, ApiError> {
    match think {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(_)) => Ok(Some(true)),
        Some(_) => Err(ApiError::bad_request("`think` must be a boolean")),
    }
}

/// Whether `keep_alive` asks to unload (zero), after checking it is an Ollama duration: a number
/// of seconds, or a Go duration string (`"5m"`, `"1h30m"`, `"-1s"`, `"0"`; Ollama's clients also
/// send a number as a string, which is taken as seconds).
fn unloads(keep_alive: Option<&Value>) -> Result<bool, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "`keep_alive` must be a number of seconds or a duration such as \"5m\"",
        )
    };
    match keep_alive {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Number(n)) => Ok(n.as_f64() == Some(0.0)),
        Some(Value::String(s)) => {
            let s = s.trim();
            if let Ok(secs) = s.parse::<f64>() {
                return Ok(secs == 0.0);
            }
            go_duration_is_zero(s).ok_or_else(bad)
        }
        Some(_) => Err(bad()),
    }
}

/// Parses a Go duration (`[-+]` then one or more `NUMBER UNIT`, units `ns us µs ms s m h`) and
/// says whether it is zero; `None` if it is not one.
fn go_duration_is_zero(s: &str) -> Option<bool> {
    let mut rest = s.strip_prefix(['-', '+']).unwrap_or(s);
    if rest.is_empty() {
        return None;
    }
    let mut zero = true;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit = ["ns", "us", "µs", "ms", "s", "m", "h"]
            .into_iter()
            .filter(|u| rest.starts_with(u))
            .max_by_key(|u| u.len())?;
        rest = &rest[unit.len()..];
        zero &= value == 0.0;
    }
    Some(zero)
}

/// Ollama's answer to a load (or, with `keep_alive` 0, unload) request.
fn load_reply(chat: bool, model: &str, unload: bool) -> Response {
    let mut v = frame(chat, model, "", "", Vec::new(), true);
    v["done_reason"] = if unload { "unload" } else { "load" }.into();
    Json(v).into_response()
}

/// The generation fields of `options` (and `format`) applied to a request.
fn apply_options(
    l: &Loaded,
    o: Option<Options>,
    format: Option<&Value>,
    mut gen: GenRequest,
) -> Result<GenRequest, ApiError> {
    let o = o.unwrap_or_default();
    gen.max_tokens = match o.num_predict {
        None => None,
        Some(n) if n < 0 => None,
        Some(0) => return Err(ApiError::bad_request("`num_predict` must not be 0")),
        n => fields::max_tokens("num_predict", n)?,
    };
    gen.n_ctx = match o.num_ctx {
        None | Some(0) => None,
        Some(c) if c < 0 => return Err(ApiError::bad_request("`num_ctx` must be >= 0")),
        // Clients send their own defaults (2048, 32768, ...): taken up to the server's limit.
        Some(c) => Some((c as u64).min(l.info().n_ctx as u64) as usize),
    };
    gen.sampling = Sampling {
        temperature: o.temperature,
        top_p: o.top_p,
        top_k: o.top_k,
        min_p: o.min_p,
        presence_penalty: o.presence_penalty,
        frequency_penalty: o.frequency_penalty,
        repeat_penalty: o.repeat_penalty,
        seed: o.seed,
        logit_bias: Vec::new(),
    };
    gen.stop = o.stop.map(StopField::into_vec).unwrap_or_default();
    gen.format = structured::ollama_format(format)?.map(|s| (s, "format"));
    Ok(gen)
}

fn messages(raw: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    raw.into_iter()
        .map(|m| {
            let Value::Object(mut m) = m else {
                return Err(ApiError::bad_request("each message must be an object"));
            };
            if !matches!(
                m.get("role").and_then(Value::as_str),
                Some("system" | "user" | "assistant" | "tool")
            ) {
                return Err(ApiError::bad_request(
                    "message role must be system, user, assistant or tool",
                ));
            }
            let text = fields::content_text(m.get("content"))?;
            m.insert("content".into(), Value::String(text));
            if let Some(t) = m.remove("thinking") {
                m.insert("reasoning_content".into(), t);
            }
            if m.get("images")
                .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
            {
                return Err(ApiError::bad_request("this model accepts text only"));
            }
            if let Some(calls) = m.get_mut("tool_calls") {
                fields::normalize_tool_calls(calls);
            }
            Ok(Value::Object(m))
        })
        .collect()
}

fn done_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

fn created_at() -> String {
    // RFC 3339 in UTC from the Unix clock (civil-from-days, Howard Hinnant's algorithm).
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, sod) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        d.subsec_nanos()
    )
}

/// Accumulates tool calls (Ollama sends each call whole, arguments as an object).
#[derive(Default)]
struct Calls {
    open: Vec<(usize, String, String)>, // (index, name, argument text so far)
}

impl Calls {
    /// Folds `deltas`; returns (content, thinking, finished calls).
    fn fold(&mut self, deltas: &[Delta]) -> (String, String, Vec<Value>) {
        let (mut c, mut t, mut done) = (String::new(), String::new(), Vec::new());
        for d in deltas {
            match d {
                Delta::Content(s) => c.push_str(s),
                Delta::Reasoning(s) => t.push_str(s),
                Delta::ToolCallStart { index, name, .. } => {
                    self.open.push((*index, name.clone(), String::new()))
                }
                Delta::ToolCallArgs { index, fragment } => {
                    if let Some(o) = self.open.iter_mut().find(|o| o.0 == *index) {
                        o.2.push_str(fragment);
                    }
                }
                Delta::ToolCallEnd { index } => {
                    if let Some(p) = self.open.iter().position(|o| o.0 == *index) {
                        let (_, name, args) = self.open.remove(p);
                        done.push(call_json(&name, &args));
                    }
                }
            }
        }
        (c, t, done)
    }
}

fn call_json(name: &str, args: &str) -> Value {
    json!({"function": {"name": name, "arguments": serde_json::from_str::<Value>(args).unwrap_or_else(|_| json!({}))}})
}

/// Ollama's timing fields: `prompt_eval_count` is the prompt tokens evaluated (not those served
/// from the prefix cache), durations in nanoseconds.
fn timings(start: Instant, u: &Usage) -> Map<String, Value> {
    let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let mut m = Map::new();
    m.insert("total_duration".into(), ns(start.elapsed()).into());
    m.insert("load_duration".into(), 0.into());
    m.insert("prompt_eval_count".into(), (u.n_prompt - u.n_cached).into());
    m.insert("prompt_eval_duration".into(), ns(u.prompt_time).into());
    m.insert("eval_count".into(), u.n_gen.into());
    m.insert("eval_duration".into(), ns(u.gen_time).into());
    m
}

/// One reply frame of `/api/chat` (`chat`) or `/api/generate`.
fn frame(
    chat: bool,
    model: &str,
    content: &str,
    thinking: &str,
    calls: Vec<Value>,
    done: bool,
) -> Value {
    let mut v = json!({"model": model, "created_at": created_at()});
    if chat {
        let mut msg = json!({"role": "assistant", "content": content});
        if !thinking.is_empty() {
            msg["thinking"] = thinking.into();
        }
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        v["message"] = msg;
    } else {
        v["response"] = content.into();
        if !thinking.is_empty() {
            v["thinking"] = thinking.into();
        }
    }
    v["done"] = done.into();
    v
}

/// The NDJSON frames of a streamed reply: text and thinking as they come, each tool call whole
/// once complete, then the `done` frame with the reason and timings.
struct NdjsonStream {
    chat: bool,
    model: String,
    start: Instant,
    calls: Calls,
}

impl Render for NdjsonStream {
    fn piece(&mut self, _choice: usize, piece: &Piece, out: &mut Frames) {
        let deltas = match piece {
            Piece::Token { deltas, .. } => deltas,
            Piece::Done(end) => &end.deltas,
            Piece::Error(_) => return,
        };
        let (c, t, k) = self.calls.fold(deltas);
        if !c.is_empty() || !t.is_empty() || !k.is_empty() {
            out.ndjson(&frame(self.chat, &self.model, &c, &t, k, false));
        }
        if let Piece::Done(end) = piece {
            let mut v = frame(self.chat, &self.model, "", "", Vec::new(), true);
            v["done_reason"] = done_reason(end.finish).into();
            if let Value::Object(o) = &mut v {
                o.extend(timings(self.start, &end.usage));
            }
            out.ndjson(&v);
        }
    }

    fn fail(&mut self, err: &ApiError, out: &mut Frames) {
        out.ndjson(&err.body(Api::Ollama));
    }
}

/// Answers one reply, streamed (the default) or whole.
async fn respond(
    state: &AppState,
    chat: bool,
    stream: bool,
    mut replies: Vec<Reply>,
    model: String,
    start: Instant,
) -> Result<Response, ApiError> {
    if stream {
        let render = NdjsonStream {
            chat,
            model,
            start,
            calls: Calls::default(),
        };
        let cfg = state.config().stream;
        return Ok(stream::respond(
            "application/x-ndjson",
            render,
            replies,
            cfg,
        ));
    }
    let reply = replies
        .pop()
        .ok_or_else(|| ApiError::internal("no reply"))?;
    let w = reply.fold().await?;
    let calls: Vec<Value> = w
        .tool_calls
        .iter()
        .map(|c| call_json(&c.name, &c.arguments))
        .collect();
    let thinking = w.reasoning.as_deref().unwrap_or("");
    let mut v = frame(chat, &model, &w.content, thinking, calls, true);
    v["done_reason"] = done_reason(w.finish).into();
    if let Value::Object(o) = &mut v {
        o.extend(timings(start, &w.usage));
    }
    Ok(Json(v).into_response())
}

/// `POST /api/chat`.
pub async fn chat(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let start = Instant::now(); // see `generate`
    let req: ChatRequest = fields::parse_body(body)?;
    let l = state.loaded()?;
    let model = req.model.unwrap_or_else(|| l.info().alias.clone());
    let unload = unloads(req.keep_alive.as_ref())?;
    if req.messages.is_empty() {
        return Ok(load_reply(true, &model, unload));
    }
    let gen = GenRequest {
        thinking: thinking(req.think.as_ref())?,
        ..GenRequest::new(PromptInput::Chat {
            messages: messages(req.messages)?,
            tools: req.tools,
            kwargs: Map::new(),
        })
    };
    let gen = apply_options(&l, req.options, req.format.as_ref(), gen)?;
    let (replies, _) = pipeline::start(l.clone(), gen).await?;
    respond(
        &state,
        true,
        req.stream.unwrap_or(true),
        replies,
        model,
        start,
    )
    .await
}

/// `POST /api/generate`. An empty prompt loads (or unloads) the model, a no-op here, and answers
/// done.
pub async fn generate(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    // total_duration counts from here, so it covers the prompt's evaluation (timed from the
    // sequence's creation, later) and the generation.
    let start = Instant::now();
    let req: GenerateRequest = fields::parse_body(body)?;
    let l = state.loaded()?;
    let model = req.model.clone().unwrap_or_else(|| l.info().alias.clone());
    let unload = unloads(req.keep_alive.as_ref())?;
    let text = req.prompt.unwrap_or_default();
    if text.is_empty() {
        return Ok(load_reply(false, &model, unload));
    }
    let gen = if req.raw.unwrap_or(false) {
        GenRequest {
            parse: false,
            ..GenRequest::new(PromptInput::Text(text))
        }
    } else {
        let mut messages = Vec::new();
        if let Some(s) = req.system {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": text}));
        GenRequest {
            thinking: thinking(req.think.as_ref())?,
            ..GenRequest::new(PromptInput::Chat {
                messages,
                tools: None,
                kwargs: Map::new(),
            })
        }
    };
    let gen = apply_options(&l, req.options, req.format.as_ref(), gen)?;
    let (replies, _) = pipeline::start(l.clone(), gen).await?;
    respond(
        &state,
        false,
        req.stream.unwrap_or(true),
        replies,
        model,
        start,
    )
    .await
}

fn details(l: &Loaded) -> Value {
    let info = l.info();
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": info.arch,
        "families": [info.arch],
        "parameter_size": param_size(info.n_params),
        "quantization_level": info.quantization.clone().unwrap_or_default(),
    })
}

fn param_size(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{:.1}M", n as f64 / 1e6)
    }
}

fn digest(l: &Loaded) -> String {
    // Not a content hash (hashing gigabytes at start-up is not worth it): a stable id from the
    // alias and size, in the 64-hex-digit shape clients display.
    let info = l.info();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in info.alias.bytes().chain(info.file_size.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}").repeat(4)
}

/// `GET /api/tags`.
pub async fn tags(State(state): State<AppState>) -> Result<Response, ApiError> {
    let l = state.loaded()?;
    let info = l.info();
    Ok(Json(json!({"models": [{
        "name": info.alias, "model": info.alias, "modified_at": created_at(),
        "size": info.file_size, "digest": digest(&l), "details": details(&l),
    }]}))
    .into_response())
}

/// `GET /api/ps`.
pub async fn ps(State(state): State<AppState>) -> Result<Response, ApiError> {
    let l = state.loaded()?;
    let info = l.info();
    Ok(Json(json!({"models": [{
        "name": info.alias, "model": info.alias, "size": info.file_size, "digest": digest(&l),
        "details": details(&l), "expires_at": "2999-01-01T00:00:00Z", "size_vram": 0,
        "context_length": info.n_ctx,
    }]}))
    .into_response())
}

/// `POST /api/show`.
pub async fn show(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let _: Value = fields::parse_body(body)?;
    let l = state.loaded()?;
    let info = l.info();
    let mut model_info = Map::new();
    model_info.insert("general.architecture".into(), info.arch.clone().into());
    model_info.insert("general.parameter_count".into(), info.n_params.into());
    model_info.insert(
        format!("{}.context_length", info.arch),
        info.n_ctx_train.into(),
    );
    let mut caps = vec!["completion"];
    if l.tool_format != crate::parse::ToolFormat::None {
        caps.push("tools");
    }
    if l.template.source().contains("<think>") {
        caps.push("thinking");
    }
    Ok(Json(json!({
        "modelfile": format!("FROM {}\n", info.alias),
        "parameters": format!("num_ctx {}", info.n_ctx),
        "template": l.template.source(),
        "details": details(&l),
        "model_info": model_info,
        "capabilities": caps,
        "modified_at": created_at(),
    }))
    .into_response())
}

/// `GET /api/version`.
pub async fn version() -> Response {
    Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `GET /`: clients probe it to find a server.
pub async fn root() -> Response {
    (StatusCode::OK, "Ollama is running").into_response()
}

/// `HEAD /`.
pub async fn root_head() -> Response {
    StatusCode::OK.into_response()
}
