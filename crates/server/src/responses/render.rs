//! A reply as Responses output items and events. One state machine serves both forms: streamed, it
//! writes each event as it goes; whole, the same machine runs over the same pieces with the events
//! discarded, so a whole response is exactly the `response` of a streamed one's last event.
//!
//! Items, in the order the reply produces them:
//! - `reasoning`: the model's thinking, with the whole text as its one `summary_text` part (Hearth
//!   does not summarize; the reasoning is its own summary) and no `encrypted_content`;
//! - `message`: the answer, one `output_text` part; whitespace before the answer's first visible
//!   character (between the reasoning and the answer, or before a call) opens no item;
//! - `function_call`: one per tool call, `call_id` the parser's id.
//!
//! Every event carries its `sequence_number`, counted from 0.

use std::sync::Arc;
use std::time::Duration;

use hearth_engine::{FinishReason, Usage};
use serde_json::{json, Value};

use super::store::{ResponseStore, Stored};
use crate::error::ApiError;
use crate::fields;
use crate::parse::Delta;
use crate::pipeline::Piece;
use crate::stream::{Frames, Render};

/// The item being streamed.
enum Open {
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
    Call(Call),
}

struct Call {
    id: String,
    call_id: String,
    name: String,
    arguments: String,
}

/// Where a finished response goes when the request asked to store it.
pub struct StoreTo {
    /// The store.
    pub store: Arc<ResponseStore>,
    /// The conversation the response continues (template messages, without `instructions`).
    pub messages: Vec<Value>,
}

/// The Responses form of one reply.
pub struct ResponseRender {
    /// The response object with everything but `status`, `output`, `usage` and the outcome.
    base: Value,
    seq: u64,
    output: Vec<Value>,
    open: Option<Open>,
    /// Answer whitespace held back until a visible character opens the message.
    held: String,
    reasoning_tokens: usize,
    store: Option<StoreTo>,
    /// The final response object, once the reply ended.
    pub finished: Option<Value>,
}

impl ResponseRender {
    /// A renderer for a response whose fixed fields are `base` (`id`, `model`, the echoed request
    /// fields).
    pub fn new(base: Value, store: Option<StoreTo>) -> ResponseRender {
        ResponseRender {
            base,
            seq: 0,
            output: Vec::new(),
            open: None,
            held: String::new(),
            reasoning_tokens: 0,
            store,
            finished: None,
        }
    }

    fn id(&self) -> &str {
        self.base["id"].as_str().unwrap_or_default()
    }

    /// The response object with this status and output so far.
    fn snapshot(&self, status: &str) -> Value {
        let mut v = self.base.clone();
        v["status"] = status.into();
        v["output"] = Value::Array(self.output.clone());
        v
    }

    fn event(&mut self, kind: &str, data: Value, out: &mut Frames) {
        emit(&mut self.seq, kind, data, out);
    }

    fn index(&self) -> usize {
        self.output.len()
    }

