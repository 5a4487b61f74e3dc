//! Anthropic Messages as current clients (Claude Code) send them: system messages inside
//! `messages`, a `system` list of text blocks with a per-request billing block, adaptive thinking,
//! fields and block types Hearth does not know, `?beta=true`, and `count_tokens` over the same
//! shapes.

mod common;

use common::*;
use serde_json::{json, Value};

async fn count(s: &Setup, body: Value) -> u64 {
    let r = post(s.app(), "/v1/messages/count_tokens?beta=true", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["input_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn claude_code_request_shapes_are_served() {
    let s = setup("Hello there", Tpl::Qwen3);
    let body = json!({
        "model": "claude-sonnet-4-6",
        "max_tokens": 32,
        "stream": false,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328; cc_entrypoint=cli; cch=a1b2c3;"},
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"}, {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "system", "content": "The user switched to plan mode."},
            {"role": "user", "content": "go on"}
        ],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "u"},
        "temperature": 1
    });
    let r = post(s.app(), "/v1/messages?beta=true", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "Hello there");
    assert_eq!(v["stop_reason"], "end_turn");
}

#[tokio::test]
async fn system_messages_inside_messages_are_rendered_where_they_stand() {
    let s = setup("ok", Tpl::Qwen3);
    let base = json!([
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": "second"}
    ]);
    let with_system = json!([
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "system", "content": "Answer in French from now on."},
        {"role": "user", "content": "second"}
    ]);
    let a = count(&s, json!({"messages": base})).await;
    let b = count(&s, json!({"messages": with_system})).await;
    assert!(b > a + 5, "the system message is in the prompt: {a} vs {b}");
    // A template that refuses a system message after the first turn (the fixture's ChatML-like
    // one renders it; this one raises) gets them merged into the first one.
    let strict = setup_with(
        hearth_server::scripted::Script::new("ok"),
        Tpl::Custom(
            "{%- for m in messages %}{%- if m.role == 'system' and not loop.first %}{{ raise_exception('system only first') }}{%- endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}<|im_start|>assistant\n"
                .into(),
        ),
        hearth_server::ServerConfig::default(),
        4096,
    );
    let merged = count(
        &strict,
        json!({"system": "Be brief.", "messages": with_system}),
    )
    .await;
    let plain = count(&strict, json!({"system": "Be brief.", "messages": base})).await;
    assert!(
        merged > plain + 5,
        "merged, not dropped: {plain} vs {merged}"
    );
    let r = post(
        strict.app(),
        "/v1/messages",
        &json!({"max_tokens": 5, "system": "Be brief.", "messages": with_system}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn the_billing_header_is_not_part_of_the_prompt() {
    let s = setup("ok", Tpl::Qwen3);
    let with = |nonce: &str| {
        json!({
            "system": [
                {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.328; cch={nonce};")},
                {"type": "text", "text": "You are a coding agent."}
            ],
            "messages": [{"role": "user", "content": "hi"}]
        })
    };
    let without = json!({"system": [{"type": "text", "text": "You are a coding agent."}],
        "messages": [{"role": "user", "content": "hi"}]});
    let (a, b, c) = (
        count(&s, with("1f2e")).await,
        count(&s, with("99aa77")).await,
        count(&s, without).await,
    );
    assert_eq!((a, b), (c, c), "the nonce block does not change the prompt");
}

#[tokio::test]
async fn thinking_adaptive_enabled_disabled_and_omitted() {
    let s = setup("<think>\nplan\n</think>\n\nanswer", Tpl::Qwen3);
    let ask = |thinking: Value| json!({"max_tokens": 50, "thinking": thinking, "messages": [{"role": "user", "content": "q"}]});
    for kind in ["adaptive", "enabled"] {
        let r = post(s.app(), "/v1/messages", &ask(json!({"type": kind}))).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let c = &r.json()["content"];
        assert_eq!(c[0]["type"], "thinking", "{kind}: {c}");
        assert_eq!(c[0]["thinking"], "plan");
        assert_eq!(c[1]["text"], "answer");
    }
    let r = post(
        s.app(),
        "/v1/messages",
        &ask(json!({"type": "adaptive", "display": "omitted"})),
    )
    .await;
    let c = &r.json()["content"];
    assert_eq!(c.as_array().unwrap().len(), 1, "{c}");
    assert_eq!(c[0]["text"], "answer");
    // Streamed: no thinking block, and no signature_delta anywhere.
    let mut body = ask(json!({"type": "adaptive", "display": "omitted"}));
    body["stream"] = json!(true);
    let r = post(s.app(), "/v1/messages", &body).await;
    let text = r.text();
    assert!(!text.contains("thinking_delta"), "{text}");
    assert!(!text.contains("signature_delta"), "{text}");
    let r = post(s.app(), "/v1/messages", &ask(json!({"type": "sometimes"}))).await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("thinking.type"), "{}", r.text());
}

#[tokio::test]
async fn streamed_events_come_in_the_sdk_order() {
    let s = setup("Hi", Tpl::Fixture);
    let r = post(
        s.app(),
        "/v1/messages?beta=true",
        &json!({"max_tokens": 20, "stream": true, "messages": [{"role": "user", "content": "q"}]}),
    )
    .await;
    let mut events: Vec<String> = sse_frames(&r.text())
        .into_iter()
        .map(|(e, _)| e.unwrap())
        .collect();
    events.dedup();
    assert_eq!(
        events,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
}

#[tokio::test]
async fn unknown_blocks_are_ignored_and_images_refused() {
    let s = setup("ok", Tpl::Fixture);
    let r = post(
        s.app(),
        "/v1/messages",
        &json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi"}, {"type": "server_tool_use", "id": "x", "name": "web_search", "input": {}}
        ]}]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    for kind in ["image", "document"] {
        let r = post(
            s.app(),
            "/v1/messages",
            &json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": kind, "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
            ]}]}),
        )
        .await;
        assert_eq!(r.status, 400, "{kind}");
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
        assert!(r.text().contains(kind), "{}", r.text());
    }
}

