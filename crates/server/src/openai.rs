//! OpenAI: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`.
//!
//! Each of `n` choices is its own backend request (seed + i), so they decode side by side. Streamed
//! replies are `chat.completion.chunk` SSE frames ending in `data: [DONE]`; reasoning arrives as
//! `reasoning_content` deltas and tool calls as `tool_calls` deltas (name first, then argument
//! pieces), exactly as the non-streaming reply folds them.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_constrain::Spec;
use hearth_engine::{FinishReason, TokenLogprob, Usage};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::{Api, ApiError};
use crate::fields::{self, Sampling, StopField};
use crate::parse::Delta;
use crate::pipeline::{self, GenRequest, Piece, PromptInput, TokenOut, Whole};
use crate::state::{AppState, Loaded};
use crate::stream::{self, Frames, Render};
use crate::structured;

/// `stream_options`.
#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    /// Send a last chunk with the token usage.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The fields of a chat request that Hearth reads (others are ignored).
#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    /// Echoed back; any value is accepted.
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<Value>,
    /// Stream SSE chunks.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Token budget (legacy name).
    pub max_tokens: Option<i64>,
    /// Token budget.
    pub max_completion_tokens: Option<i64>,
    /// Sampling settings.
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Stop strings.
    pub stop: Option<StopField>,
    /// Choices.
    pub n: Option<i64>,
    /// Return log-probabilities.
    pub logprobs: Option<bool>,
    /// Alternatives per token.
    pub top_logprobs: Option<i64>,
    /// Tool definitions.
    pub tools: Option<Vec<Value>>,
    /// `"none"` hides the tools from the template.
    pub tool_choice: Option<Value>,
    /// Extra template variables (`enable_thinking`…).
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Structured output.
    #[serde(flatten)]
    pub format: FormatFields,
}

/// The structured-output fields both OpenAI request kinds share.
#[derive(Deserialize, Debug, Default)]
pub struct FormatFields {
    /// `{"type": "text" | "json_object" | "json_schema", ..}`.
    pub response_format: Option<Value>,
    /// A GBNF grammar (llama-server).
    pub grammar: Option<String>,
    /// A JSON schema (llama-server).
    pub json_schema: Option<Value>,
}

impl FormatFields {
    /// The constraint these fields ask for, validated, with the field it came from.
    fn spec(&self) -> Result<Option<(Spec, &'static str)>, ApiError> {
        let spec = structured::openai_format(
            self.response_format.as_ref(),
            self.grammar.as_deref(),
            self.json_schema.as_ref(),
        )?;
        Ok(spec.map(|s| {
            let param = if matches!(s, Spec::Gbnf(_)) {
                "grammar"
            } else {
                "response_format"
            };
            (s, param)
        }))
    }
}

/// The sampling fields both OpenAI request kinds share.
#[derive(Deserialize, Debug, Default)]
pub struct SamplingFields {
    /// Temperature.
    pub temperature: Option<f64>,
    /// Top-p.
    pub top_p: Option<f64>,
    /// Top-k (extension).
    pub top_k: Option<i64>,
    /// Min-p (extension).
    pub min_p: Option<f64>,
    /// Presence penalty.
    pub presence_penalty: Option<f64>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f64>,
    /// Repetition penalty (extension).
    pub repetition_penalty: Option<f64>,
    /// Seed.
    pub seed: Option<i64>,
    /// Token id → bias.
    pub logit_bias: Option<Map<String, Value>>,
}

impl SamplingFields {
    /// The settings, validated (a bad value is a 400 naming it).
    fn sampling(&self, l: &Loaded) -> Result<Sampling, ApiError> {
        let sampling = Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_penalty: self.repetition_penalty,
            seed: self.seed,
            logit_bias: match &self.logit_bias {
                Some(m) => fields::logit_bias(m, l.info().n_vocab)?,
                None => Vec::new(),
            },
        };
        sampling.config(0)?;
        Ok(sampling)
    }
}