    /// Ends the open item with its `.done` events.
    fn close(&mut self, out: &mut Frames) {
        let i = self.index();
        self.held.clear();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { id, text }) => {
                let part = json!({"type": "summary_text", "text": text});
                self.event(
                    "response.reasoning_summary_text.done",
                    json!({"item_id": id, "output_index": i, "summary_index": 0, "text": text}),
                    out,
                );
                self.event(
                    "response.reasoning_summary_part.done",
                    json!({"item_id": id, "output_index": i, "summary_index": 0, "part": part}),
                    out,
                );
                reasoning_item(&id, &text)
            }
            Some(Open::Message { id, text }) => {
                let part = output_text(&text);
                self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []}),
                    out,
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
                    out,
                );
                message_item(&id, &text, "completed")
            }
            Some(Open::Call(c)) => {
                self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": c.id, "output_index": i, "name": c.name, "arguments": c.arguments}),
                    out,
                );
                call_item(&c, "completed")
            }
        };
        self.event(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
            out,
        );
        self.output.push(item);
    }

    fn open_item(&mut self, open: Open, out: &mut Frames) {
        self.close(out);
        let i = self.index();
        let item = match &open {
            Open::Reasoning { id, .. } => json!({"type": "reasoning", "id": id, "summary": []}),
            Open::Message { id, .. } => message_item(id, "", "in_progress"),
            Open::Call(c) => call_item(c, "in_progress"),
        };
        self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
            out,
        );
        match &open {
            Open::Reasoning { id, .. } => self.event(
                "response.reasoning_summary_part.added",
                json!({"item_id": id, "output_index": i, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
                out,
            ),
            Open::Message { id, .. } => self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": i, "content_index": 0, "part": output_text("")}),
                out,
            ),
            Open::Call(_) => {}
        }
        self.open = Some(open);
    }

    fn push(&mut self, d: &Delta, out: &mut Frames) {
        match d {
            Delta::Reasoning(s) => {
                if s.is_empty() {
                    return;
                }
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    let id = fields::new_id("rs_");
                    self.open_item(
                        Open::Reasoning {
                            id,
                            text: String::new(),
                        },
                        out,
                    );
                }
                let i = self.index();
                if let Some(Open::Reasoning { id, text }) = &mut self.open {
                    text.push_str(s);
                    let data =
                        json!({"item_id": id, "output_index": i, "summary_index": 0, "delta": s});
                    emit(
                        &mut self.seq,
                        "response.reasoning_summary_text.delta",
                        data,
                        out,
                    );
                }
            }
            Delta::Content(s) => {
                let mut s = s.clone();
                if !matches!(self.open, Some(Open::Message { .. })) {
                    if s.trim().is_empty() {
                        self.held.push_str(&s);
                        return;
                    }
                    s = std::mem::take(&mut self.held) + &s;
                    let id = fields::new_id("msg_");
                    self.open_item(
                        Open::Message {
                            id,
                            text: String::new(),
                        },
                        out,
                    );
                }
                let i = self.index();
                if let Some(Open::Message { id, text }) = &mut self.open {
                    text.push_str(&s);
                    let data = json!({"item_id": id, "output_index": i, "content_index": 0, "delta": s, "logprobs": []});
                    emit(&mut self.seq, "response.output_text.delta", data, out);
                }
            }
            Delta::ToolCallStart { id, name, .. } => {
                let suffix = id.strip_prefix("call_").unwrap_or(id);
                let call = Call {
                    id: format!("fc_{suffix}"),
                    call_id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                };
                self.open_item(Open::Call(call), out);
            }
            Delta::ToolCallArgs { fragment, .. } => {
                let i = self.index();
                if let Some(Open::Call(c)) = &mut self.open {
                    c.arguments.push_str(fragment);
                    let data = json!({"item_id": c.id, "output_index": i, "delta": fragment});
                    emit(
                        &mut self.seq,
                        "response.function_call_arguments.delta",
                        data,
                        out,
                    );
                }
            }
            Delta::ToolCallEnd { .. } => {
                if matches!(self.open, Some(Open::Call(_))) {
                    self.close(out);
                }
            }
        }
    }

    /// The reply ended: the last items close and the final object is built (and stored).
    fn end(&mut self, finish: FinishReason, usage: &Usage, out: &mut Frames) {
        self.close(out);
        let complete = finish != FinishReason::Length;
        let mut v = self.snapshot(if complete { "completed" } else { "incomplete" });
        if !complete {
            v["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        v["usage"] = json!({
            "input_tokens": usage.n_prompt,
            "input_tokens_details": {"cached_tokens": usage.n_cached},
            "output_tokens": usage.n_gen,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": usage.n_prompt + usage.n_gen,
        });
        if let Some(to) = self.store.take() {
            let mut messages = to.messages;
            messages.extend(super::output_messages(&self.output));
            let stored = Stored {
                response: v.clone(),
                messages,
            };
            to.store.put(self.id().to_string(), stored);
        }
        let kind = if complete {
            "response.completed"
        } else {
            "response.incomplete"
        };
        self.event(kind, json!({"response": v}), out);
        self.finished = Some(v);
    }
}

impl Render for ResponseRender {
    fn open(&mut self, out: &mut Frames) {
        let v = self.snapshot("in_progress");
        self.event("response.created", json!({"response": v}), out);
        let v = self.snapshot("in_progress");
        self.event("response.in_progress", json!({"response": v}), out);
    }

    fn piece(&mut self, _choice: usize, piece: &Piece, out: &mut Frames) {
        match piece {
            Piece::Token { deltas, .. } => {
                if deltas.iter().any(|d| matches!(d, Delta::Reasoning(_))) {
                    self.reasoning_tokens += 1;
                }
                deltas.iter().for_each(|d| self.push(d, out));
            }
            Piece::Done(end) => {
                end.deltas.iter().for_each(|d| self.push(d, out));
                self.end(end.finish, &end.usage, out);
            }
            Piece::Error(_) => {}
        }
    }

    fn fail(&mut self, err: &ApiError, out: &mut Frames) {
        self.close(out);
        let mut v = self.snapshot("failed");
        v["error"] = json!({"code": "server_error", "message": err.message});
        self.event("response.failed", json!({"response": v}), out);
    }

    fn keepalive_every(&self) -> Option<Duration> {
        Some(Duration::from_secs(15))
    }

    /// An SSE comment: clients' event parsers skip it, proxies and idle timers see bytes.
    fn keepalive(&mut self, out: &mut Frames) {
        out.raw(": keepalive\n\n");
    }
}

/// Writes one event with the next sequence number.
fn emit(seq: &mut u64, kind: &str, mut data: Value, out: &mut Frames) {
    data["type"] = kind.into();
    data["sequence_number"] = (*seq).into();
    *seq += 1;
    out.sse(Some(kind), &data);
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([output_text(text)])
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({
        "type": "reasoning", "id": id,
        "summary": [{"type": "summary_text", "text": text}],
        "encrypted_content": null,
    })
}

fn call_item(c: &Call, status: &str) -> Value {
    json!({
        "type": "function_call", "id": c.id, "call_id": c.call_id, "name": c.name,
        "arguments": c.arguments, "status": status,
    })
}
