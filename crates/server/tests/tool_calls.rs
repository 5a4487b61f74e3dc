//! Tool calls that never break a client, through every wire API that has tool calls (OpenAI
//! chat completions, OpenAI Responses, Anthropic Messages, Ollama chat), whole and streamed at several cuts: Qwen3-
//! Coder XML and Qwen3 JSON calls typed by the tool's schema, strings verbatim, text before a call
//! kept, several calls in one reply, a call cut off by `max_tokens` returned as text, a call to a
//! tool the request did not offer returned as text, an unparseable call returned as text; never an
//! error. Plus the scripted backend's one reply per assistant turn, which the agent tests rely on.

mod common;

use common::*;
use hearth_server::scripted::{Cuts, Script};
use serde_json::{json, Value};

/// A reply as a client sees it, whatever the API: answer text, calls (name, arguments), and
/// whether it ended for a tool call, normally or at the length limit.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    content: String,
    calls: Vec<(String, Value)>,
    finish: Finish,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Finish {
    Tools,
    Stop,
    Length,
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "run", "description": "Run a command",
            "parameters": {"type": "object", "properties": {
                "command": {"type": "string"}, "timeout": {"type": "integer"},
                "background": {"type": "boolean"}, "env": {"type": "object"}, "args": {"type": "array"}},
            "required": ["command"]}}},
        {"type": "function", "function": {"name": "write", "description": "Write a file",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string"}, "content": {"type": "string"}}}}}
    ])
}

/// The same tools in Anthropic's shape.
fn anthropic_tools() -> Value {
    let list = tools().as_array().unwrap().clone();
    Value::Array(
        list.into_iter()
            .map(|t| {
                json!({"name": t["function"]["name"], "description": t["function"]["description"],
                            "input_schema": t["function"]["parameters"]})
            })
            .collect(),
    )
}

/// The same tools in the Responses API's flat shape.
fn responses_tools() -> Value {
    let list = tools().as_array().unwrap().clone();
    Value::Array(
        list.into_iter()
            .map(|t| {
                let mut f = t["function"].clone();
                f["type"] = "function".into();
                f
            })
            .collect(),
    )
}

/// A response object: its message text, its function calls, and its status.
fn responses(v: &Value) -> Seen {
    let mut content = String::new();
    let mut calls = Vec::new();
    for item in v["output"].as_array().unwrap() {
        match item["type"].as_str().unwrap() {
            "message" => {
                for p in item["content"].as_array().unwrap() {
                    content.push_str(p["text"].as_str().unwrap());
                }
            }
            "function_call" => calls.push((
                item["name"].as_str().unwrap().to_string(),
                serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap(),
            )),
            "reasoning" => {}
            other => panic!("output item {other}"),
        }
    }
    let finish = match v["status"].as_str().unwrap() {
        "incomplete" => Finish::Length,
        "completed" if !calls.is_empty() => Finish::Tools,
        "completed" => Finish::Stop,
        other => panic!("status {other}"),
    };
    Seen {
        content,
        calls,
        finish,
    }
}

/// A streamed response: what its deltas add up to, checked against the `.done` events and the
/// final response object.
fn responses_stream(body: &str) -> Seen {
    let frames = sse_frames(body);
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut last = Value::Null;
    for (event, data) in &frames {
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(event.as_deref(), v["type"].as_str(), "{data}");
        match v["type"].as_str().unwrap() {
            "response.output_text.delta" => content.push_str(v["delta"].as_str().unwrap()),
            "response.output_item.added" if v["item"]["type"] == "function_call" => {
                calls.push((v["item"]["name"].as_str().unwrap().into(), String::new()))
            }
            "response.function_call_arguments.delta" => calls
                .last_mut()
                .unwrap()
                .1
                .push_str(v["delta"].as_str().unwrap()),
            "response.function_call_arguments.done" => {
                assert_eq!(v["arguments"].as_str().unwrap(), calls.last().unwrap().1)
            }
            "response.completed" | "response.incomplete" => last = v["response"].clone(),
            "response.failed" | "error" => panic!("error in the stream: {data}"),
            _ => {}
        }
    }
    let whole = responses(&last);
    let seen = Seen {
        content,
        calls: calls
            .into_iter()
            .map(|(n, a)| (n, serde_json::from_str(&a).unwrap()))
            .collect(),
        finish: whole.finish,
    };
    assert_eq!(seen, whole, "the deltas add up to the final response");
    seen
}

