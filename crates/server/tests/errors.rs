//! Every bad-input case answers the right status with the error body of its API.

mod common;

use common::*;
use hearth_engine::Backend;
use hearth_server::ServerConfig;
use serde_json::{json, Value};

fn assert_openai(r: &Reply, status: u16, needle: &str) {
    assert_eq!(r.status.as_u16(), status, "{}", r.text());
    let v = r.json();
    let e = &v["error"];
    assert!(
        e["message"].as_str().unwrap().contains(needle),
        "message {:?} lacks {needle:?}",
        e["message"]
    );
    assert!(e["type"].is_string());
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
}

fn assert_anthropic(r: &Reply, status: u16, kind: &str, needle: &str) {
    assert_eq!(r.status.as_u16(), status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], kind);
    assert!(
        v["error"]["message"].as_str().unwrap().contains(needle),
        "{v}"
    );
}

fn assert_ollama(r: &Reply, status: u16, needle: &str) {
    assert_eq!(r.status.as_u16(), status, "{}", r.text());
    let v = r.json();
    assert!(v["error"].as_str().unwrap().contains(needle), "{v}");
}

const MSG: &str = r#"[{"role":"user","content":"hi"}]"#;

#[tokio::test]
async fn openai_bad_input() {
    let s = setup("Hello there", Tpl::Fixture);
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "/v1/chat/completions",
            "{not json".into(),
            "invalid request body",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": "hi"}"#.into(),
            "invalid request body",
        ),
        (
            "/v1/chat/completions",
            r#"{"model": "x"}"#.into(),
            "messages",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "max_tokens": -1}}"#),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "max_tokens": 0}}"#),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "max_tokens": 1000000000000}}"#),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "max_completion_tokens": 99999999999999999999999}}"#),
            "invalid request body",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "temperature": NaN}}"#),
            "invalid request body",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "temperature": "hot"}}"#),
            "invalid request body",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "temperature": -0.5}}"#),
            "temperature",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "top_p": 1.5}}"#),
            "top_p",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "top_k": -3}}"#),
            "top_k",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "n": 5}}"#),
            "--parallel 4",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "n": 0}}"#),
            "`n`",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "logprobs": true, "top_logprobs": 21}}"#),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": {MSG}, "logit_bias": {{"99999999": 1}}}}"#),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": []}"#.into(),
            "messages",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "wizard", "content": "x"}]}"#.into(),
            "role",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": 5}]}"#.into(),
            "content",
        ),
        ("/v1/completions", r#"{"prompt": 5}"#.into(), "prompt"),
        (
            "/v1/completions",
            r#"{"prompt": [1, 2, 99999999]}"#.into(),
            "vocabulary",
        ),
        ("/v1/completions", r#"{"prompt": ""}"#.into(), "empty"),
        (
            "/v1/completions",
            r#"{"prompt": "x", "logprobs": 99}"#.into(),
            "logprobs",
        ),
        (
            "/detokenize",
            r#"{"tokens": [1, 99999999]}"#.into(),
            "vocabulary",
        ),
        ("/detokenize", r#"{"tokens": [-1]}"#.into(), "vocabulary"),
        (
            "/tokenize",
            r#"{"content": 7}"#.into(),
            "invalid request body",
        ),
    ];
    for (path, body, needle) in cases {
        let r = send(s.app(), "POST", path, &body, &[]).await;
        assert_openai(&r, 400, needle);
    }
}

#[tokio::test]
async fn prompt_longer_than_context_names_both_sizes() {
    let s = setup_with(
        hearth_server::scripted::Script::new("x"),
        Tpl::Fixture,
        ServerConfig::default(),
        32,
    );
    let long = "word ".repeat(100);
    let r = post(
        s.app(),
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": long}]}),
    )
    .await;
    assert_openai(&r, 400, "context per sequence is 32 tokens");
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        m.starts_with("the prompt has ")
            && m[15..].split(' ').next().unwrap().parse::<usize>().unwrap() > 32,
        "{m}"
    );
    let r = post(
        s.app(),
        "/v1/messages",
        &json!({"max_tokens": 5, "messages": [{"role": "user", "content": long}]}),
    )
    .await;
    assert_anthropic(
        &r,
        400,
        "invalid_request_error",
        "context per sequence is 32",
    );
    let r = post(
        s.app(),
        "/api/chat",
        &json!({"messages": [{"role": "user", "content": long}]}),
    )
    .await;
    assert_ollama(&r, 400, "context per sequence is 32");
    let r = post(s.app(), "/v1/completions", &json!({"prompt": long})).await;
    assert_openai(&r, 400, "context per sequence is 32");
}

