//! Every captured request of the real coding agents (`tests/data/clients/`, see its README) replayed
//! as sent — path, query, headers and body — streamed as the client asked and again whole, against
//! a scripted reply that calls the client's own shell tool: each is served, and the call comes back
//! in the client's API with its arguments. The title request opencode sends without tools gets the
//! same text back as an answer.

mod common;

use common::*;
use serde_json::{json, Value};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/clients/");

/// Each captured file, and the shell tool its client offers with the name of its command argument
/// (`None`: the request offers no tools).
const FILES: [(&str, Option<(&str, &str)>); 11] = [
    ("claude-code-1-messages.json", Some(("Bash", "command"))),
    (
        "claude-code-2-messages-tool-result.json",
        Some(("Bash", "command")),
    ),
    (
        "claude-code-3-messages-tool-result.json",
        Some(("Bash", "command")),
    ),
    ("codex-1-responses.json", Some(("exec_command", "cmd"))),
    (
        "codex-2-responses-function-call-output.json",
        Some(("exec_command", "cmd")),
    ),
    ("opencode-0-chat-title.json", None),
    ("opencode-1-chat.json", Some(("bash", "command"))),
    (
        "opencode-2-chat-tool-result.json",
        Some(("bash", "command")),
    ),
    (
        "qwen-code-1-chat.json",
        Some(("run_shell_command", "command")),
    ),
    (
        "qwen-code-2-chat-tool-result.json",
        Some(("run_shell_command", "command")),
    ),
    (
        "qwen-code-3-chat-memory.json",
        Some(("run_shell_command", "command")),
    ),
];

/// What a client reads from a reply: its text and its calls (name, arguments).
type Seen = (String, Vec<(String, Value)>);

fn chat_whole(v: &Value) -> Seen {
    let m = &v["choices"][0]["message"];
    let calls = m["tool_calls"].as_array().cloned().unwrap_or_default();
    (
        m["content"].as_str().unwrap_or("").to_string(),
        calls
            .iter()
            .map(|c| {
                let args = c["function"]["arguments"].as_str().unwrap();
                (
                    c["function"]["name"].as_str().unwrap().to_string(),
                    serde_json::from_str(args).unwrap(),
                )
            })
            .collect(),
    )
}

fn chat_stream(body: &str) -> Seen {
    let (mut text, mut calls) = (String::new(), Vec::<(String, String)>::new());
    for (_, data) in sse_frames(body) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        let Some(d) = v["choices"].get(0).map(|c| &c["delta"]) else {
            continue;
        };
        text.push_str(d["content"].as_str().unwrap_or(""));
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                calls.push((
                    tc["function"]["name"].as_str().unwrap().to_string(),
                    String::new(),
                ));
            }
            calls[i]
                .1
                .push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    let calls = calls
        .into_iter()
        .map(|(n, a)| (n, serde_json::from_str(&a).unwrap()))
        .collect();
    (text, calls)
}

fn messages_whole(v: &Value) -> Seen {
    let (mut text, mut calls) = (String::new(), Vec::new());
    for b in v["content"].as_array().unwrap() {
        match b["type"].as_str().unwrap() {
            "text" => text.push_str(b["text"].as_str().unwrap()),
            "tool_use" => calls.push((b["name"].as_str().unwrap().to_string(), b["input"].clone())),
            _ => {}
        }
    }
    (text, calls)
}

fn messages_stream(body: &str) -> Seen {
    let (mut text, mut calls, mut args) = (String::new(), Vec::new(), String::new());
    for (ev, data) in sse_frames(body) {
        let v: Value = serde_json::from_str(&data).unwrap();
        match ev.as_deref().unwrap() {
            "content_block_start" if v["content_block"]["type"] == "tool_use" => {
                calls.push((
                    v["content_block"]["name"].as_str().unwrap().to_string(),
                    Value::Null,
                ));
                args.clear();
            }
            "content_block_delta" => match v["delta"]["type"].as_str().unwrap() {
                "text_delta" => text.push_str(v["delta"]["text"].as_str().unwrap()),
                "input_json_delta" => args.push_str(v["delta"]["partial_json"].as_str().unwrap()),
                _ => {}
            },
            "content_block_stop" if !args.is_empty() => {
                calls.last_mut().unwrap().1 = serde_json::from_str(&args).unwrap();
                args.clear();
            }
            _ => {}
        }
    }
    (text, calls)
}

fn responses_whole(v: &Value) -> Seen {
    assert_eq!(v["status"], "completed", "{v}");
    let (mut text, mut calls) = (String::new(), Vec::new());
    for item in v["output"].as_array().unwrap() {
        match item["type"].as_str().unwrap() {
            "message" => text.push_str(item["content"][0]["text"].as_str().unwrap()),
            "function_call" => calls.push((
                item["name"].as_str().unwrap().to_string(),
                serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap(),
            )),
            _ => {}
        }
    }
    (text, calls)
}

fn responses_stream(body: &str) -> Seen {
    let last = sse_frames(body).pop().unwrap();
    assert_eq!(last.0.as_deref(), Some("response.completed"));
    responses_whole(&serde_json::from_str::<Value>(&last.1).unwrap()["response"])
}

#[tokio::test]
async fn every_captured_client_request_is_served_with_its_tool_call() {
    // Codex's and Claude Code's prompts run past the default test context.
    let s = setup_with(
        hearth_server::scripted::Script::new(""),
        Tpl::Qwen3,
        hearth_server::ServerConfig::default(),
        32768,
    );
    for (file, tool) in FILES {
        let captured: Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{DIR}{file}")).unwrap())
                .unwrap();
        let (name, arg) = tool.unwrap_or(("Bash", "command"));
        let reply = format!(
            "Running it.\n<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {{\"{arg}\": \"ls -la\"}}}}\n</tool_call>"
        );
        s.backend
            .set_script(hearth_server::scripted::Script::new(&reply));
        let want: Seen = match tool {
            Some(_) => (
                "Running it.".into(),
                vec![(name.into(), json!({arg: "ls -la"}))],
            ),
            // Not offered: the call is the answer's text.
            None => (reply.clone(), vec![]),
        };
        let path = match captured["query"].as_str().unwrap_or("") {
            "" => captured["path"].as_str().unwrap().to_string(),
            q => format!("{}?{q}", captured["path"].as_str().unwrap()),
        };
        let headers: Vec<(String, String)> = captured["headers"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("content-type"))
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut body = captured["body"].clone();
        assert_eq!(body["stream"], true, "{file}: the clients all stream");
        for stream in [true, false] {
            body["stream"] = stream.into();
            let r = send(s.app(), "POST", &path, &body.to_string(), &headers).await;
            assert_eq!(r.status, 200, "{file} stream {stream}: {}", r.text());
            let text = r.text();
            let got = match (captured["path"].as_str().unwrap(), stream) {
                ("/v1/messages", true) => messages_stream(&text),
                ("/v1/messages", false) => messages_whole(&r.json()),
                ("/v1/responses", true) => responses_stream(&text),
                ("/v1/responses", false) => responses_whole(&r.json()),
                ("/v1/chat/completions", true) => chat_stream(&text),
                ("/v1/chat/completions", false) => chat_whole(&r.json()),
                (p, _) => panic!("{file}: unexpected path {p}"),
            };
            assert_eq!(got, want, "{file} stream {stream}");
        }
    }
}
