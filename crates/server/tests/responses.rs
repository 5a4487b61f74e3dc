//! OpenAI Responses (`/v1/responses`) as Codex and the SDKs use it: the streamed event sequence in
//! order with its sequence numbers, the whole response equal to the streamed one's last event,
//! reasoning as a `reasoning` item with a summary, Codex's captured requests, `store` and
//! `previous_response_id`, `text.format`, `max_output_tokens` as `incomplete`, and 400s in OpenAI's
//! error shape for what Hearth cannot serve.

mod common;

use common::*;
use serde_json::{json, Value};

const THOUGHT: &str = "<think>\nThe user greets me.\n</think>\n\nHello there, friend.";

/// The events of a streamed response, checked for framing, sequence numbers, and every item event
/// naming the item added at its `output_index`.
fn events(body: &str) -> Vec<Value> {
    let frames = sse_frames(body);
    let mut items: Vec<String> = Vec::new();
    frames
        .iter()
        .enumerate()
        .map(|(i, (event, data))| {
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(event.as_deref(), v["type"].as_str(), "event line = type");
            assert_eq!(
                v["sequence_number"], i as u64,
                "sequence numbers count from 0"
            );
            if v["type"] == "response.output_item.added" {
                assert_eq!(v["output_index"], items.len() as u64, "{data}");
                items.push(v["item"]["id"].as_str().unwrap().to_string());
            } else if let Some(k) = v["output_index"].as_u64() {
                let id = v.get("item_id").unwrap_or(&v["item"]["id"]);
                assert_eq!(id, &items[k as usize], "{data}");
            }
            v
        })
        .collect()
}

/// The event types in order, runs of the same delta event collapsed into one.
fn kinds(evs: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for e in evs {
        let k = e["type"].as_str().unwrap().to_string();
        if k.ends_with(".delta") && out.last() == Some(&k) {
            continue;
        }
        out.push(k);
    }
    out
}

/// A response object without what differs between two runs (ids, times).
fn stable(v: &Value) -> Value {
    let mut v = v.clone();
    v["id"] = Value::Null;
    v["created_at"] = Value::Null;
    for item in v["output"].as_array_mut().unwrap() {
        item["id"] = Value::Null;
    }
    v
}