#[tokio::test]
async fn thinking_disabled_turns_the_templates_thinking_off() {
    let s = setup("answer", Tpl::Qwen3);
    let ask = |thinking: Value| json!({"max_tokens": 50, "thinking": thinking, "messages": [{"role": "user", "content": "q"}]});
    let r = post(s.app(), "/v1/messages", &ask(json!({"type": "disabled"}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Qwen3's template closes an empty think block when `enable_thinking` is false.
    let off = s.last_prompt();
    assert!(
        off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{off:?}"
    );
    assert_eq!(
        r.json()["content"],
        json!([{"type": "text", "text": "answer"}])
    );
    post(
        s.app(),
        "/v1/messages",
        &ask(json!({"type": "enabled", "budget_tokens": 1024})),
    )
    .await;
    let on = s.last_prompt();
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on:?}");
    // No `thinking` field: the template's default (on, for Qwen3).
    let mut body = ask(Value::Null);
    body.as_object_mut().unwrap().remove("thinking");
    post(s.app(), "/v1/messages", &body).await;
    assert_eq!(s.last_prompt(), on);
    // count_tokens renders the same prompt.
    let n_off = count(&s, ask(json!({"type": "disabled"}))).await;
    let n_on = count(&s, ask(json!({"type": "enabled", "budget_tokens": 1024}))).await;
    assert!(n_off > n_on, "{n_off} vs {n_on}");
}

#[tokio::test]
async fn streamed_thinking_text_and_tool_use_events_in_order_without_signature_delta() {
    let reply = "<think>\nplan\n</think>\n\nRunning it.\n<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";
    let s = setup(reply, Tpl::Qwen3);
    let r = post(
        s.app(),
        "/v1/messages?beta=true",
        &json!({"max_tokens": 200, "stream": true, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tools": [{"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
            "messages": [{"role": "user", "content": "q"}]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Each event with the kind of block or delta it carries; consecutive repeats folded.
    let mut seen: Vec<String> = sse_frames(&r.text())
        .into_iter()
        .map(|(e, data)| {
            let e = e.unwrap();
            let v: Value = serde_json::from_str(&data).unwrap();
            assert_eq!(v["type"], e.as_str(), "event name matches data type");
            match e.as_str() {
                "content_block_start" => {
                    format!("{e} {}", v["content_block"]["type"].as_str().unwrap())
                }
                "content_block_delta" => format!("{e} {}", v["delta"]["type"].as_str().unwrap()),
                _ => e,
            }
        })
        .collect();
    seen.dedup();
    assert_eq!(
        seen,
        [
            "message_start",
            "content_block_start thinking",
            "ping",
            "content_block_delta thinking_delta",
            "content_block_stop",
            "content_block_start text",
            "content_block_delta text_delta",
            "content_block_stop",
            "content_block_start tool_use",
            "content_block_delta input_json_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "Hearth sends no thinking signature, so no signature_delta"
    );
    // The whole reply's thinking block carries an empty signature, which the SDKs accept.
    let r = post(
        s.app(),
        "/v1/messages",
        &json!({"max_tokens": 200, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "q"}]}),
    )
    .await;
    assert_eq!(
        r.json()["content"][0],
        json!({"type": "thinking", "thinking": "plan", "signature": ""})
    );
}