#[tokio::test]
async fn anthropic_bad_input() {
    let s = setup("Hello", Tpl::Fixture);
    let cases: Vec<(&str, String, &str)> = vec![
        ("/v1/messages", "{".into(), "invalid request body"),
        (
            "/v1/messages",
            r#"{"max_tokens": 5, "messages": {"a": 1}}"#.into(),
            "invalid request body",
        ),
        (
            "/v1/messages",
            format!(r#"{{"max_tokens": -5, "messages": {MSG}}}"#),
            "max_tokens",
        ),
        (
            "/v1/messages",
            format!(r#"{{"max_tokens": 10000000000, "messages": {MSG}}}"#),
            "max_tokens",
        ),
        (
            "/v1/messages",
            format!(r#"{{"max_tokens": 5, "temperature": -1, "messages": {MSG}}}"#),
            "temperature",
        ),
        (
            "/v1/messages",
            format!(r#"{{"max_tokens": 5, "top_p": 2, "messages": {MSG}}}"#),
            "top_p",
        ),
        (
            "/v1/messages",
            r#"{"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}"#.into(),
            "role",
        ),
        (
            "/v1/messages",
            r#"{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}"#
                .into(),
            "image",
        ),
        (
            "/v1/messages/count_tokens",
            r#"{"messages": 3}"#.into(),
            "invalid request body",
        ),
    ];
    for (path, body, needle) in cases {
        let r = send(s.app(), "POST", path, &body, &[]).await;
        assert_anthropic(&r, 400, "invalid_request_error", needle);
    }
}

#[tokio::test]
async fn ollama_bad_input() {
    let s = setup("Hello", Tpl::Fixture);
    let cases: Vec<(&str, String, &str)> = vec![
        ("/api/chat", "[".into(), "invalid request body"),
        ("/api/chat", r#"{"messages": [{"role": "user", "content": "x"}], "options": {"temperature": "x"}}"#.into(), "invalid request body"),
        ("/api/chat", r#"{"messages": [{"role": "user", "content": "x"}], "options": {"temperature": -2}}"#.into(), "temperature"),
        ("/api/chat", r#"{"messages": [{"role": "user", "content": "x"}], "options": {"top_p": 3}}"#.into(), "top_p"),
        ("/api/chat", r#"{"messages": [{"role": "user", "content": "x"}], "options": {"num_predict": 100000000000}}"#.into(), "num_predict"),
        ("/api/chat", r#"{"messages": [{"role": "user", "content": "x"}], "think": 5}"#.into(), "think"),
        ("/api/generate", r#"{"prompt": 5}"#.into(), "invalid request body"),
        ("/api/generate", r#"{"prompt": "x", "options": {"num_ctx": -1}}"#.into(), "num_ctx"),
    ];
    for (path, body, needle) in cases {
        let r = send(s.app(), "POST", path, &body, &[]).await;
        assert_ollama(&r, 400, needle);
    }
}

#[tokio::test]
async fn unknown_fields_and_any_model_are_accepted() {
    let s = setup("Hello", Tpl::Fixture);
    let r = post(s.app(), "/v1/chat/completions", &json!({"model": "gpt-17", "metadata": {"a": 1}, "store": true,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "gpt-17");
    let r = post(
        s.app(),
        "/v1/messages",
        &json!({"model": "claude-x", "max_tokens": 9, "metadata": {"user_id": "u"},
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let cfg = ServerConfig {
        max_body: 1024,
        ..ServerConfig::default()
    };
    let s = setup_with(
        hearth_server::scripted::Script::new("x"),
        Tpl::Fixture,
        cfg,
        512,
    );
    let big = json!({"messages": [{"role": "user", "content": "a".repeat(4000)}]});
    let r = post(s.app(), "/v1/chat/completions", &big).await;
    assert_openai(&r, 413, "limit");
    let r = post(
        s.app(),
        "/v1/messages",
        &json!({"max_tokens": 3, "messages": [{"role": "user", "content": "a".repeat(4000)}]}),
    )
    .await;
    assert_anthropic(&r, 413, "request_too_large", "limit");
    let r = post(s.app(), "/api/chat", &big).await;
    assert_ollama(&r, 413, "limit");
}

#[tokio::test]
async fn api_key_is_required_except_for_health() {
    let cfg = ServerConfig {
        api_key: Some("sekrit".into()),
        ..ServerConfig::default()
    };
    let s = setup_with(
        hearth_server::scripted::Script::new("ok"),
        Tpl::Fixture,
        cfg,
        512,
    );
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).to_string();
    let r = send(s.app(), "POST", "/v1/chat/completions", &body, &[]).await;
    assert_openai(&r, 401, "missing API key");
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    assert!(
        r.headers
            .get("www-authenticate")
            .is_some_and(|v| v.to_str().unwrap().starts_with("Bearer")),
        "a 401 names its scheme"
    );
    // The scheme name is case-insensitive (RFC 9110).
    for scheme in ["BEARER", "bearer", "Bearer", "bEaReR"] {
        let auth = format!("{scheme} sekrit");
        let r = send(
            s.app(),
            "POST",
            "/v1/chat/completions",
            &body,
            &[("authorization", auth.as_str())],
        )
        .await;
        assert_eq!(r.status, 200, "{scheme}");
    }
    let r = send(
        s.app(),
        "POST",
        "/v1/chat/completions",
        &body,
        &[("authorization", "Bearer wrong!")],
    )
    .await;
    assert_openai(&r, 401, "invalid API key");
    let r = send(
        s.app(),
        "POST",
        "/v1/chat/completions",
        &body,
        &[("authorization", "Bearer sekrit")],
    )
    .await;
    assert_eq!(r.status, 200);
    let r = send(
        s.app(),
        "POST",
        "/v1/chat/completions",
        &body,
        &[("x-api-key", "sekrit")],
    )
    .await;
    assert_eq!(r.status, 200);
    let ab = json!({"max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let r = send(
        s.app(),
        "POST",
        "/v1/messages",
        &ab,
        &[("x-api-key", "sekrix")],
    )
    .await;
    assert_anthropic(&r, 401, "authentication_error", "invalid API key");
    let r = send(
        s.app(),
        "POST",
        "/v1/messages",
        &ab,
        &[("x-api-key", "sekrit")],
    )
    .await;
    assert_eq!(r.status, 200);
    let r = send(s.app(), "GET", "/api/tags", "", &[]).await;
    assert_ollama(&r, 401, "API key");
    let r = send(s.app(), "GET", "/health", "", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"status": "ok"}));
    let r = send(s.app(), "GET", "/metrics", "", &[]).await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn full_queue_is_503_with_retry_after() {
    let s = setup("x", Tpl::Fixture);
    s.backend.set_queue_full(true);
    let r = post(
        s.app(),
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_openai(&r, 503, "busy");
    assert_eq!(r.headers["retry-after"], "1");
    let r = post(
        s.app(),
        "/v1/messages",
        &json!({"max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_anthropic(&r, 503, "overloaded_error", "busy");
    assert_eq!(r.headers["retry-after"], "1");
    let r = post(s.app(), "/api/generate", &json!({"prompt": "hi"})).await;
    assert_ollama(&r, 503, "busy");
    assert!(r.headers.contains_key("retry-after"));
}

#[tokio::test]
async fn health_is_503_while_loading() {
    let state = hearth_server::AppState::loading(ServerConfig::default());
    let r = send(hearth_server::app(state.clone()), "GET", "/health", "", &[]).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json(), json!({"status": "loading"}));
    let r = post(
        hearth_server::app(state.clone()),
        "/v1/chat/completions",
        &json!({"messages": []}),
    )
    .await;
    assert_openai(&r, 503, "loading");
    let s = setup("x", Tpl::Fixture);
    let r = send(s.app(), "GET", "/health", "", &[]).await;
    assert_eq!(
        (r.status.as_u16(), r.json()),
        (200, json!({"status": "ok"}))
    );
}

#[tokio::test]
async fn unknown_path_is_404_in_its_api_shape() {
    let s = setup("x", Tpl::Fixture);
    let r = send(s.app(), "GET", "/v1/nothing", "", &[]).await;
    assert_openai(&r, 404, "/v1/nothing");
    let r = send(s.app(), "GET", "/api/nothing", "", &[]).await;
    assert_ollama(&r, 404, "/api/nothing");
    let _: Value = r.json();
}

/// An engine error after a few tokens (a failed step) in each API's shape: a 500 error body when
/// the reply is whole; in a stream, the deltas already sent, then the API's error frame and none
/// of its closing frames. The sequence is not left counted.
#[tokio::test]
async fn engine_errors_in_each_api_shape_whole_and_streamed() {
    let mut script = hearth_server::scripted::Script::new("one two three four five six");
    script.cuts = hearth_server::scripted::Cuts::Chars(4);
    script.fail_after = Some(3);
    let s = setup_with(script, Tpl::Fixture, ServerConfig::default(), 512);
    let msgs: Value = serde_json::from_str(MSG).unwrap();
    const NEEDLE: &str = "scripted failure after 3 pieces";
    let with = |mut v: Value, stream: bool| {
        v["stream"] = json!(stream);
        v
    };
    let chat = json!({"messages": msgs, "max_tokens": 50});
    let prompt = json!({"prompt": "hi", "max_tokens": 50});
    let input = json!({"input": "hi", "max_output_tokens": 50});

    // Whole replies.
    for (path, body) in [
        ("/v1/chat/completions", &chat),
        ("/v1/completions", &prompt),
    ] {
        let r = post(s.app(), path, &with(body.clone(), false)).await;
        assert_openai(&r, 500, NEEDLE);
        assert_eq!(r.json()["error"]["type"], "server_error", "{path}");
    }
    let r = post(s.app(), "/v1/responses", &with(input.clone(), false)).await;
    assert_openai(&r, 500, NEEDLE);
    let r = post(s.app(), "/v1/messages", &with(chat.clone(), false)).await;
    assert_anthropic(&r, 500, "api_error", NEEDLE);
    for (path, body) in [("/api/chat", &chat), ("/api/generate", &prompt)] {
        let r = post(s.app(), path, &with(body.clone(), false)).await;
        assert_ollama(&r, 500, NEEDLE);
    }
    assert_eq!(s.backend.stats().active, 0);

    // Streamed: OpenAI chat and completions end with an error frame and no `[DONE]`.
    for (path, body) in [
        ("/v1/chat/completions", &chat),
        ("/v1/completions", &prompt),
    ] {
        let r = post(s.app(), path, &with(body.clone(), true)).await;
        assert_eq!(r.status, 200, "{path}: the stream had started");
        let frames = sse_frames(&r.text());
        assert!(
            frames.len() >= 2,
            "{path}: deltas before the error: {frames:?}"
        );
        assert!(
            frames.iter().all(|(_, d)| d != "[DONE]"),
            "{path}: {frames:?}"
        );
        let last: Value = serde_json::from_str(&frames.last().unwrap().1).unwrap();
        assert!(
            last["error"]["message"].as_str().unwrap().contains(NEEDLE),
            "{path}: {last}"
        );
        assert_eq!(last["error"]["type"], "server_error", "{path}");
        let first: Value = serde_json::from_str(&frames[0].1).unwrap();
        assert!(first.get("error").is_none(), "{path}: {first}");
    }
    // Responses: `response.failed` last, carrying the message.
    let r = post(s.app(), "/v1/responses", &with(input.clone(), true)).await;
    assert_eq!(r.status, 200);
    let frames = sse_frames(&r.text());
    let (ev, data) = frames.last().unwrap();
    assert_eq!(ev.as_deref(), Some("response.failed"), "{frames:?}");
    let last: Value = serde_json::from_str(data).unwrap();
    assert_eq!(last["response"]["status"], "failed");
    assert!(last["response"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains(NEEDLE));
    assert!(frames
        .iter()
        .any(|(e, _)| e.as_deref() == Some("response.output_text.delta")));
    assert!(frames
        .iter()
        .all(|(e, _)| e.as_deref() != Some("response.completed")));
    // Anthropic: an `error` event with the error body, after the deltas; no `message_stop`.
    let r = post(s.app(), "/v1/messages", &with(chat.clone(), true)).await;
    assert_eq!(r.status, 200);
    let frames = sse_frames(&r.text());
    let (ev, data) = frames.last().unwrap();
    assert_eq!(ev.as_deref(), Some("error"), "{frames:?}");
    let last: Value = serde_json::from_str(data).unwrap();
    assert_eq!(last["type"], "error");
    assert_eq!(last["error"]["type"], "api_error");
    assert!(last["error"]["message"].as_str().unwrap().contains(NEEDLE));
    assert!(frames
        .iter()
        .any(|(e, _)| e.as_deref() == Some("content_block_delta")));
    assert!(frames
        .iter()
        .all(|(e, _)| e.as_deref() != Some("message_stop")));
    // Ollama: a last NDJSON line `{"error": ...}`, and no line with `done: true`.
    for (path, body) in [("/api/chat", &chat), ("/api/generate", &prompt)] {
        let r = post(s.app(), path, &with(body.clone(), true)).await;
        assert_eq!(r.status, 200, "{path}");
        let lines = ndjson_lines(&r.text());
        assert!(lines.len() >= 2, "{path}: {lines:?}");
        let last = lines.last().unwrap();
        assert!(
            last["error"].as_str().unwrap().contains(NEEDLE),
            "{path}: {last}"
        );
        assert!(
            lines.iter().all(|l| l["done"] != json!(true)),
            "{path}: {lines:?}"
        );
    }
    assert_eq!(s.backend.stats().active, 0);
}
