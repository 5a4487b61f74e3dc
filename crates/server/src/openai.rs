//! OpenAI: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`.
//!
//! Each of `n` choices is its own backend request (seed + i), so they decode side by side. Streamed
//! replies are `chat.completion.chunk` SSE frames ending in `data: [DONE]`; reasoning arrives as
//! `reasoning_content` deltas and tool calls as `tool_calls` deltas (name first, then argument
//! pieces), exactly as the non-streaming reply folds them.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use hearth_engine::{Event, FinishReason, Request, TokenLogprob};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::error::{Api, ApiError};
use crate::gen::{self, ChunkTx, Sampling, StopField};
use crate::parse::{Delta, Parsed, StreamParser};
use crate::state::{AppState, Loaded};
use crate::structured::{self, ToolForce};
use hearth_constrain::{Grammar, Spec};

const API: Api = Api::OpenAi;

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
    /// The constraint these fields ask for, validated.
    fn spec(&self) -> Result<Option<Spec>, ApiError> {
        structured::openai_format(
            self.response_format.as_ref(),
            self.grammar.as_deref(),
            self.json_schema.as_ref(),
        )
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
                Some(m) => gen::logit_bias(API, m, l.info().n_vocab)?,
                None => Vec::new(),
            },
        };
        sampling.config(API, 0)?;
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
            API,
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
            API,
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
                return Err(ApiError::invalid_param(API, "messages", format!("messages[{i}] must be an object")));
            };
            match m.get("role") {
                Some(Value::String(r)) if ["system", "developer", "user", "assistant", "tool"].contains(&r.as_str()) => {
                    if r == "developer" {
                        m.insert("role".into(), "system".into());
                    }
                }
                _ => {
                    return Err(ApiError::invalid_param(
                        API,
                        "messages",
                        format!("messages[{i}].role must be one of system, developer, user, assistant, tool"),
                    ))
                }
            }
            let text = gen::content_text(API, m.get("content"))?;
            m.insert("content".into(), Value::String(text));
            if let Some(calls) = m.get_mut("tool_calls") {
                gen::normalize_tool_calls(calls);
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

/// Everything needed to submit `n` choices of one request.
struct Plan {
    prompt: Vec<u32>,
    max_tokens: Option<usize>,
    sampling: Sampling,
    stop: Vec<String>,
    logprobs: Option<usize>,
    n: usize,
    constraint: Option<Grammar>,
}

fn submit_all(l: &Loaded, plan: &Plan) -> Result<Vec<(UnboundedReceiver<Event>, u64)>, ApiError> {
    (0..plan.n)
        .map(|i| {
            let sampler = plan.sampling.config(API, i as u64)?;
            let seed = sampler.seed;
            let rx = gen::submit(
                l,
                API,
                Request {
                    prompt: plan.prompt.clone(),
                    max_tokens: plan.max_tokens,
                    sampler,
                    stop: plan.stop.clone(),
                    logprobs: plan.logprobs,
                    constraint: plan.constraint.clone(),
                },
            )?;
            Ok((rx, seed))
        })
        .collect()
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = gen::parse_body(API, body)?;
    let l = state.loaded(API)?;
    let n = choices(&l, req.n)?;
    let max_tokens = match req.max_completion_tokens {
        Some(_) => gen::max_tokens(API, "max_completion_tokens", req.max_completion_tokens)?,
        None => gen::max_tokens(API, "max_tokens", req.max_tokens)?,
    };
    let k = top_logprobs(req.top_logprobs)?;
    let logprobs = req.logprobs.unwrap_or(false).then_some(k);
    let sampling = req.sampling.sampling(&l)?;
    let force = structured::openai_tool_force(
        req.tool_choice.as_ref(),
        req.tools.as_deref().unwrap_or(&[]),
    )?;
    let tools = match req.tool_choice.as_ref().and_then(Value::as_str) {
        Some("none") => None,
        _ => req.tools.filter(|t| !t.is_empty()),
    };
    let tool_spec = match force {
        ToolForce::None => None,
        _ => structured::tool_spec(&l, API, tools.as_deref().unwrap_or(&[]), &force)?,
    };
    let spec = structured::one_of(API, req.format.spec()?, tool_spec)?;
    let constraint = spec
        .as_ref()
        .map(|s| structured::compile(&l, API, structured::param_of(s, API), s))
        .transpose()?;
    let mut kwargs = req.chat_template_kwargs.unwrap_or_default();
    if constraint.is_some() {
        kwargs = structured::no_thinking(kwargs);
    }
    let msgs = messages(req.messages)?;
    let prompt = gen::chat_prompt(&l, API, msgs, tools.clone(), kwargs)?;
    let constrained = constraint.is_some();
    let plan = Plan {
        prompt: prompt.ids,
        max_tokens,
        sampling,
        stop: req.stop.map(StopField::into_vec).unwrap_or_default(),
        logprobs,
        n,
        constraint,
    };
    let rxs = submit_all(&l, &plan)?;
    let tools_v = tools.map(Value::Array);
    let model = req.model.unwrap_or_else(|| l.info().alias.clone());
    let id = gen::new_id("chatcmpl-");
    let created = gen::now_secs();
    let parsers: Vec<StreamParser> = rxs
        .iter()
        .map(|(_, seed)| {
            StreamParser::new(gen::parser_config(
                &l,
                tools_v.as_ref(),
                prompt.in_think,
                constrained,
                *seed,
            ))
        })
        .collect();
    let rxs: Vec<_> = rxs.into_iter().map(|(rx, _)| rx).collect();

    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let (tx, resp) = gen::stream_response("text/event-stream");
        tokio::spawn(stream_chat(
            l,
            tx,
            rxs,
            parsers,
            id,
            created,
            model,
            include_usage,
            logprobs.is_some(),
        ));
        return Ok(resp);
    }

    let mut out_choices = Vec::with_capacity(n);
    let (mut np, mut ng, mut nc) = (0, 0, 0);
    for (i, (rx, mut parser)) in rxs.into_iter().zip(parsers).enumerate() {
        let out = gen::collect(API, rx).await?;
        let mut deltas = parser.push(&out.text);
        deltas.extend(parser.finish());
        let parsed = Parsed::from_deltas(deltas);
        np = out.n_prompt;
        nc = out.n_cached;
        ng += out.n_gen;
        let has_tools = !parsed.tool_calls.is_empty();
        let mut msg = json!({"role": "assistant", "content": if has_tools && parsed.content.is_empty() { Value::Null } else { Value::String(parsed.content) }});
        if let Some(r) = parsed.reasoning {
            msg["reasoning_content"] = Value::String(r);
        }
        if has_tools {
            msg["tool_calls"] = parsed
                .tool_calls
                .iter()
                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                .collect();
        }
        let lp = logprobs.map(|_| {
            json!({"content": out.tokens.iter().filter_map(|t| t.logprob.as_ref().map(|lp| chat_logprob(&l, t.id, lp))).collect::<Vec<_>>()})
        });
        out_choices.push(json!({
            "index": i,
            "message": msg,
            "logprobs": lp,
            "finish_reason": finish_str(out.finish, has_tools),
        }));
    }
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": "hearth",
        "choices": out_choices,
        "usage": usage(np, ng, nc),
    }))
    .into_response())
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

