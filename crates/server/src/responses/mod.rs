//! OpenAI Responses: `POST /v1/responses`, `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}`,
//! as Codex and the OpenAI SDKs send them.
//!
//! The request becomes the template messages every other API renders:
//! - `input` is a string (one user message) or items: `message` (roles `system`, `developer`,
//!   `user`, `assistant`; `input_text` / `output_text` parts, joined with a blank line; a developer
//!   message is a system message), `function_call` (joined to the assistant turn before it),
//!   `function_call_output` (a `tool` message), `reasoning` (the next assistant turn's
//!   `reasoning_content`). `instructions` is a system message before them; as in OpenAI's API, a
//!   follow-up does not inherit the instructions of the response it continues.
//! - `tools`: `function` tools, flat as the Responses API spells them. Other tool types (Codex always
//!   sends `web_search` and a `namespace` of sub-agent tools) are not offered to the model, with a
//!   warning once per type.
//! - `tool_choice` (`auto`, `none`, `required`, a function, `allowed_tools`), `max_output_tokens`,
//!   `temperature`, `top_p`, `text.format` (the structured-output engine), `reasoning` (thinking on,
//!   or off for effort `none` / `minimal`; absent: the template's default).
//! - `store` (default true) keeps the response in a bounded in-memory store; `previous_response_id`
//!   continues a stored one, and an unknown id is a 400.
//!
//! Fields Hearth has no use for (`include`, `prompt_cache_key`, `client_metadata`, `truncation`,
//! `service_tier`, `user`, ...) are ignored. The reply is rendered by [`render`]: streamed as the
//! Responses event sequence, whole as the same response object.

pub mod render;
pub mod store;

use std::collections::HashSet;
use std::sync::Mutex;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::fields::{self, Sampling};
use crate::pipeline::{self, GenRequest, Piece, PromptInput};
use crate::state::AppState;
use crate::stream::{self, Frames, Render};
use crate::structured;
use render::{ResponseRender, StoreTo};

/// `text`.
#[derive(Deserialize, Debug, Default)]
pub struct TextField {
    /// `{"type": "text" | "json_object" | "json_schema", "schema", ...}`.
    pub format: Option<Value>,
}