/// The fields of a completion request that Hearth reads.
#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    /// Echoed back.
    pub model: Option<String>,
    /// A string, a one-string list, or a list of token ids.
    pub prompt: Value,
    /// Stream SSE chunks.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Token budget.
    pub max_tokens: Option<i64>,
    /// Sampling settings.
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Stop strings.
    pub stop: Option<StopField>,
    /// Choices.
    pub n: Option<i64>,
    /// Alternatives per token (0..=5 in OpenAI's legacy API; up to 20 here).
    pub logprobs: Option<i64>,
    /// Structured output.
    #[serde(flatten)]
    pub format: FormatFields,
}

/// The number of choices, 1..=parallel.
fn choices(l: &Loaded, n: Option<i64>) -> Result<usize, ApiError> {
    let parallel = l.info().parallel.max(1);
    match n {
        None => Ok(1),
        Some(n) if n >= 1 && n as u64 <= parallel as u64 => Ok(n as usize),
        Some(n) => Err(ApiError::invalid_param(
            "n",
            format!("`n` must be between 1 and the server's --parallel {parallel}, got {n}"),
        )),
    }
}

fn top_logprobs(v: Option<i64>) -> Result<usize, ApiError> {
    match v {
        None => Ok(0),
        Some(k) if (0..=20).contains(&k) => Ok(k as usize),
        Some(k) => Err(ApiError::invalid_param(
            "top_logprobs",
            format!("`top_logprobs` must be between 0 and 20, got {k}"),
        )),
    }
}

/// Normalizes OpenAI messages for the template: content parts joined into text, tool-call
/// arguments given as JSON strings turned into objects.
fn messages(raw: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    raw.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(mut m) = m else {
                return Err(ApiError::invalid_param("messages", format!("messages[{i}] must be an object")));
            };
            match m.get("role") {
                Some(Value::String(r)) if ["system", "developer", "user", "assistant", "tool"].contains(&r.as_str()) => {
                    if r == "developer" {
                        m.insert("role".into(), "system".into());
                    }
                }
                _ => {
                    return Err(ApiError::invalid_param(
                        "messages",
                        format!("messages[{i}].role must be one of system, developer, user, assistant, tool"),
                    ))
                }
            }
            let text = fields::content_text(m.get("content"))?;
            m.insert("content".into(), Value::String(text));
            if let Some(calls) = m.get_mut("tool_calls") {
                fields::normalize_tool_calls(calls);
            }
            Ok(Value::Object(m))
        })
        .collect()
}

fn finish_str(finish: FinishReason, tool_calls: bool) -> &'static str {
    match finish {
        FinishReason::Length => "length",
        _ if tool_calls => "tool_calls",
        _ => "stop",
    }
}

fn usage(n_prompt: usize, n_gen: usize, n_cached: usize) -> Value {
    json!({
        "prompt_tokens": n_prompt,
        "completion_tokens": n_gen,
        "total_tokens": n_prompt + n_gen,
        "prompt_tokens_details": {"cached_tokens": n_cached},
    })
}

/// One token's entry of OpenAI's `logprobs.content`. The token is spelled by its own piece, not
/// by the text the engine released with it (which is empty while a stop string may be starting).
fn chat_logprob(l: &Loaded, id: u32, lp: &TokenLogprob) -> Value {
    let piece = |id: u32, text: &str| {
        let bytes = l.tok().token_to_piece(id, false).to_vec();
        let t = if text.is_empty() {
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            text.to_string()
        };
        (t, bytes)
    };
    let (t, bytes) = piece(id, "");
    json!({
        "token": t,
        "logprob": lp.logprob,
        "bytes": bytes,
        "top_logprobs": lp.top.iter().map(|(id, s, p)| {
            let (t, bytes) = piece(*id, s);
            json!({"token": t, "logprob": p, "bytes": bytes})
        }).collect::<Vec<_>>(),
    })
}

/// Usage over all choices of a request: the prompt counted once, generated tokens summed.
#[derive(Default, Clone, Copy)]
struct Totals {
    n_prompt: usize,
    n_cached: usize,
    n_gen: usize,
}

impl Totals {
    fn add(&mut self, u: &Usage) {
        self.n_prompt = u.n_prompt;
        self.n_cached = u.n_cached;
        self.n_gen += u.n_gen;
    }

    fn json(&self) -> Value {
        usage(self.n_prompt, self.n_gen, self.n_cached)
    }
}

/// What every chunk or object of one reply repeats.
struct Meta {
    l: Arc<Loaded>,
    id: String,
    object: &'static str,
    created: u64,
    model: String,
}

