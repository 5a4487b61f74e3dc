//! What every generating endpoint shares: request bodies parsed into per-API errors, chat prompts
//! through the template, sampling parameters and their validation, submission to the backend with
//! its sink bridged to tokio, collecting a whole reply, and writing streamed bodies.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_engine::{Event, FinishReason, Request, SamplerConfig, TokenLogprob};
use hearth_tokenizer::template::ChatInput;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::error::{Api, ApiError};
use crate::parse::{prompt_opens_reasoning, tool_schemas_from_request, ParserConfig, ToolFormat};
use crate::state::Loaded;

/// Most tokens a request may ask for; more is refused as out of range rather than taken to mean
/// "until the context ends" (it is almost certainly a mistake, e.g. a negative number cast).
pub const MAX_TOKENS_LIMIT: i64 = 1 << 24;

/// Parses a JSON body, mapping an oversized body to 413 and bad JSON or types to 400 in `api`'s shape.
pub fn parse_body<T: DeserializeOwned>(
    api: Api,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| {
        let status = r.status();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request body is larger than the server's limit (--max-body)".to_string()
        } else {
            r.body_text()
        };
        ApiError::new(api, status, msg)
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::from_json(api, &e))
}

/// Unix seconds now.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh id: `prefix` and 24 hex digits from the clock and a counter.
pub fn new_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}{:016x}{:08x}", t, n as u32)
}

/// Sampling settings as requests spell them, before validation.
#[derive(Default, Debug, Clone)]
pub struct Sampling {
    /// Temperature (≥ 0).
    pub temperature: Option<f64>,
    /// Top-p in [0, 1].
    pub top_p: Option<f64>,
    /// Top-k (≥ 0).
    pub top_k: Option<i64>,
    /// Min-p in [0, 1].
    pub min_p: Option<f64>,
    /// OpenAI presence penalty in [-2, 2].
    pub presence_penalty: Option<f64>,
    /// OpenAI frequency penalty in [-2, 2].
    pub frequency_penalty: Option<f64>,
    /// llama.cpp repetition penalty (> 0).
    pub repeat_penalty: Option<f64>,
    /// Seed.
    pub seed: Option<i64>,
    /// Token id → bias.
    pub logit_bias: Vec<(u32, f32)>,
}

fn finite_in(
    api: Api,
    name: &str,
    v: Option<f64>,
    lo: f64,
    hi: f64,
) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(Some(x as f32)),
        Some(x) => Err(ApiError::invalid_param(
            api,
            name,
            format!("`{name}` must be between {lo} and {hi}, got {x}"),
        )),
    }
}

impl Sampling {
    /// The validated sampler configuration; `seed_offset` is added to the seed (choice `i` of `n`).
    pub fn config(&self, api: Api, seed_offset: u64) -> Result<SamplerConfig, ApiError> {
        let mut c = SamplerConfig::default();
        if let Some(t) = finite_in(api, "temperature", self.temperature, 0.0, 100.0)? {
            c.temperature = t;
        }
        if let Some(p) = finite_in(api, "top_p", self.top_p, 0.0, 1.0)? {
            c.top_p = p;
        }
        if let Some(p) = finite_in(api, "min_p", self.min_p, 0.0, 1.0)? {
            c.min_p = p;
        }
        if let Some(p) = finite_in(api, "presence_penalty", self.presence_penalty, -2.0, 2.0)? {
            c.presence_penalty = p;
        }
        if let Some(p) = finite_in(api, "frequency_penalty", self.frequency_penalty, -2.0, 2.0)? {
            c.frequency_penalty = p;
        }
        if let Some(p) = finite_in(api, "repetition_penalty", self.repeat_penalty, 0.0, 100.0)? {
            if p <= 0.0 {
                return Err(ApiError::invalid_param(
                    api,
                    "repetition_penalty",
                    "`repetition_penalty` must be > 0",
                ));
            }
            c.repeat_penalty = p;
        }
        match self.top_k {
            None => {}
            Some(k) if k >= 0 => c.top_k = usize::try_from(k).unwrap_or(usize::MAX),
            Some(k) => {
                return Err(ApiError::invalid_param(
                    api,
                    "top_k",
                    format!("`top_k` must be >= 0, got {k}"),
                ))
            }
        }
        c.seed = match self.seed {
            Some(s) => (s as u64).wrapping_add(seed_offset),
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                .wrapping_add(seed_offset),
        };
        c.logit_bias = self.logit_bias.clone();
        Ok(c)
    }
}

