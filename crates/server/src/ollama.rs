//! Ollama: `POST /api/chat`, `POST /api/generate` (NDJSON streaming, on by default), `GET /api/tags`,
//! `POST /api/show`, `GET /api/version`, `GET /api/ps`, and `GET /` / `HEAD /` which clients probe.
//! Reasoning goes to `message.thinking` (`thinking` for generate); tool calls to
//! `message.tool_calls` with arguments as objects, sent whole once complete.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_engine::{Event, FinishReason, Request};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::{Api, ApiError};
use crate::gen::{self, Sampling, StopField};
use crate::parse::{Delta, Parsed, StreamParser};
use crate::state::{AppState, Loaded};
use crate::structured;
use hearth_constrain::Grammar;

const API: Api = Api::Ollama;

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
    /// Context size: accepted, but the server's `--ctx` applies.
    pub num_ctx: Option<i64>,
}

/// The fields of `/api/chat` that Hearth reads.
#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    /// Echoed back.
    pub model: Option<String>,
    /// The conversation.
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
}

fn think_kwargs(think: Option<&Value>) -> Result<Map<String, Value>, ApiError> {
    let mut k = Map::new();
    match think {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => {
            k.insert("enable_thinking".into(), Value::Bool(*b));
        }
        Some(Value::String(_)) => {
            k.insert("enable_thinking".into(), Value::Bool(true));
        }
        Some(_) => return Err(ApiError::bad_request(API, "`think` must be a boolean")),
    }
    Ok(k)
}

/// The compiled grammar of a `format` field, if any.
fn format_grammar(l: &Loaded, format: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    structured::ollama_format(format)?
        .map(|s| structured::compile(l, API, "format", &s))
        .transpose()
}

struct Plan {
    sampler: hearth_engine::SamplerConfig,
    max_tokens: Option<usize>,
    stop: Vec<String>,
}