fn openai(v: &Value) -> Seen {
    let c = &v["choices"][0];
    let calls = c["message"]["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let args = t["function"]["arguments"].as_str().unwrap();
            (
                t["function"]["name"].as_str().unwrap().to_string(),
                serde_json::from_str(args).unwrap(),
            )
        })
        .collect();
    Seen {
        content: c["message"]["content"].as_str().unwrap_or("").to_string(),
        calls,
        finish: match c["finish_reason"].as_str().unwrap() {
            "tool_calls" => Finish::Tools,
            "stop" => Finish::Stop,
            "length" => Finish::Length,
            other => panic!("finish_reason {other}"),
        },
    }
}

fn openai_stream(body: &str) -> Seen {
    let frames = sse_frames(body);
    assert_eq!(frames.last().unwrap().1, "[DONE]", "{body}");
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut finish = String::new();
    for (_, data) in &frames[..frames.len() - 1] {
        let v: Value = serde_json::from_str(data).unwrap();
        assert!(v.get("error").is_none(), "error in the stream: {data}");
        for c in v["choices"].as_array().unwrap() {
            let d = &c["delta"];
            content.push_str(d["content"].as_str().unwrap_or(""));
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                let i = tc["index"].as_u64().unwrap() as usize;
                if i == calls.len() {
                    calls.push(Default::default());
                }
                let call = &mut calls[i];
                if let Some(n) = tc["function"]["name"].as_str() {
                    call.0 = n.to_string();
                }
                call.1
                    .push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
    }
    let v = json!({"choices": [{"finish_reason": finish, "message": {"content": content,
        "tool_calls": calls.iter().map(|(n, a)| json!({"function": {"name": n, "arguments": a}})).collect::<Vec<_>>()}}]});
    openai(&v)
}

fn anthropic(v: &Value) -> Seen {
    let mut s = Seen {
        content: String::new(),
        calls: Vec::new(),
        finish: match v["stop_reason"].as_str().unwrap() {
            "tool_use" => Finish::Tools,
            "end_turn" | "stop_sequence" => Finish::Stop,
            "max_tokens" => Finish::Length,
            other => panic!("stop_reason {other}"),
        },
    };
    for b in v["content"].as_array().unwrap() {
        match b["type"].as_str().unwrap() {
            "text" => s.content.push_str(b["text"].as_str().unwrap()),
            "tool_use" => s
                .calls
                .push((b["name"].as_str().unwrap().to_string(), b["input"].clone())),
            "thinking" => {}
            other => panic!("block {other}"),
        }
    }
    s
}

fn anthropic_stream(body: &str) -> Seen {
    let frames = sse_frames(body);
    let mut blocks: Vec<Value> = Vec::new();
    let mut json_buf = String::new();
    let mut stop = Value::Null;
    for (ev, data) in &frames {
        let v: Value = serde_json::from_str(data).unwrap();
        match ev.as_deref().unwrap() {
            "content_block_start" => {
                blocks.push(v["content_block"].clone());
                json_buf.clear();
            }
            "content_block_delta" => {
                let b = blocks.last_mut().unwrap();
                let d = &v["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        b["text"] = (b["text"].as_str().unwrap().to_string()
                            + d["text"].as_str().unwrap())
                        .into()
                    }
                    "input_json_delta" => json_buf.push_str(d["partial_json"].as_str().unwrap()),
                    _ => {}
                }
            }
            "content_block_stop" => {
                let b = blocks.last_mut().unwrap();
                if b["type"] == "tool_use" {
                    b["input"] = serde_json::from_str(&json_buf).unwrap();
                }
            }
            "message_delta" => stop = v["delta"]["stop_reason"].clone(),
            "error" => panic!("error in the stream: {data}"),
            _ => {}
        }
    }
    anthropic(&json!({"stop_reason": stop, "content": blocks}))
}