/// OpenAI-style `logit_bias` (`{"token id": bias}`), ids checked against the vocabulary.
pub fn logit_bias(
    api: Api,
    map: &Map<String, Value>,
    n_vocab: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let id: u32 = k
            .parse()
            .ok()
            .filter(|&id: &u32| (id as usize) < n_vocab)
            .ok_or_else(|| {
                ApiError::invalid_param(api, "logit_bias", format!("logit_bias key `{k}` is not a token id below the vocabulary size {n_vocab}"))
            })?;
        let b = v
            .as_f64()
            .filter(|b| b.is_finite() && (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                ApiError::invalid_param(
                    api,
                    "logit_bias",
                    format!("logit_bias for {k} must be a number in [-100, 100]"),
                )
            })?;
        // OpenAI: -100 bans the token.
        out.push((
            id,
            if b <= -100.0 {
                f32::NEG_INFINITY
            } else {
                b as f32
            },
        ));
    }
    Ok(out)
}

/// A validated token budget: `None` when absent (until the end of generation or the context).
pub fn max_tokens(api: Api, name: &str, v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::invalid_param(
            api,
            name,
            format!("`{name}` must be between 1 and {MAX_TOKENS_LIMIT}, got {n}"),
        )),
    }
}

/// Message content as one string: a string, null, or a list of parts whose `text`s are joined.
pub fn content_text(api: Api, content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for p in parts {
                match p {
                    Value::String(t) => s.push_str(t),
                    Value::Object(o) => match o.get("text") {
                        Some(Value::String(t)) => s.push_str(t),
                        _ => {
                            if let Some("image_url" | "image" | "input_audio" | "document") =
                                o.get("type").and_then(Value::as_str)
                            {
                                return Err(ApiError::bad_request(
                                    api,
                                    "this model accepts text only",
                                ));
                            }
                        }
                    },
                    _ => {
                        return Err(ApiError::bad_request(
                            api,
                            "message content parts must be objects",
                        ))
                    }
                }
            }
            Ok(s)
        }
        Some(_) => Err(ApiError::bad_request(
            api,
            "message content must be a string or a list of parts",
        )),
    }
}

/// Normalizes an assistant message's `tool_calls` so every template can read them: `arguments`
/// given as a JSON string becomes the object (Qwen3-Coder's template iterates over it).
pub fn normalize_tool_calls(calls: &mut Value) {
    if let Value::Array(list) = calls {
        for c in list {
            if let Some(f) = c.get_mut("function") {
                if let Some(Value::String(s)) = f.get("arguments") {
                    if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
                        f["arguments"] = v;
                    }
                }
            }
        }
    }
}

/// A rendered and tokenized chat prompt.
pub struct Prompt {
    /// Token ids.
    pub ids: Vec<u32>,
    /// The template opened `<think>` at the end, so the reply starts inside reasoning.
    pub in_think: bool,
}

/// Renders `messages` through the chat template and tokenizes them.
pub fn chat_prompt(
    l: &Loaded,
    api: Api,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    kwargs: Map<String, Value>,
) -> Result<Prompt, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            api,
            "messages",
            "`messages` must not be empty",
        ));
    }
    let tok = l.tok();
    let text = |id: Option<u32>| {
        id.map(|i| tok.token_text(i).to_string())
            .unwrap_or_default()
    };
    let input = ChatInput {
        messages,
        tools,
        add_generation_prompt: true,
        kwargs,
        bos_token: text(tok.bos_id()),
        eos_token: text(tok.eos_id()),
    };
    let rendered = l
        .encoder
        .render(&l.template, &input)
        .map_err(|e| ApiError::bad_request(api, e.to_string()))?;
    let ids = l.encoder.encode(tok, &rendered);
    check_prompt(l, api, &ids)?;
    Ok(Prompt {
        ids,
        in_think: prompt_opens_reasoning(&rendered),
    })
}

/// A raw prompt (completions, Ollama `raw`): special tokens written in it are parsed, BOS added as
/// the model asks, as llama-server does.
pub fn raw_prompt(l: &Loaded, api: Api, text: &str) -> Result<Vec<u32>, ApiError> {
    let tok = l.tok();
    let ids = tok.encode_with_specials(text, tok.add_bos(), true);
    check_prompt(l, api, &ids)?;
    Ok(ids)
}

/// Refuses an empty prompt or one that leaves no room to generate, naming both sizes.
pub fn check_prompt(l: &Loaded, api: Api, ids: &[u32]) -> Result<(), ApiError> {
    let n_ctx = l.info().n_ctx;
    if ids.is_empty() {
        return Err(ApiError::bad_request(api, "the prompt is empty"));
    }
    if ids.len() >= n_ctx {
        return Err(ApiError::bad_request(
            api,
            format!(
                "the prompt has {} tokens but the context per sequence is {} tokens",
                ids.len(),
                n_ctx
            ),
        ));
    }
    Ok(())
}