#[allow(clippy::too_many_arguments)]
async fn stream_chat(
    l: std::sync::Arc<Loaded>,
    tx: ChunkTx,
    rxs: Vec<UnboundedReceiver<Event>>,
    mut parsers: Vec<StreamParser>,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    want_logprobs: bool,
) {
    let n = rxs.len();
    let chunk = |i: usize, delta: Value, logprobs: Value, finish: Value| {
        json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": "hearth",
            "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        })
    };
    for i in 0..n {
        if !gen::sse(
            &tx,
            None,
            &chunk(
                i,
                json!({"role": "assistant", "content": ""}),
                Value::Null,
                Value::Null,
            ),
        ) {
            return;
        }
    }
    let mut merged = futures::stream::select_all(
        rxs.into_iter()
            .enumerate()
            .map(|(i, rx)| UnboundedReceiverStream::new(rx).map(move |e| (i, e))),
    );
    let mut tool_seen = vec![false; n];
    let mut done = 0;
    let (mut np, mut ng, mut nc) = (0, 0, 0);
    while let Some((i, ev)) = merged.next().await {
        let (deltas, lp, fin) = match ev {
            Event::Token {
                id: tid,
                text,
                logprob,
            } => {
                let lp = logprob
                    .filter(|_| want_logprobs)
                    .map(|lp| json!({"content": [chat_logprob(&l, tid, &lp)]}));
                (parsers[i].push(&text), lp, None)
            }
            Event::Done {
                finish,
                text,
                n_prompt,
                n_cached,
                n_gen,
            } => {
                let mut d = parsers[i].push(&text);
                d.extend(parsers[i].finish());
                np = n_prompt;
                nc = n_cached;
                ng += n_gen;
                (d, None, Some(finish))
            }
            Event::Error(e) => {
                let err = ApiError::internal(API, e);
                let _ = gen::sse(&tx, None, &err.body());
                return;
            }
        };
        let mut lp = lp;
        let mut sent_any = false;
        for d in &deltas {
            if matches!(d, Delta::ToolCallStart { .. }) {
                tool_seen[i] = true;
            }
            if let Some(dj) = delta_json(d) {
                if !gen::sse(
                    &tx,
                    None,
                    &chunk(i, dj, lp.take().unwrap_or(Value::Null), Value::Null),
                ) {
                    return;
                }
                sent_any = true;
            }
        }
        if let Some(lp) = lp.filter(|_| !sent_any) {
            if !gen::sse(&tx, None, &chunk(i, json!({}), lp, Value::Null)) {
                return;
            }
        }
        if let Some(f) = fin {
            if !gen::sse(
                &tx,
                None,
                &chunk(
                    i,
                    json!({}),
                    Value::Null,
                    finish_str(f, tool_seen[i]).into(),
                ),
            ) {
                return;
            }
            done += 1;
            if done == n {
                break;
            }
        }
    }
    if include_usage {
        let u = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": "hearth", "choices": [], "usage": usage(np, ng, nc),
        });
        if !gen::sse(&tx, None, &u) {
            return;
        }
    }
    let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
}

