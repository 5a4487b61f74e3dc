//! The request fields every wire API shares: bodies parsed (an oversized body is 413, bad JSON 400),
//! sampling parameters and their validation, token budgets, message content as text, stop lists,
//! ids and timestamps.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use hearth_engine::SamplerConfig;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Most tokens a request may ask for; more is refused as out of range rather than taken to mean
/// "until the context ends" (it is almost certainly a mistake, e.g. a negative number cast).
pub const MAX_TOKENS_LIMIT: i64 = 1 << 24;

/// Parses a JSON body, mapping an oversized body to 413 and bad JSON or types to 400.
pub fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| {
        let mut status = r.status();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request body is larger than the server's limit (--max-body)".to_string()
        } else if timed_out(&r) {
            status = StatusCode::REQUEST_TIMEOUT;
            "the request body stalled: nothing arrived within the server's body timeout".to_string()
        } else {
            r.body_text()
        };
        ApiError::new(status, msg)
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::from_json(&e))
}

/// Whether reading the body failed because it stalled past the body timeout.
fn timed_out(r: &BytesRejection) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(r);
    while let Some(c) = cause {
        if c.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = c.source();
    }
    false
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

fn finite_in(name: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(Some(x as f32)),
        Some(x) => Err(ApiError::invalid_param(
            name,
            format!("`{name}` must be between {lo} and {hi}, got {x}"),
        )),
    }
}

impl Sampling {
    /// The validated sampler configuration; `seed_offset` is added to the seed (choice `i` of `n`).
    pub fn config(&self, seed_offset: u64) -> Result<SamplerConfig, ApiError> {
        let mut c = SamplerConfig::default();
        if let Some(t) = finite_in("temperature", self.temperature, 0.0, 100.0)? {
            c.temperature = t;
        }
        if let Some(p) = finite_in("top_p", self.top_p, 0.0, 1.0)? {
            c.top_p = p;
        }
        if let Some(p) = finite_in("min_p", self.min_p, 0.0, 1.0)? {
            c.min_p = p;
        }
        if let Some(p) = finite_in("presence_penalty", self.presence_penalty, -2.0, 2.0)? {
            c.presence_penalty = p;
        }
        if let Some(p) = finite_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0)? {
            c.frequency_penalty = p;
        }
        if let Some(p) = finite_in("repetition_penalty", self.repeat_penalty, 0.0, 100.0)? {
            if p <= 0.0 {
                return Err(ApiError::invalid_param(
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
pub fn logit_bias(map: &Map<String, Value>, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let id: u32 = k
            .parse()
            .ok()
            .filter(|&id: &u32| (id as usize) < n_vocab)
            .ok_or_else(|| {
                ApiError::invalid_param("logit_bias", format!("logit_bias key `{k}` is not a token id below the vocabulary size {n_vocab}"))
            })?;
        let b = v
            .as_f64()
            .filter(|b| b.is_finite() && (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                ApiError::invalid_param(
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

/// Token ids checked against the vocabulary; the first one outside it is a 400 naming `param`.
pub fn token_ids<T>(param: &str, raw: &[T], n_vocab: usize) -> Result<Vec<u32>, ApiError>
where
    T: Copy + std::fmt::Display + TryInto<u32>,
{
    raw.iter()
        .map(|&id| {
            id.try_into()
                .ok()
                .filter(|&i: &u32| (i as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        param,
                        format!("token id {id} is outside the vocabulary (size {n_vocab})"),
                    )
                })
        })
        .collect()
}

/// A validated token budget: `None` when absent (until the end of generation or the context).
pub fn max_tokens(name: &str, v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::invalid_param(
            name,
            format!("`{name}` must be between 1 and {MAX_TOKENS_LIMIT}, got {n}"),
        )),
    }
}

/// Message content as one string: a string, null, or a list of parts whose `text`s are joined.
pub fn content_text(content: Option<&Value>) -> Result<String, ApiError> {
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
                                return Err(ApiError::bad_request("this model accepts text only"));
                            }
                        }
                    },
                    _ => {
                        return Err(ApiError::bad_request(
                            "message content parts must be objects",
                        ))
                    }
                }
            }
            Ok(s)
        }
        Some(_) => Err(ApiError::bad_request(
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