impl Meta {
    fn new(l: Arc<Loaded>, prefix: &str, object: &'static str, model: Option<String>) -> Meta {
        let model = model.unwrap_or_else(|| l.info().alias.clone());
        Meta {
            l,
            id: fields::new_id(prefix),
            object,
            created: fields::now_secs(),
            model,
        }
    }

    fn object(&self, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id, "object": self.object, "created": self.created, "model": self.model,
            "system_fingerprint": "hearth", "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = fields::parse_body(body)?;
    let l = state.loaded()?;
    let n = choices(&l, req.n)?;
    let max_tokens = match req.max_completion_tokens {
        Some(_) => fields::max_tokens("max_completion_tokens", req.max_completion_tokens)?,
        None => fields::max_tokens("max_tokens", req.max_tokens)?,
    };
    let k = top_logprobs(req.top_logprobs)?;
    let logprobs = req.logprobs.unwrap_or(false).then_some(k);
    let tool_force = structured::openai_tool_force(
        req.tool_choice.as_ref(),
        req.tools.as_deref().unwrap_or(&[]),
    )?;
    let tools = match req.tool_choice.as_ref().and_then(Value::as_str) {
        Some("none") => None,
        _ => req.tools,
    };
    let gen = GenRequest {
        sampling: req.sampling.sampling(&l)?,
        n,
        max_tokens,
        stop: req.stop.map(StopField::into_vec).unwrap_or_default(),
        logprobs,
        format: req.format.spec()?,
        tool_force,
        ..GenRequest::new(PromptInput::Chat {
            messages: messages(req.messages)?,
            tools,
            kwargs: req.chat_template_kwargs.unwrap_or_default(),
        })
    };
    let (replies, _) = pipeline::start(l.clone(), gen).await?;
    let meta = Meta::new(l, "chatcmpl-", "chat.completion", req.model);
    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let render = ChatStream {
            meta: Meta {
                object: "chat.completion.chunk",
                ..meta
            },
            n,
            include_usage,
            want_logprobs: logprobs.is_some(),
            totals: Totals::default(),
        };
        let cfg = state.config().stream;
        return Ok(stream::respond("text/event-stream", render, replies, cfg));
    }
    let wholes = Whole::all(replies).await?;
    let mut totals = Totals::default();
    let choices = wholes
        .iter()
        .enumerate()
        .map(|(i, w)| {
            totals.add(&w.usage);
            chat_choice(&meta.l, i, w, logprobs.is_some())
        })
        .collect();
    Ok(Json(meta.object(choices, Some(totals.json()))).into_response())
}