#[tokio::test]
async fn streamed_events_come_in_order_and_end_in_the_whole_response() {
    let s = setup(THOUGHT, Tpl::Qwen3);
    let body =
        json!({"model": "m", "input": "hi", "stream": true, "reasoning": {"summary": "auto"}});
    let r = post(s.app(), "/v1/responses", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let evs = events(&r.text());
    assert_eq!(
        kinds(&evs),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(evs[0]["response"]["status"], "in_progress");
    let last = &evs.last().unwrap()["response"];
    assert_eq!(last["status"], "completed");
    assert_eq!(last["output"][0]["type"], "reasoning");
    assert_eq!(
        last["output"][0]["summary"][0]["text"]
            .as_str()
            .unwrap()
            .trim(),
        "The user greets me."
    );
    assert_eq!(last["output"][1]["type"], "message");
    assert_eq!(last["output"][1]["role"], "assistant");
    assert_eq!(last["output"][1]["content"][0]["type"], "output_text");
    assert_eq!(
        last["output"][1]["content"][0]["text"],
        "Hello there, friend."
    );
    let u = &last["usage"];
    assert!(u["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(u["input_tokens_details"]["cached_tokens"], 0);
    assert!(
        u["output_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap()
    );
    // Each item's `.done` is the item the final response holds.
    let done: Vec<&Value> = evs
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .map(|e| &e["item"])
        .collect();
    assert_eq!(
        done,
        last["output"]
            .as_array()
            .unwrap()
            .iter()
            .collect::<Vec<_>>()
    );

    let mut whole_body = body.clone();
    whole_body["stream"] = false.into();
    let r = post(s.app(), "/v1/responses", &whole_body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let whole = r.json();
    assert_eq!(whole["object"], "response");
    assert_eq!(stable(&whole), stable(last), "whole = streamed");
}

#[tokio::test]
async fn codex_requests_are_served() {
    let s = setup(
        "<tool_call>\n{\"name\": \"exec_command\", \"arguments\": {\"cmd\": \"ls\"}}\n</tool_call>",
        Tpl::Qwen3,
    );
    for file in [
        "codex-1-responses.json",
        "codex-2-responses-function-call-output.json",
    ] {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/clients/").to_string() + file;
        let captured: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let r = post(s.app(), "/v1/responses", &captured["body"]).await;
        assert_eq!(r.status, 200, "{file}: {}", r.text());
        let evs = events(&r.text());
        let last = &evs.last().unwrap()["response"];
        assert_eq!(last["status"], "completed", "{file}");
        let call = last["output"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["type"] == "function_call")
            .unwrap_or_else(|| panic!("{file}: no call in {last}"));
        assert_eq!(call["name"], "exec_command");
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"cmd": "ls"}));
        assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(last["store"], false);
    }
}

#[tokio::test]
async fn previous_response_id_continues_a_stored_conversation() {
    let s = setup("Nice to meet you, Ada.", Tpl::Qwen3);
    let first = post(
        s.app(),
        "/v1/responses",
        &json!({"input": "My name is Ada.", "instructions": "Be brief."}),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    let id = first["id"].as_str().unwrap();
    assert!(id.starts_with("resp_"));

    let got = send(s.app(), "GET", &format!("/v1/responses/{id}"), "", &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), first);

    let next = post(
        s.app(),
        "/v1/responses",
        &json!({"input": "What is my name?", "previous_response_id": id, "instructions": "Be brief."}),
    )
    .await;
    assert_eq!(next.status, 200, "{}", next.text());
    let next = next.json();
    assert_eq!(next["previous_response_id"], id);
    // The same prompt as the whole conversation sent as items.
    let explicit = post(
        s.app(),
        "/v1/responses",
        &json!({"instructions": "Be brief.", "store": false, "input": [
            {"role": "user", "content": "My name is Ada."},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Nice to meet you, Ada."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]}
        ]}),
    )
    .await
    .json();
    assert_eq!(
        next["usage"]["input_tokens"], explicit["usage"]["input_tokens"],
        "the continued prompt is the whole conversation"
    );
    assert!(
        next["usage"]["input_tokens"].as_u64().unwrap()
            > first["usage"]["input_tokens"].as_u64().unwrap() + 8
    );
    // Not stored: `store: false`.
    let explicit_id = explicit["id"].as_str().unwrap();
    let r = send(
        s.app(),
        "GET",
        &format!("/v1/responses/{explicit_id}"),
        "",
        &[],
    )
    .await;
    assert_eq!(r.status, 404);

    let del = send(s.app(), "DELETE", &format!("/v1/responses/{id}"), "", &[]).await;
    assert_eq!(del.status, 200);
    assert_eq!(del.json()["deleted"], true);
    let r = post(
        s.app(),
        "/v1/responses",
        &json!({"input": "again", "previous_response_id": id}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "previous_response_id");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn function_calls_and_their_outputs_are_the_template_turns() {
    let s = setup("ok", Tpl::Qwen3);
    let tools = json!([{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        {"type": "web_search"}, {"type": "namespace", "name": "ns", "tools": []}]);
    let items = json!([
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "I should run ls."}], "encrypted_content": null},
        {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt\nb.txt"}
    ]);
    let r = post(
        s.app(),
        "/v1/responses",
        &json!({"input": items, "tools": tools}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The same conversation through chat completions: the same prompt.
    let chat = post(
        s.app(),
        "/v1/chat/completions",
        &json!({"tools": [{"type": "function", "function": {"name": "exec_command", "description": "", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}],
            "messages": [
            {"role": "developer", "content": "You are Codex."},
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": "", "reasoning_content": "I should run ls.", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"}
        ]}),
    )
    .await;
    assert_eq!(chat.status, 200, "{}", chat.text());
    assert_eq!(
        r.json()["usage"]["input_tokens"],
        chat.json()["usage"]["prompt_tokens"]
    );
}

#[tokio::test]
async fn text_format_holds_the_reply_to_the_schema() {
    let s = setup("{\"a\": 7}", Tpl::Fixture);
    let format = json!({"type": "json_schema", "name": "t", "strict": true,
        "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}});
    let r = post(
        s.app(),
        "/v1/responses",
        &json!({"input": "hi", "text": {"format": format}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["output"][0]["content"][0]["text"], "{\"a\": 7}");
    assert_eq!(r.json()["text"]["format"]["name"], "t");
    assert_eq!(s.backend.constrained(), 1);
    // A reply the schema refuses fails the response.
    let format = json!({"type": "json_schema", "name": "t", "schema": {"type": "array"}});
    let r = post(
        s.app(),
        "/v1/responses",
        &json!({"input": "hi", "stream": true, "text": {"format": format}}),
    )
    .await;
    let evs = events(&r.text());
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "response.failed");
    assert_eq!(last["response"]["status"], "failed");
    assert_eq!(last["response"]["error"]["code"], "server_error");
}

#[tokio::test]
async fn max_output_tokens_ends_incomplete() {
    let s = setup(
        "one two three four five six seven eight nine ten",
        Tpl::Fixture,
    );
    let r = post(
        s.app(),
        "/v1/responses",
        &json!({"input": "count", "max_output_tokens": 3}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["usage"]["output_tokens"], 3);
    let r = post(
        s.app(),
        "/v1/responses",
        &json!({"input": "count", "max_output_tokens": 3, "stream": true}),
    )
    .await;
    let evs = events(&r.text());
    assert_eq!(evs.last().unwrap()["type"], "response.incomplete");
    assert_eq!(stable(&evs.last().unwrap()["response"]), stable(&v));
}

#[tokio::test]
async fn what_hearth_cannot_serve_is_a_400_naming_it() {
    let s = setup("ok", Tpl::Qwen3);
    let cases = [
        (json!({}), "input", "`input` is required"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input",
            "text only",
        ),
        (
            json!({"input": "hi", "tool_choice": {"type": "web_search"}}),
            "tool_choice",
            "function tools only",
        ),
        (
            json!({"input": "hi", "reasoning": {"effort": "extreme"}}),
            "reasoning.effort",
            "extreme",
        ),
        (
            json!({"input": [{"role": "robot", "content": "x"}]}),
            "input",
            "role",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input",
            "item_reference",
        ),
        (
            json!({"input": "hi", "max_output_tokens": 0}),
            "max_output_tokens",
            "between",
        ),
    ];
    for (body, param, words) in cases {
        let r = post(s.app(), "/v1/responses", &body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], param, "{body}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains(words),
            "{body}: {e}"
        );
    }
    let r = send(s.app(), "GET", "/v1/responses/resp_nope", "", &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn the_servers_max_tokens_caps_every_api() {
    let cfg = hearth_server::ServerConfig {
        max_tokens: Some(2),
        ..hearth_server::ServerConfig::default()
    };
    let s = setup_with(
        hearth_server::scripted::Script::new("one two three four five six"),
        Tpl::Fixture,
        cfg,
        4096,
    );
    let r = post(s.app(), "/v1/responses", &json!({"input": "count"})).await;
    assert_eq!(r.json()["usage"]["output_tokens"], 2);
    assert_eq!(r.json()["status"], "incomplete");
    let r = post(
        s.app(),
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "count"}], "max_tokens": 100}),
    )
    .await;
    assert_eq!(r.json()["usage"]["completion_tokens"], 2);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
    // A smaller request limit still applies.
    let r = post(
        s.app(),
        "/v1/messages",
        &json!({"messages": [{"role": "user", "content": "count"}], "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.json()["usage"]["output_tokens"], 1);
}

#[tokio::test]
async fn system_items_render_as_the_chat_system_message() {
    let s = setup("ok", Tpl::Qwen3);
    let items = json!([
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Answer in French."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Salut."}]},
        {"role": "system", "content": "Now in German."},
        {"role": "user", "content": "again"}
    ]);
    let r = post(s.app(), "/v1/responses", &json!({"input": items})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let responses = s.last_prompt();
    let chat = post(
        s.app(),
        "/v1/chat/completions",
        &json!({"messages": [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Salut."},
            {"role": "system", "content": "Now in German."},
            {"role": "user", "content": "again"}
        ]}),
    )
    .await;
    assert_eq!(chat.status, 200, "{}", chat.text());
    assert_eq!(responses, s.last_prompt());
    assert!(
        responses.starts_with("<|im_start|>system\nAnswer in French.<|im_end|>"),
        "{responses:?}"
    );
    assert!(
        responses.contains("<|im_start|>system\nNow in German.<|im_end|>"),
        "{responses:?}"
    );
    // `instructions` come before the conversation's own system items.
    let r = post(
        s.app(),
        "/v1/responses",
        &json!({"input": items, "instructions": "Be brief."}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = s.last_prompt();
    assert!(p.starts_with("<|im_start|>system\nBe brief."), "{p:?}");
    assert!(p.find("Be brief.") < p.find("Answer in French."), "{p:?}");
}

#[tokio::test]
async fn every_tool_choice_variant() {
    let call =
        "<tool_call>\n{\"name\": \"exec_command\", \"arguments\": {\"cmd\": \"ls\"}}\n</tool_call>";
    let s = setup(call, Tpl::Qwen3);
    let exec = json!({"type": "function", "name": "exec_command", "description": "Runs a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}});
    let other = json!({"type": "function", "name": "read_file", "description": "Reads a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}});
    let ask = |tools: Value, choice: Value| {
        let mut b = json!({"input": "list files", "tools": tools, "reasoning": {"effort": "none"}});
        if !choice.is_null() {
            b["tool_choice"] = choice;
        }
        b
    };
    // What the model is offered, per choice: the prompt's tool list.
    let prompt = |body: Value| {
        let s = &s;
        async move {
            let r = post(s.app(), "/v1/responses", &body).await;
            assert_eq!(r.status, 200, "{body}: {}", r.text());
            (s.last_prompt(), r.json())
        }
    };
    let (no_tools, _) = prompt(ask(json!([]), Value::Null)).await;
    let (both, _) = prompt(ask(json!([exec, other]), Value::Null)).await;
    let (only_exec, _) = prompt(ask(json!([exec]), Value::Null)).await;
    assert!(both.contains("read_file") && both.contains("exec_command"));
    assert_eq!(
        s.backend.constrained(),
        0,
        "auto and no choice are not constrained"
    );
    let (auto, v) = prompt(ask(json!([exec, other]), json!("auto"))).await;
    assert_eq!(auto, both);
    assert_eq!(v["tool_choice"], "auto");
    assert_eq!(v["output"][0]["type"], "function_call");
    // `none`: no tools in the prompt, and a call the model writes anyway is text.
    let (none, v) = prompt(ask(json!([exec, other]), json!("none"))).await;
    assert_eq!(none, no_tools);
    assert_eq!(v["output"][0]["type"], "message", "{v}");
    assert_eq!(v["output"][0]["content"][0]["text"], call);
    // `allowed_tools` offers the listed subset.
    let allowed = |mode: &str| json!({"type": "allowed_tools", "mode": mode, "tools": [{"type": "function", "name": "exec_command"}]});
    let (subset, _) = prompt(ask(json!([exec, other]), allowed("auto"))).await;
    assert_eq!(subset, only_exec);
    assert_eq!(s.backend.constrained(), 0);
    // `required`, a named function and `allowed_tools` in `required` mode force a call: the
    // reply is held to a grammar of the allowed calls.
    for (i, choice) in [
        json!("required"),
        json!({"type": "function", "name": "exec_command"}),
        allowed("required"),
    ]
    .into_iter()
    .enumerate()
    {
        let (p, v) = prompt(ask(json!([exec, other]), choice.clone())).await;
        assert_eq!(s.backend.constrained(), i + 1, "{choice}");
        assert_eq!(v["tool_choice"], choice);
        let out = &v["output"][0];
        assert_eq!(
            (out["type"].as_str(), out["name"].as_str()),
            (Some("function_call"), Some("exec_command")),
            "{choice}: {v}"
        );
        assert_eq!(out["arguments"], "{\"cmd\":\"ls\"}");
        let want = if choice["type"] == "allowed_tools" {
            &only_exec
        } else {
            &both
        };
        assert_eq!(&p, want, "{choice}");
    }
    // A forced function that was not offered is a 400 naming it.
    let r = post(
        s.app(),
        "/v1/responses",
        &ask(
            json!([other]),
            json!({"type": "function", "name": "exec_command"}),
        ),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("exec_command"), "{}", r.text());
}

#[tokio::test]
async fn temperature_and_top_p_reach_the_sampler() {
    let s = setup("ok", Tpl::Qwen3);
    let r = post(
        s.app(),
        "/v1/responses",
        &json!({"input": "hi", "temperature": 0.25, "top_p": 0.5}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["temperature"].as_f64(), v["top_p"].as_f64()),
        (Some(0.25), Some(0.5))
    );
    let seen = s.backend.last_settings().unwrap().sampler;
    assert_eq!((seen.temperature, seen.top_p), (0.25, 0.5));
    // Unset: the server's defaults (llama.cpp's), echoed as null.
    let r = post(s.app(), "/v1/responses", &json!({"input": "hi"})).await;
    let v = r.json();
    assert_eq!(
        (v["temperature"].clone(), v["top_p"].clone()),
        (Value::Null, Value::Null)
    );
    let seen = s.backend.last_settings().unwrap().sampler;
    let d = hearth_engine::SamplerConfig::default();
    assert_eq!((seen.temperature, seen.top_p), (d.temperature, d.top_p));
    // Streamed: the same settings.
    let r = post(
        s.app(),
        "/v1/responses",
        &json!({"input": "hi", "stream": true, "temperature": 0, "top_p": 0.9}),
    )
    .await;
    assert_eq!(r.status, 200);
    let seen = s.backend.last_settings().unwrap().sampler;
    assert_eq!((seen.temperature, seen.top_p), (0.0, 0.9));
    for (field, value) in [("temperature", json!(-1)), ("top_p", json!(1.5))] {
        let mut body = json!({"input": "hi"});
        body[field] = value;
        let r = post(s.app(), "/v1/responses", &body).await;
        assert_eq!(r.status, 400, "{field}: {}", r.text());
        assert!(r.text().contains(field), "{}", r.text());
    }
}