/// The fields of a Responses request that Hearth reads (others are ignored).
#[derive(Deserialize, Debug)]
pub struct ResponsesRequest {
    /// Echoed back.
    pub model: Option<String>,
    /// A string or a list of items.
    pub input: Option<Value>,
    /// A system message before the input.
    pub instructions: Option<String>,
    /// Tool definitions.
    pub tools: Option<Vec<Value>>,
    /// Which tools the model may or must call.
    pub tool_choice: Option<Value>,
    /// Echoed back (Hearth does not limit the calls of a reply).
    pub parallel_tool_calls: Option<bool>,
    /// Token budget.
    pub max_output_tokens: Option<i64>,
    /// Temperature.
    pub temperature: Option<f64>,
    /// Top-p.
    pub top_p: Option<f64>,
    /// Output format.
    pub text: Option<TextField>,
    /// `{"effort", "summary"}`.
    pub reasoning: Option<Value>,
    /// Keep the response for `previous_response_id` (default true).
    pub store: Option<bool>,
    /// The stored response this one continues.
    pub previous_response_id: Option<String>,
    /// Stream events.
    pub stream: Option<bool>,
    /// Echoed back.
    pub metadata: Option<Value>,
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ResponsesRequest = fields::parse_body(body)?;
    let l = state.loaded()?;
    let mut conversation = match &req.previous_response_id {
        None => Vec::new(),
        Some(id) => state
            .responses()
            .get(id)
            .map(|s| s.messages)
            .ok_or_else(|| {
                ApiError::invalid_param(
                    "previous_response_id",
                    format!(
                    "no stored response `{id}`: responses are kept in memory (with `store: true`), \
                     the oldest dropped first, and lost when the server restarts"
                ),
                )
            })?,
    };
    conversation.extend(to_messages(req.input.as_ref().unwrap_or(&Value::Null))?);
    if conversation.is_empty() {
        return Err(ApiError::invalid_param("input", "`input` is required"));
    }
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = req.instructions.as_deref().filter(|i| !i.is_empty()) {
        messages.push(json!({"role": "system", "content": i}));
    }
    messages.extend(conversation.iter().cloned());
    let (tools, choice) = tools_and_choice(req.tools.as_deref(), req.tool_choice.as_ref())?;
    let tool_force = structured::openai_tool_force(choice.as_ref(), &tools)?;
    let offered = match choice.as_ref().and_then(Value::as_str) {
        Some("none") => None,
        _ => Some(tools).filter(|t| !t.is_empty()),
    };
    let format = req.text.as_ref().and_then(|t| t.format.as_ref());
    let format = structured::openai_format(format, None, None)?.map(|s| (s, "text.format"));
    let gen = GenRequest {
        thinking: thinking(req.reasoning.as_ref())?,
        sampling: Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            ..Sampling::default()
        },
        max_tokens: fields::max_tokens("max_output_tokens", req.max_output_tokens)?,
        format,
        tool_force,
        ..GenRequest::new(PromptInput::Chat {
            messages,
            tools: offered,
            kwargs: Map::new(),
        })
    };
    let (mut replies, _) = pipeline::start(l.clone(), gen).await?;
    let model = req.model.clone().unwrap_or_else(|| l.info().alias.clone());
    let store = req.store.unwrap_or(true).then(|| StoreTo {
        store: state.responses().clone(),
        messages: conversation,
    });
    let mut render = ResponseRender::new(base_object(&req, &model), store);
    if req.stream.unwrap_or(false) {
        let cfg = state.config().stream;
        return Ok(stream::respond("text/event-stream", render, replies, cfg));
    }
    let mut reply = replies
        .pop()
        .ok_or_else(|| ApiError::internal("no reply"))?;
    render.open(&mut Frames::default());
    while let Some(piece) = reply.next().await {
        if let Piece::Error(e) = piece {
            return Err(ApiError::internal(e));
        }
        render.piece(0, &piece, &mut Frames::default());
    }
    let v = render
        .finished
        .take()
        .ok_or_else(|| ApiError::internal("the backend dropped the request"))?;
    Ok(Json(v).into_response())
}

/// `GET /v1/responses/{id}`: a stored response.
pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match state.responses().get(&id) {
        Some(s) => Ok(Json(s.response).into_response()),
        None => Err(ApiError::not_found(format!("no stored response `{id}`"))),
    }
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if state.responses().remove(&id) {
        Ok(Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
    } else {
        Err(ApiError::not_found(format!("no stored response `{id}`")))
    }
}

/// The response object's fixed fields: the id, the model and the request fields it echoes.
fn base_object(req: &ResponsesRequest, model: &str) -> Value {
    let reasoning = req.reasoning.as_ref();
    json!({
        "id": fields::new_id("resp_"),
        "object": "response",
        "created_at": fields::now_secs(),
        "status": "in_progress",
        "error": null,
        "incomplete_details": null,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "previous_response_id": req.previous_response_id,
        "reasoning": {
            "effort": reasoning.and_then(|r| r.get("effort")).cloned().unwrap_or(Value::Null),
            "summary": reasoning.and_then(|r| r.get("summary")).cloned().unwrap_or(Value::Null),
        },
        "store": req.store.unwrap_or(true),
        "temperature": req.temperature,
        "text": {"format": req.text.as_ref().and_then(|t| t.format.clone()).unwrap_or_else(|| json!({"type": "text"}))},
        "tool_choice": req.tool_choice.clone().unwrap_or_else(|| "auto".into()),
        "tools": req.tools.clone().unwrap_or_default(),
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": null,
        "metadata": req.metadata.clone().unwrap_or_else(|| json!({})),
    })
}