/// One choice of a whole chat reply.
fn chat_choice(l: &Loaded, i: usize, w: &Whole, want_logprobs: bool) -> Value {
    let has_tools = !w.tool_calls.is_empty();
    let content = if has_tools && w.content.is_empty() {
        Value::Null
    } else {
        Value::String(w.content.clone())
    };
    let mut msg = json!({"role": "assistant", "content": content});
    if let Some(r) = &w.reasoning {
        msg["reasoning_content"] = Value::String(r.clone());
    }
    if has_tools {
        msg["tool_calls"] = w
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    let lp = want_logprobs.then(|| {
        let content: Vec<Value> = w
            .tokens
            .iter()
            .filter_map(|t| t.logprob.as_ref().map(|lp| chat_logprob(l, t.id, lp)))
            .collect();
        json!({ "content": content })
    });
    json!({
        "index": i,
        "message": msg,
        "logprobs": lp,
        "finish_reason": finish_str(w.finish, has_tools),
    })
}

fn delta_json(d: &Delta) -> Option<Value> {
    Some(match d {
        Delta::Content(s) => json!({"content": s}),
        Delta::Reasoning(s) => json!({"reasoning_content": s}),
        Delta::ToolCallStart { index, id, name } => json!({"tool_calls": [{
            "index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}
        }]}),
        Delta::ToolCallArgs { index, fragment } => {
            json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
        }
        Delta::ToolCallEnd { .. } => return None,
    })
}

/// `chat.completion.chunk` frames: a role chunk per choice, then per token its deltas (its
/// log-probabilities on the first of them, or on an empty delta when it released nothing), a
/// finish chunk per choice, the usage chunk when asked for, and `[DONE]`.
struct ChatStream {
    meta: Meta,
    n: usize,
    include_usage: bool,
    want_logprobs: bool,
    totals: Totals,
}

impl ChatStream {
    fn chunk(&self, i: usize, delta: Value, logprobs: Value, finish: Value) -> Value {
        self.meta.object(
            vec![
                json!({"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
            ],
            None,
        )
    }
}

impl Render for ChatStream {
    fn open(&mut self, out: &mut Frames) {
        for i in 0..self.n {
            let role = json!({"role": "assistant", "content": ""});
            out.sse(None, &self.chunk(i, role, Value::Null, Value::Null));
        }
    }

    fn piece(&mut self, i: usize, piece: &Piece, out: &mut Frames) {
        let (deltas, mut lp) = match piece {
            Piece::Token {
                id,
                deltas,
                logprob,
                ..
            } => {
                let lp = logprob
                    .as_ref()
                    .filter(|_| self.want_logprobs)
                    .map(|lp| json!({"content": [chat_logprob(&self.meta.l, *id, lp)]}));
                (deltas, lp)
            }
            Piece::Done(end) => (&end.deltas, None),
            Piece::Error(_) => return,
        };
        let mut sent = false;
        for d in deltas {
            if let Some(dj) = delta_json(d) {
                let lp = lp.take().unwrap_or(Value::Null);
                out.sse(None, &self.chunk(i, dj, lp, Value::Null));
                sent = true;
            }
        }
        if let Some(lp) = lp.filter(|_| !sent) {
            out.sse(None, &self.chunk(i, json!({}), lp, Value::Null));
        }
        if let Piece::Done(end) = piece {
            self.totals.add(&end.usage);
            let finish = finish_str(end.finish, end.tool_calls).into();
            out.sse(None, &self.chunk(i, json!({}), Value::Null, finish));
        }
    }

    fn close(&mut self, out: &mut Frames) {
        if self.include_usage {
            out.sse(
                None,
                &self.meta.object(Vec::new(), Some(self.totals.json())),
            );
        }
        out.raw("data: [DONE]\n\n");
    }

    fn fail(&mut self, err: &ApiError, out: &mut Frames) {
        out.sse(None, &err.body(Api::OpenAi));
    }
}

/// The prompt of a completion request.
fn completion_prompt(p: Value) -> Result<PromptInput, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "prompt",
            "`prompt` must be a string, a list of one string, or a list of token ids",
        )
    };
    match p {
        Value::String(s) => Ok(PromptInput::Text(s)),
        Value::Array(mut a) if a.len() == 1 && a[0].is_string() => match a.pop() {
            Some(Value::String(s)) => Ok(PromptInput::Text(s)),
            _ => Err(bad()),
        },
        Value::Array(a) if a.iter().all(Value::is_number) => {
            let ids = a
                .iter()
                .map(|v| {
                    v.as_u64().ok_or_else(|| {
                        ApiError::invalid_param(
                            "prompt",
                            format!("token id {v} is not a non-negative integer"),
                        )
                    })
                })
                .collect::<Result<Vec<u64>, _>>()?;
            Ok(PromptInput::Ids(ids))
        }
        _ => Err(bad()),
    }
}