fn ollama(v: &Value) -> Seen {
    let calls: Vec<(String, Value)> = v["message"]["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["function"]["name"].as_str().unwrap().to_string(),
                t["function"]["arguments"].clone(),
            )
        })
        .collect();
    let finish = match v["done_reason"].as_str().unwrap() {
        "length" => Finish::Length,
        // Ollama has no finish reason of its own for tool calls.
        _ if !calls.is_empty() => Finish::Tools,
        _ => Finish::Stop,
    };
    Seen {
        content: v["message"]["content"].as_str().unwrap().to_string(),
        calls,
        finish,
    }
}

fn ollama_stream(body: &str) -> Seen {
    let lines = ndjson_lines(body);
    let mut content = String::new();
    let mut calls = Vec::new();
    for l in &lines {
        assert!(l.get("error").is_none(), "error in the stream: {l}");
        content.push_str(l["message"]["content"].as_str().unwrap_or(""));
        calls.extend(
            l["message"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
    }
    let last = lines.last().unwrap();
    ollama(
        &json!({"done_reason": last["done_reason"], "message": {"content": content, "tool_calls": calls}}),
    )
}

/// Sends `reply` through the three APIs, whole and streamed at several cuts, with `max_tokens`
/// when given, and checks every one sees `want`.
async fn check(s: &Setup, reply: &str, max_tokens: Option<usize>, want: &Seen) {
    let user = json!([{"role": "user", "content": "Go."}]);
    for cuts in [Cuts::Tokens, Cuts::Chars(1), Cuts::Chars(7)] {
        let mut script = Script::new(reply);
        script.cuts = cuts.clone();
        s.backend.set_script(script);
        for stream in [false, true] {
            let what = format!("cuts {cuts:?} stream {stream}");
            let mut body =
                json!({"model": "m", "stream": stream, "tools": tools(), "messages": user});
            if let Some(n) = max_tokens {
                body["max_tokens"] = n.into();
            }
            let r = post(s.app(), "/v1/chat/completions", &body).await;
            assert_eq!(r.status, 200, "openai {what}: {}", r.text());
            let got = if stream {
                openai_stream(&r.text())
            } else {
                openai(&r.json())
            };
            assert_eq!(&got, want, "openai {what}");

            let mut body = json!({"model": "m", "stream": stream, "tools": anthropic_tools(),
                "max_tokens": max_tokens.unwrap_or(4096), "messages": user});
            body["thinking"] = json!({"type": "disabled"});
            let r = post(s.app(), "/v1/messages", &body).await;
            assert_eq!(r.status, 200, "anthropic {what}: {}", r.text());
            let got = if stream {
                anthropic_stream(&r.text())
            } else {
                anthropic(&r.json())
            };
            assert_eq!(&got, want, "anthropic {what}");

            let mut body = json!({"model": "m", "stream": stream, "tools": responses_tools(),
                "input": "Go.", "reasoning": {"effort": "none"}});
            if let Some(n) = max_tokens {
                body["max_output_tokens"] = n.into();
            }
            let r = post(s.app(), "/v1/responses", &body).await;
            assert_eq!(r.status, 200, "responses {what}: {}", r.text());
            let got = if stream {
                responses_stream(&r.text())
            } else {
                responses(&r.json())
            };
            assert_eq!(&got, want, "responses {what}");

            let mut body =
                json!({"model": "m", "stream": stream, "tools": tools(), "messages": user});
            if let Some(n) = max_tokens {
                body["options"] = json!({"num_predict": n});
            }
            let r = post(s.app(), "/api/chat", &body).await;
            assert_eq!(r.status, 200, "ollama {what}: {}", r.text());
            let got = if stream {
                ollama_stream(&r.text())
            } else {
                ollama(&r.json())
            };
            assert_eq!(&got, want, "ollama {what}");
        }
    }
}

fn call(name: &str, args: Value) -> (String, Value) {
    (name.to_string(), args)
}

const CODE: &str = "fn main() {\n    if a < b && c > d { println!(\"</parameter>\"); }\n    let tag = \"<parameter=x>\"; // </function>\n}\n</parameter> is how a value closes\n";

#[tokio::test]
async fn coder_xml_calls_typed_verbatim_and_several() {
    let s = setup("", Tpl::Coder);
    let reply = format!(
        "I'll write it, then build.\n\n<tool_call>\n<function=write>\n<parameter=path>\nsrc/main.rs\n</parameter>\n<parameter=content>\n{CODE}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=run>\n<parameter=command>\ncargo build\n</parameter>\n<parameter=timeout>\n600\n</parameter>\n<parameter=background>\nfalse\n</parameter>\n<parameter=env>\n{{\"RUST_LOG\": \"debug\"}}\n</parameter>\n<parameter=args>\n[\"--release\", 2]\n</parameter>\n</function>\n</tool_call>"
    );
    let want = Seen {
        content: "I'll write it, then build.".into(),
        calls: vec![
            call("write", json!({"path": "src/main.rs", "content": CODE})),
            call(
                "run",
                json!({"command": "cargo build", "timeout": 600, "background": false,
                       "env": {"RUST_LOG": "debug"}, "args": ["--release", 2]}),
            ),
        ],
        finish: Finish::Tools,
    };
    check(&s, &reply, None, &want).await;
}

#[tokio::test]
async fn qwen3_json_calls_typed_by_the_schema() {
    let s = setup("", Tpl::Qwen3);
    let reply = "Running it.\n<tool_call>\n{\"name\": \"run\", \"arguments\": {\"command\": \"ls -la\\n\\tpwd\", \"timeout\": \"30\", \"background\": \"true\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"write\", \"arguments\": {\"path\": \"a.txt\", \"content\": \"x < y\"}}\n</tool_call>";
    let want = Seen {
        content: "Running it.".into(),
        calls: vec![
            call(
                "run",
                json!({"command": "ls -la\n\tpwd", "timeout": 30, "background": true}),
            ),
            call("write", json!({"path": "a.txt", "content": "x < y"})),
        ],
        finish: Finish::Tools,
    };
    check(&s, reply, None, &want).await;
}

#[tokio::test]
async fn a_call_cut_off_by_max_tokens_comes_back_as_text() {
    for (tpl, reply) in [
        (Tpl::Coder, "Let me run it.\n<tool_call>\n<function=run>\n<parameter=command>\nrm -rf /tmp/build-cache\n</parameter>\n</function>\n</tool_call>"),
        (Tpl::Qwen3, "Let me run it.\n<tool_call>\n{\"name\": \"run\", \"arguments\": {\"command\": \"rm -rf /tmp/build-cache\"}}\n</tool_call>"),
    ] {
        let s = setup("", tpl);
        // `max_tokens` counts pieces, so per cut: the pieces that end before the command's
        // path; the reply stops inside the call.
        let cut_at = reply.find("/tmp").unwrap();
        for cuts in [Cuts::Tokens, Cuts::Chars(1), Cuts::Chars(7)] {
            let pieces = s.backend.pieces(reply, &cuts);
            let mut end = 0;
            let n = pieces
                .iter()
                .take_while(|p| {
                    end += p.1.len();
                    end <= cut_at
                })
                .count();
            let text: String = pieces[..n].iter().map(|p| p.1.as_str()).collect();
            assert!(text.contains("<tool_call>"), "{cuts:?}: {text:?}");
            let want = Seen {
                content: text,
                calls: vec![],
                finish: Finish::Length,
            };
            let mut script = Script::new(reply);
            script.cuts = cuts;
            check_one_cut(&s, script, n, &want).await;
        }
    }
}

/// [`check`] for one script and cut, with `max_tokens`.
async fn check_one_cut(s: &Setup, script: Script, max_tokens: usize, want: &Seen) {
    let user = json!([{"role": "user", "content": "Go."}]);
    s.backend.set_script(script.clone());
    for stream in [false, true] {
        let what = format!("cuts {:?} stream {stream}", script.cuts);
        let body =
            json!({"stream": stream, "tools": tools(), "messages": user, "max_tokens": max_tokens});
        let r = post(s.app(), "/v1/chat/completions", &body).await;
        let got = if stream {
            openai_stream(&r.text())
        } else {
            openai(&r.json())
        };
        assert_eq!(&got, want, "openai {what}");
        let body = json!({"stream": stream, "tools": anthropic_tools(), "messages": user,
            "max_tokens": max_tokens, "thinking": {"type": "disabled"}});
        let r = post(s.app(), "/v1/messages", &body).await;
        let got = if stream {
            anthropic_stream(&r.text())
        } else {
            anthropic(&r.json())
        };
        assert_eq!(&got, want, "anthropic {what}");
        let body = json!({"stream": stream, "tools": responses_tools(), "input": "Go.",
            "max_output_tokens": max_tokens, "reasoning": {"effort": "none"}});
        let r = post(s.app(), "/v1/responses", &body).await;
        let got = if stream {
            responses_stream(&r.text())
        } else {
            responses(&r.json())
        };
        assert_eq!(&got, want, "responses {what}");
        let body = json!({"stream": stream, "tools": tools(), "messages": user,
            "options": {"num_predict": max_tokens}});
        let r = post(s.app(), "/api/chat", &body).await;
        let got = if stream {
            ollama_stream(&r.text())
        } else {
            ollama(&r.json())
        };
        assert_eq!(&got, want, "ollama {what}");
    }
}

#[tokio::test]
async fn a_tool_the_request_did_not_offer_comes_back_as_text() {
    for (tpl, reply) in [
        (Tpl::Coder, "Sure.\n<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"),
        (Tpl::Qwen3, "Sure.\n<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>"),
    ] {
        let s = setup("", tpl);
        let want = Seen {
            content: reply.to_string(),
            calls: vec![],
            finish: Finish::Stop,
        };
        check(&s, reply, None, &want).await;
    }
}

#[tokio::test]
async fn an_unparseable_call_comes_back_as_text() {
    for (tpl, reply) in [
        (Tpl::Qwen3, "Try: <tool_call>\n{\"name\": \"run\", \"arguments\": {\"command\": }\n</tool_call> done"),
        (Tpl::Coder, "Try: <tool_call>\n<function=>\n</function>\n</tool_call> done"),
        (Tpl::Coder, "Try: <tool_call> then prose</tool_call> done"),
    ] {
        let s = setup("", tpl);
        let want = Seen {
            content: reply.to_string(),
            calls: vec![],
            finish: Finish::Stop,
        };
        check(&s, reply, None, &want).await;
    }
}

#[tokio::test]
async fn scripted_replies_follow_the_assistant_turns() {
    let s = setup("", Tpl::Qwen3);
    s.backend
        .set_replies(vec![Script::new("first"), Script::new("second")]);
    let ask = |messages: Value| {
        let app = s.app();
        async move {
            let r = post(
                app,
                "/v1/chat/completions",
                &json!({"messages": messages, "tools": tools()}),
            )
            .await;
            r.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let user = json!({"role": "user", "content": "Go."});
    let called = json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "run", "arguments": "{\"command\": \"ls\"}"}}]});
    let result = json!({"role": "tool", "tool_call_id": "call_1", "content": "a.txt"});
    assert_eq!(ask(json!([user])).await, "first");
    // The same turn again (a retry, a side request) gets the same reply.
    assert_eq!(ask(json!([user])).await, "first");
    assert_eq!(ask(json!([user, called, result])).await, "second");
    // The last reply repeats.
    assert_eq!(
        ask(json!([user, called, result, called, result])).await,
        "second"
    );
    // A system prompt is not a turn.
    let system = json!({"role": "system", "content": "Be brief."});
    assert_eq!(ask(json!([system, user])).await, "first");
}