/// The thinking switch of `reasoning`: on unless its effort is `none` or `minimal`.
fn thinking(reasoning: Option<&Value>) -> Result<Option<bool>, ApiError> {
    let Some(r) = reasoning.filter(|r| !r.is_null()) else {
        return Ok(None);
    };
    match r.get("effort").and_then(|e| (!e.is_null()).then_some(e)) {
        None => Ok(Some(true)),
        Some(Value::String(e)) => match e.as_str() {
            "none" | "minimal" => Ok(Some(false)),
            "low" | "medium" | "high" | "xhigh" => Ok(Some(true)),
            other => Err(ApiError::invalid_param(
                "reasoning.effort",
                format!("`reasoning.effort` must be none, minimal, low, medium, high or xhigh, got `{other}`"),
            )),
        },
        Some(_) => Err(ApiError::invalid_param(
            "reasoning.effort",
            "`reasoning.effort` must be a string",
        )),
    }
}

/// Warns once per process for each tool type that is not offered to the model.
fn warn_skipped(kind: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(kind.to_string())
    {
        tracing::warn!(
            "not offering `{kind}` tools to the model: Hearth serves function tools only \
             (said once per tool type)"
        );
    }
}

/// The function tools as templates read them (`{"type": "function", "function": {..}}`), and the
/// tool choice in chat-completions shape. `allowed_tools` narrows the tools offered.
fn tools_and_choice(
    tools: Option<&[Value]>,
    choice: Option<&Value>,
) -> Result<(Vec<Value>, Option<Value>), ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.unwrap_or(&[]).iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid_param("tools", format!("tools[{i}].name is required"))
                })?;
                let mut f = json!({
                    "name": name,
                    "description": t.get("description").cloned().unwrap_or_else(|| "".into()),
                    "parameters": t.get("parameters").filter(|p| !p.is_null()).cloned()
                        .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                });
                if let Some(s) = t.get("strict").filter(|s| s.is_boolean()) {
                    f["strict"] = s.clone();
                }
                out.push(json!({"type": "function", "function": f}));
            }
            Some(other) => warn_skipped(other),
            None => {
                return Err(ApiError::invalid_param(
                    "tools",
                    format!("tools[{i}].type is required"),
                ))
            }
        }
    }
    let bad = |m: &str| ApiError::invalid_param("tool_choice", m.to_string());
    let choice = match choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(Value::String(s.clone())),
        Some(Value::Object(o)) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = o
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("`tool_choice.name` is required"))?;
                Some(json!({"type": "function", "function": {"name": name}}))
            }
            Some("allowed_tools") => {
                let names: HashSet<&str> = o
                    .get("tools")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|t| t.get("name").and_then(Value::as_str))
                            .collect()
                    })
                    .unwrap_or_default();
                out.retain(|t| names.contains(t["function"]["name"].as_str().unwrap_or("")));
                match o.get("mode").and_then(Value::as_str).unwrap_or("auto") {
                    m @ ("auto" | "required") => Some(Value::String(m.into())),
                    _ => return Err(bad("`tool_choice.mode` must be auto or required")),
                }
            }
            _ => {
                return Err(bad(
                    "`tool_choice` must be none, auto, required, a function or allowed_tools: \
                     Hearth serves function tools only",
                ))
            }
        },
        Some(_) => return Err(bad("`tool_choice` must be a string or an object")),
    };
    Ok((out, choice))
}