fn completion_logprobs(l: &Loaded, tokens: &[TokenOut]) -> Value {
    let mut toks = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offs = Vec::new();
    let mut off = 0usize;
    for t in tokens {
        let Some(lp) = &t.logprob else { continue };
        let piece = String::from_utf8_lossy(l.tok().token_to_piece(t.id, false)).into_owned();
        offs.push(off);
        off += t.text.len();
        toks.push(piece);
        lps.push(lp.logprob);
        let m: Map<String, Value> = lp
            .top
            .iter()
            .map(|(_, s, p)| (s.clone(), json!(p)))
            .collect();
        tops.push(Value::Object(m));
    }
    json!({"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = fields::parse_body(body)?;
    let l = state.loaded()?;
    let n = choices(&l, req.n)?;
    let logprobs = match req.logprobs {
        None => None,
        Some(k) if (0..=20).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("`logprobs` must be between 0 and 20, got {k}"),
            ))
        }
    };
    let gen = GenRequest {
        sampling: req.sampling.sampling(&l)?,
        n,
        max_tokens: fields::max_tokens("max_tokens", req.max_tokens)?,
        stop: req.stop.map(StopField::into_vec).unwrap_or_default(),
        logprobs,
        format: req.format.spec()?,
        parse: false,
        ..GenRequest::new(completion_prompt(req.prompt)?)
    };
    let (replies, _) = pipeline::start(l.clone(), gen).await?;
    let meta = Meta::new(l, "cmpl-", "text_completion", req.model);
    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let render = CompletionStream {
            meta,
            include_usage,
            want_logprobs: logprobs.is_some(),
            totals: Totals::default(),
        };
        let cfg = state.config().stream;
        return Ok(stream::respond("text/event-stream", render, replies, cfg));
    }
    let wholes = Whole::all(replies).await?;
    let mut totals = Totals::default();
    let choices = wholes
        .iter()
        .enumerate()
        .map(|(i, w)| {
            totals.add(&w.usage);
            json!({
                "index": i,
                "text": w.text,
                "logprobs": if logprobs.is_some() { completion_logprobs(&meta.l, &w.tokens) } else { Value::Null },
                "finish_reason": finish_str(w.finish, false),
            })
        })
        .collect();
    Ok(Json(meta.object(choices, Some(totals.json()))).into_response())
}

/// `text_completion` frames: one per token with its text, one per finish, the usage when asked
/// for, and `[DONE]`.
struct CompletionStream {
    meta: Meta,
    include_usage: bool,
    want_logprobs: bool,
    totals: Totals,
}

impl Render for CompletionStream {
    fn piece(&mut self, i: usize, piece: &Piece, out: &mut Frames) {
        let choice = |text: &str, lp: Value, finish: Value| json!({"index": i, "text": text, "logprobs": lp, "finish_reason": finish});
        let frame = match piece {
            Piece::Token {
                id, text, logprob, ..
            } => {
                let lp = match logprob.as_ref().filter(|_| self.want_logprobs) {
                    Some(lp) => completion_logprobs(
                        &self.meta.l,
                        &[TokenOut {
                            id: *id,
                            text: text.clone(),
                            logprob: Some(lp.clone()),
                        }],
                    ),
                    None => Value::Null,
                };
                choice(text, lp, Value::Null)
            }
            Piece::Done(end) => {
                self.totals.add(&end.usage);
                choice(&end.text, Value::Null, finish_str(end.finish, false).into())
            }
            Piece::Error(_) => return,
        };
        let mut obj = self.meta.object(vec![frame], None);
        if let Value::Object(o) = &mut obj {
            o.remove("system_fingerprint");
        }
        out.sse(None, &obj);
    }

    fn close(&mut self, out: &mut Frames) {
        if self.include_usage {
            let mut u = self.meta.object(Vec::new(), Some(self.totals.json()));
            if let Value::Object(o) = &mut u {
                o.remove("system_fingerprint");
            }
            out.sse(None, &u);
        }
        out.raw("data: [DONE]\n\n");
    }

    fn fail(&mut self, err: &ApiError, out: &mut Frames) {
        out.sse(None, &err.body(Api::OpenAi));
    }
}

/// `GET /v1/models`: the one loaded model under its alias.
pub async fn models(State(state): State<AppState>) -> Result<Response, ApiError> {
    let l = state.loaded()?;
    let info = l.info();
    let mut meta = HashMap::new();
    meta.insert("n_ctx", info.n_ctx as u64);
    meta.insert("n_ctx_train", info.n_ctx_train as u64);
    meta.insert("n_vocab", info.n_vocab as u64);
    meta.insert("n_params", info.n_params);
    meta.insert("size", info.file_size);
    Ok(Json(json!({
        "object": "list",
        "data": [{"id": info.alias, "object": "model", "created": state.started(), "owned_by": "hearth", "meta": meta}],
    }))
    .into_response())
}

/// `GET /v1/models/{model}`: the loaded model, whatever name is asked for (one model is served).
pub async fn model(State(state): State<AppState>) -> Result<Response, ApiError> {
    let l = state.loaded()?;
    Ok(Json(json!({"id": l.info().alias, "object": "model", "created": state.started(), "owned_by": "hearth"})).into_response())
}