/// The prompt of a completion request as token ids.
fn completion_prompt(l: &Loaded, p: &Value) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            API,
            "prompt",
            "`prompt` must be a string, a list of one string, or a list of token ids",
        )
    };
    match p {
        Value::String(s) => gen::raw_prompt(l, API, s),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            gen::raw_prompt(l, API, a[0].as_str().unwrap_or(""))
        }
        Value::Array(a) if a.iter().all(Value::is_number) => {
            let n_vocab = l.info().n_vocab;
            let ids = a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .filter(|&id| id < n_vocab as u64)
                        .map(|id| id as u32)
                        .ok_or_else(|| {
                            ApiError::invalid_param(
                                API,
                                "prompt",
                                format!("token id {v} is not below the vocabulary size {n_vocab}"),
                            )
                        })
                })
                .collect::<Result<Vec<u32>, _>>()?;
            gen::check_prompt(l, API, &ids)?;
            Ok(ids)
        }
        _ => Err(bad()),
    }
}

fn completion_logprobs(l: &Loaded, tokens: &[gen::Token]) -> Value {
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
    let req: CompletionRequest = gen::parse_body(API, body)?;
    let l = state.loaded(API)?;
    let n = choices(&l, req.n)?;
    let max_tokens = gen::max_tokens(API, "max_tokens", req.max_tokens)?;
    let logprobs = match req.logprobs {
        None => None,
        Some(k) if (0..=20).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid_param(
                API,
                "logprobs",
                format!("`logprobs` must be between 0 and 20, got {k}"),
            ))
        }
    };
    let sampling = req.sampling.sampling(&l)?;
    let constraint = req
        .format
        .spec()?
        .map(|s| structured::compile(&l, API, structured::param_of(&s, API), &s))
        .transpose()?;
    let plan = Plan {
        prompt: completion_prompt(&l, &req.prompt)?,
        max_tokens,
        sampling,
        stop: req.stop.map(StopField::into_vec).unwrap_or_default(),
        logprobs,
        n,
        constraint,
    };
    let rxs: Vec<_> = submit_all(&l, &plan)?
        .into_iter()
        .map(|(rx, _)| rx)
        .collect();
    let model = req.model.unwrap_or_else(|| l.info().alias.clone());
    let id = gen::new_id("cmpl-");
    let created = gen::now_secs();
    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let (tx, resp) = gen::stream_response("text/event-stream");
        tokio::spawn(async move {
            let chunk = |i: usize, text: &str, lp: Value, finish: Value| {
                json!({"id": id, "object": "text_completion", "created": created, "model": model,
                       "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}]})
            };
            let mut merged = futures::stream::select_all(
                rxs.into_iter()
                    .enumerate()
                    .map(|(i, rx)| UnboundedReceiverStream::new(rx).map(move |e| (i, e))),
            );
            let (mut done, mut np, mut ng, mut nc) = (0, 0, 0, 0);
            while let Some((i, ev)) = merged.next().await {
                let ok = match ev {
                    Event::Token {
                        id: tid,
                        text,
                        logprob,
                    } => {
                        let lp = match logprob.filter(|_| logprobs.is_some()) {
                            Some(lp) => completion_logprobs(
                                &l,
                                &[gen::Token {
                                    id: tid,
                                    text: text.clone(),
                                    logprob: Some(lp),
                                }],
                            ),
                            None => Value::Null,
                        };
                        gen::sse(&tx, None, &chunk(i, &text, lp, Value::Null))
                    }
                    Event::Done {
                        finish,
                        text,
                        n_prompt,
                        n_cached,
                        n_gen,
                    } => {
                        np = n_prompt;
                        nc = n_cached;
                        ng += n_gen;
                        done += 1;
                        gen::sse(
                            &tx,
                            None,
                            &chunk(i, &text, Value::Null, finish_str(finish, false).into()),
                        )
                    }
                    Event::Error(e) => {
                        let _ = gen::sse(&tx, None, &ApiError::internal(API, e).body());
                        return;
                    }
                };
                if !ok {
                    return;
                }
                if done == n {
                    break;
                }
            }
            if include_usage {
                let u = json!({"id": id, "object": "text_completion", "created": created, "model": model,
                               "choices": [], "usage": usage(np, ng, nc)});
                if !gen::sse(&tx, None, &u) {
                    return;
                }
            }
            let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
        });
        return Ok(resp);
    }
    let mut out_choices = Vec::new();
    let (mut np, mut ng, mut nc) = (0, 0, 0);
    for (i, rx) in rxs.into_iter().enumerate() {
        let out = gen::collect(API, rx).await?;
        np = out.n_prompt;
        nc = out.n_cached;
        ng += out.n_gen;
        out_choices.push(json!({
            "index": i,
            "text": out.text,
            "logprobs": if logprobs.is_some() { completion_logprobs(&l, &out.tokens) } else { Value::Null },
            "finish_reason": finish_str(out.finish, false),
        }));
    }
    Ok(Json(json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "system_fingerprint": "hearth",
        "choices": out_choices, "usage": usage(np, ng, nc),
    }))
    .into_response())
}

/// `GET /v1/models`: the one loaded model under its alias.
pub async fn models(State(state): State<AppState>) -> Result<Response, ApiError> {
    let l = state.loaded(API)?;
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
    let l = state.loaded(API)?;
    Ok(Json(json!({"id": l.info().alias, "object": "model", "created": state.started(), "owned_by": "hearth"})).into_response())
}