/// The text of a content value: a string, or parts whose texts are joined with a blank line.
fn content_text(content: Option<&Value>, where_: &str) -> Result<String, ApiError> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Array(p)) => p,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "input",
                format!("{where_}: must be a string or a list of parts"),
            ))
        }
    };
    let mut texts = Vec::new();
    for p in parts {
        match p.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
                texts.push(p.get("text").and_then(Value::as_str).unwrap_or(""))
            }
            Some("refusal") => texts.push(p.get("refusal").and_then(Value::as_str).unwrap_or("")),
            Some(t @ ("input_image" | "input_file" | "input_audio")) => {
                return Err(ApiError::invalid_param(
                    "input",
                    format!(
                        "{where_}: `{t}` parts are not supported: this model accepts text only"
                    ),
                ))
            }
            other => tracing::warn!(
                "ignoring a `{}` part in {where_}: Hearth does not read it",
                other.unwrap_or("untyped")
            ),
        }
    }
    Ok(texts.join("\n\n"))
}

/// Converts Responses input (a string or items) to template messages.
pub fn to_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::Null => return Ok(Vec::new()),
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::invalid_param(
                "input",
                "`input` must be a string or a list of items",
            ))
        }
    };
    let mut out: Vec<Value> = Vec::new();
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let where_ = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .or_else(|| item.get("role").map(|_| "message"));
        match kind {
            Some("message") => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer" | "system") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    _ => {
                        return Err(ApiError::invalid_param(
                            "input",
                            format!("{where_}.role must be one of system, developer, user, assistant"),
                        ))
                    }
                };
                let text = content_text(item.get("content"), &format!("{where_}.content"))?;
                let mut m = json!({"role": role, "content": text});
                if role == "assistant" {
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = r.into();
                    }
                }
                out.push(m);
            }
            Some("function_call") => {
                let field = |k: &str| item.get(k).and_then(Value::as_str);
                let (Some(name), Some(call_id)) = (field("name"), field("call_id")) else {
                    return Err(ApiError::invalid_param(
                        "input",
                        format!("{where_}: a function_call needs `name` and `call_id`"),
                    ));
                };
                let call = json!({"id": call_id, "type": "function", "function": {
                    "name": name, "arguments": field("arguments").unwrap_or("{}"),
                }});
                let joins = out
                    .last()
                    .is_some_and(|m| m["role"] == "assistant" && reasoning.is_none());
                if !joins {
                    let mut m = json!({"role": "assistant", "content": ""});
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = r.into();
                    }
                    out.push(m);
                }
                if let Some(Value::Object(m)) = out.last_mut() {
                    match m.get_mut("tool_calls") {
                        Some(Value::Array(calls)) => calls.push(call),
                        _ => {
                            m.insert("tool_calls".into(), Value::Array(vec![call]));
                        }
                    }
                }
            }
            Some("function_call_output") => {
                let output = content_text(item.get("output"), &format!("{where_}.output"))?;
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": item.get("call_id").cloned().unwrap_or(Value::Null),
                    "content": output,
                }));
            }
            Some("reasoning") => {
                let text = match item.get("content").filter(|c| c.as_array().is_some_and(|a| !a.is_empty())) {
                    Some(c) => content_text(Some(c), &format!("{where_}.content"))?,
                    None => content_text(item.get("summary"), &format!("{where_}.summary"))?,
                };
                if !text.is_empty() {
                    reasoning = Some(text);
                }
            }
            Some("item_reference") => {
                return Err(ApiError::invalid_param(
                    "input",
                    format!("{where_}: `item_reference` is not supported: send the items, or continue a stored response with `previous_response_id`"),
                ))
            }
            other => tracing::warn!(
                "ignoring a `{}` item in {where_}: Hearth does not read it",
                other.unwrap_or("untyped")
            ),
        }
    }
    // Arguments as objects, as chat completions' messages get them.
    for m in &mut out {
        if let Some(calls) = m.get_mut("tool_calls") {
            fields::normalize_tool_calls(calls);
        }
    }
    Ok(out)
}

/// A response's output items as the template messages that continue the conversation.
pub fn output_messages(output: &[Value]) -> Vec<Value> {
    to_messages(&Value::Array(output.to_vec())).unwrap_or_default()
}