fn plan(o: Option<Options>) -> Result<Plan, ApiError> {
    let o = o.unwrap_or_default();
    let max_tokens = match o.num_predict {
        None => None,
        Some(n) if n < 0 => None,
        Some(0) => return Err(ApiError::bad_request(API, "`num_predict` must not be 0")),
        n => gen::max_tokens(API, "num_predict", n)?,
    };
    if o.num_ctx.is_some_and(|c| c < 0) {
        return Err(ApiError::bad_request(API, "`num_ctx` must be >= 0"));
    }
    let sampling = Sampling {
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
    Ok(Plan {
        sampler: sampling.config(API, 0)?,
        max_tokens,
        stop: o.stop.map(StopField::into_vec).unwrap_or_default(),
    })
}

fn messages(raw: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    raw.into_iter()
        .map(|m| {
            let Value::Object(mut m) = m else {
                return Err(ApiError::bad_request(API, "each message must be an object"));
            };
            if !matches!(
                m.get("role").and_then(Value::as_str),
                Some("system" | "user" | "assistant" | "tool")
            ) {
                return Err(ApiError::bad_request(
                    API,
                    "message role must be system, user, assistant or tool",
                ));
            }
            let text = gen::content_text(API, m.get("content"))?;
            m.insert("content".into(), Value::String(text));
            if let Some(t) = m.remove("thinking") {
                m.insert("reasoning_content".into(), t);
            }
            if m.get("images")
                .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
            {
                return Err(ApiError::bad_request(API, "this model accepts text only"));
            }
            if let Some(calls) = m.get_mut("tool_calls") {
                gen::normalize_tool_calls(calls);
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
    fn fold(&mut self, deltas: Vec<Delta>) -> (String, String, Vec<Value>) {
        let (mut c, mut t, mut done) = (String::new(), String::new(), Vec::new());
        for d in deltas {
            match d {
                Delta::Content(s) => c.push_str(&s),
                Delta::Reasoning(s) => t.push_str(&s),
                Delta::ToolCallStart { index, name, .. } => {
                    self.open.push((index, name, String::new()))
                }
                Delta::ToolCallArgs { index, fragment } => {
                    if let Some(o) = self.open.iter_mut().find(|o| o.0 == index) {
                        o.2.push_str(&fragment);
                    }
                }
                Delta::ToolCallEnd { index } => {
                    if let Some(p) = self.open.iter().position(|o| o.0 == index) {
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

fn timings(start: Instant, n_prompt: usize, n_gen: usize) -> Map<String, Value> {
    let total = start.elapsed().as_nanos() as u64;
    let mut m = Map::new();
    m.insert("total_duration".into(), total.into());
    m.insert("load_duration".into(), 0.into());
    m.insert("prompt_eval_count".into(), n_prompt.into());
    m.insert("prompt_eval_duration".into(), 0.into());
    m.insert("eval_count".into(), n_gen.into());
    m.insert("eval_duration".into(), total.into());
    m
}

/// The body and NDJSON framing of both generating endpoints; `chat` picks `/api/chat` shapes.
async fn run(
    chat: bool,
    stream: bool,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    mut parser: StreamParser,
    model: String,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let frame = move |content: &str, thinking: &str, calls: Vec<Value>, done: bool| -> Value {
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
    };
    if !stream {
        let out = gen::collect(API, rx).await?;
        let mut d = parser.push(&out.text);
        d.extend(parser.finish());
        let p = Parsed::from_deltas(d);
        let calls: Vec<Value> = p
            .tool_calls
            .iter()
            .map(|c| call_json(&c.name, &c.arguments))
            .collect();
        let mut v = frame(
            &p.content,
            p.reasoning.as_deref().unwrap_or(""),
            calls,
            true,
        );
        v["done_reason"] = done_reason(out.finish).into();
        if let Value::Object(o) = &mut v {
            o.extend(timings(start, out.n_prompt, out.n_gen));
        }
        return Ok(Json(v).into_response());
    }
    let (tx, resp) = gen::stream_response("application/x-ndjson");
    tokio::spawn(async move {
        let mut calls = Calls::default();
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Token { text, .. } => {
                    let (c, t, k) = calls.fold(parser.push(&text));
                    if (!c.is_empty() || !t.is_empty() || !k.is_empty())
                        && !gen::ndjson(&tx, &frame(&c, &t, k, false))
                    {
                        return;
                    }
                }
                Event::Done {
                    finish,
                    text,
                    n_prompt,
                    n_gen,
                    ..
                } => {
                    let mut d = parser.push(&text);
                    d.extend(parser.finish());
                    let (c, t, k) = calls.fold(d);
                    if (!c.is_empty() || !t.is_empty() || !k.is_empty())
                        && !gen::ndjson(&tx, &frame(&c, &t, k, false))
                    {
                        return;
                    }
                    let mut v = frame("", "", Vec::new(), true);
                    v["done_reason"] = done_reason(finish).into();
                    if let Value::Object(o) = &mut v {
                        o.extend(timings(start, n_prompt, n_gen));
                    }
                    let _ = gen::ndjson(&tx, &v);
                    return;
                }
                Event::Error(e) => {
                    let _ = gen::ndjson(&tx, &json!({"error": e}));
                    return;
                }
            }
        }
    });
    Ok(resp)
}

/// `POST /api/chat`.
pub async fn chat(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = gen::parse_body(API, body)?;
    let l = state.loaded(API)?;
    let p = plan(req.options)?;
    let tools = req.tools.filter(|t| !t.is_empty());
    let constraint = format_grammar(&l, req.format.as_ref())?;
    let mut kwargs = think_kwargs(req.think.as_ref())?;
    if constraint.is_some() {
        kwargs = structured::no_thinking(kwargs);
    }
    let constrained = constraint.is_some();
    let prompt = gen::chat_prompt(&l, API, messages(req.messages)?, tools.clone(), kwargs)?;
    let seed = p.sampler.seed;
    let rx = gen::submit(
        &l,
        API,
        Request {
            prompt: prompt.ids,
            max_tokens: p.max_tokens,
            sampler: p.sampler,
            stop: p.stop,
            logprobs: None,
            constraint,
        },
    )?;
    let tools_v = tools.map(Value::Array);
    let parser = StreamParser::new(gen::parser_config(
        &l,
        tools_v.as_ref(),
        prompt.in_think,
        constrained,
        seed,
    ));
    let model = req.model.unwrap_or_else(|| l.info().alias.clone());
    run(true, req.stream.unwrap_or(true), rx, parser, model).await
}

/// `POST /api/generate`. An empty prompt loads the model (a no-op here) and answers done.
pub async fn generate(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: GenerateRequest = gen::parse_body(API, body)?;
    let l = state.loaded(API)?;
    let model = req.model.clone().unwrap_or_else(|| l.info().alias.clone());
    let text = req.prompt.unwrap_or_default();
    if text.is_empty() {
        return Ok(Json(json!({"model": model, "created_at": created_at(), "response": "", "done": true, "done_reason": "load"})).into_response());
    }
    let p = plan(req.options)?;
    let constraint = format_grammar(&l, req.format.as_ref())?;
    let constrained = constraint.is_some();
    let (ids, in_think) = if req.raw.unwrap_or(false) {
        (gen::raw_prompt(&l, API, &text)?, false)
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = req.system {
            msgs.push(json!({"role": "system", "content": s}));
        }
        msgs.push(json!({"role": "user", "content": text}));
        let mut kwargs = think_kwargs(req.think.as_ref())?;
        if constrained {
            kwargs = structured::no_thinking(kwargs);
        }
        let pr = gen::chat_prompt(&l, API, msgs, None, kwargs)?;
        (pr.ids, pr.in_think)
    };
    let seed = p.sampler.seed;
    let rx = gen::submit(
        &l,
        API,
        Request {
            prompt: ids,
            max_tokens: p.max_tokens,
            sampler: p.sampler,
            stop: p.stop,
            logprobs: None,
            constraint,
        },
    )?;
    let mut cfg = gen::parser_config(&l, None, in_think, constrained, seed);
    if req.raw.unwrap_or(false) {
        cfg = crate::parse::ParserConfig::plain();
    }
    run(
        false,
        req.stream.unwrap_or(true),
        rx,
        StreamParser::new(cfg),
        model,
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
    let l = state.loaded(API)?;
    let info = l.info();
    Ok(Json(json!({"models": [{
        "name": info.alias, "model": info.alias, "modified_at": created_at(),
        "size": info.file_size, "digest": digest(&l), "details": details(&l),
    }]}))
    .into_response())
}

/// `GET /api/ps`.
pub async fn ps(State(state): State<AppState>) -> Result<Response, ApiError> {
    let l = state.loaded(API)?;
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
    let _: Value = gen::parse_body(API, body)?;
    let l = state.loaded(API)?;
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