/// The parser configuration for a reply. A constrained reply (`constrained`) is read without
/// reasoning: its grammar applies from the first token, so all of it is the answer.
pub fn parser_config(
    l: &Loaded,
    tools: Option<&Value>,
    in_think: bool,
    constrained: bool,
    seed: u64,
) -> ParserConfig {
    let has_tools = tools.is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()));
    ParserConfig {
        tools: if has_tools {
            l.tool_format
        } else {
            ToolFormat::None
        },
        reasoning: !constrained,
        starts_in_reasoning: in_think && !constrained,
        tool_schemas: tools.map(tool_schemas_from_request).unwrap_or_default(),
        id_seed: seed,
    }
}

/// Submits `req`; its events arrive on the returned receiver. When the receiver is dropped (the
/// client went away) the next event fails to send and the backend cancels the request.
pub fn submit(l: &Loaded, api: Api, req: Request) -> Result<UnboundedReceiver<Event>, ApiError> {
    let (tx, rx) = unbounded_channel();
    let sink: hearth_engine::Sink = Box::new(move |ev| tx.send(ev).is_ok());
    l.backend
        .submit(req, sink)
        .map_err(|e| ApiError::from_submit(api, e))?;
    Ok(rx)
}

/// One generated token as collected.
#[derive(Clone, Debug)]
pub struct Token {
    /// Id.
    pub id: u32,
    /// Text released with it.
    pub text: String,
    /// Log-probabilities, when asked for.
    pub logprob: Option<TokenLogprob>,
}

/// A whole reply.
#[derive(Clone, Debug)]
pub struct Output {
    /// The text (stop strings excluded).
    pub text: String,
    /// The tokens in order.
    pub tokens: Vec<Token>,
    /// Why it ended.
    pub finish: FinishReason,
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Prompt tokens from the prefix cache.
    pub n_cached: usize,
    /// Generated tokens.
    pub n_gen: usize,
}

/// Waits for the whole reply.
pub async fn collect(api: Api, mut rx: UnboundedReceiver<Event>) -> Result<Output, ApiError> {
    let mut out = Output {
        text: String::new(),
        tokens: Vec::new(),
        finish: FinishReason::Stop,
        n_prompt: 0,
        n_cached: 0,
        n_gen: 0,
    };
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token { id, text, logprob } => {
                out.text.push_str(&text);
                out.tokens.push(Token { id, text, logprob });
            }
            Event::Done {
                finish,
                text,
                n_prompt,
                n_cached,
                n_gen,
            } => {
                out.text.push_str(&text);
                out.finish = finish;
                out.n_prompt = n_prompt;
                out.n_cached = n_cached;
                out.n_gen = n_gen;
                return Ok(out);
            }
            Event::Error(e) => return Err(ApiError::internal(api, e)),
        }
    }
    Err(ApiError::internal(api, "the backend dropped the request"))
}

/// The stop string that ended a reply, found in the text the tokens decode to past what was
/// released (the engine does not emit the stop string itself).
pub fn matched_stop(l: &Loaded, out: &Output, stops: &[String]) -> Option<String> {
    if out.finish != FinishReason::Stop || stops.is_empty() {
        return None;
    }
    let ids: Vec<u32> = out.tokens.iter().map(|t| t.id).collect();
    if ids.last().is_some_and(|&id| l.tok().is_eog(id)) {
        return None;
    }
    let full = l.tok().decode(&ids, false);
    let tail = full.get(out.text.len()..).unwrap_or("");
    stops
        .iter()
        .filter_map(|s| tail.find(s.as_str()).map(|p| (p, s)))
        .min_by_key(|(p, _)| *p)
        .map(|(_, s)| s.clone())
}

/// A stop list given as a string or a list of strings.
#[derive(serde::Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum StopField {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl StopField {
    /// As a list without empty strings.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect()
    }
}

/// The sending half of a streamed body.
pub type ChunkTx = UnboundedSender<Result<Bytes, Infallible>>;

/// A streamed response with `content_type`, and the sender its frames are written to. The body
/// ends when the sender is dropped; a failed send means the client is gone.
pub fn stream_response(content_type: &'static str) -> (ChunkTx, Response) {
    let (tx, rx) = unbounded_channel::<Result<Bytes, Infallible>>();
    let body = Body::from_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    let resp = (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response();
    (tx, resp)
}

/// Writes an SSE frame `data: {json}` (with an `event:` line when given); false when the client is gone.
pub fn sse(tx: &ChunkTx, event: Option<&str>, data: &Value) -> bool {
    let mut s = String::new();
    if let Some(e) = event {
        s.push_str("event: ");
        s.push_str(e);
        s.push('\n');
    }
    s.push_str("data: ");
    s.push_str(&data.to_string());
    s.push_str("\n\n");
    tx.send(Ok(Bytes::from(s))).is_ok()
}

/// Writes one NDJSON line; false when the client is gone.
pub fn ndjson(tx: &ChunkTx, data: &Value) -> bool {
    let mut s = data.to_string();
    s.push('\n');
    tx.send(Ok(Bytes::from(s))).is_ok()
}
