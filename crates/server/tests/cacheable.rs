//! Per-call metadata is not rendered: two requests that differ only in fields that change from
//! call to call without meaning anything to the model (ids, nonces, cache markers) render to the
//! same prompt tokens, so the prefix cache reuses the earlier one. Each case comes from what the
//! recorded agent sessions (scripts/agent-sessions) showed changing between calls; content that
//! changes (a date in a system prompt, a tool's output) is rendered, and one case checks that.

mod common;

use common::*;
use serde_json::{json, Value};

/// The prompt the server submitted for `body` at `path`.
async fn prompt(s: &Setup, path: &str, body: &Value) -> Vec<u32> {
    s.backend.take_prompts();
    let r = post(s.app(), path, body).await;
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    s.backend
        .take_prompts()
        .pop()
        .expect("a prompt was submitted")
}

fn anthropic(system: Value, messages: Value) -> Value {
    json!({"model": "m", "max_tokens": 4, "system": system, "messages": messages})
}

const PROMPT: &str = "You are Claude Code, Anthropic's official CLI for Claude.";

#[tokio::test]
async fn billing_header_fields_are_not_rendered() {
    let s = setup("ok", Tpl::Qwen3);
    let user = json!([{"role": "user", "content": "hi"}]);
    let plain = prompt(&s, "/v1/messages", &anthropic(json!(PROMPT), user.clone())).await;
    // Claude Code's own shape: the header is the first `system` block; its version suffix changes
    // per conversation and its `cch` nonce per request.
    for header in [
        "x-anthropic-billing-header: cc_version=2.1.328.286; cc_entrypoint=sdk-cli;",
        "x-anthropic-billing-header: cc_version=2.1.328.7c2; cc_entrypoint=cli; cch=a5145;",
        "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=0f9e1;",
    ] {
        let blocks = json!([{"type": "text", "text": header}, {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}]);
        let p = prompt(&s, "/v1/messages", &anthropic(blocks, user.clone())).await;
        assert_eq!(p, plain, "{header} as its own block");
        // Flattened into one string (as proxies do): the prompt follows the last `;`, or a line
        // break; it is kept.
        for joined in [format!("{header}{PROMPT}"), format!("{header}\n{PROMPT}")] {
            let p = prompt(&s, "/v1/messages", &anthropic(json!(joined), user.clone())).await;
            assert_eq!(p, plain, "{joined:?}");
            let one_block = json!([{"type": "text", "text": joined}]);
            let p = prompt(&s, "/v1/messages", &anthropic(one_block, user.clone())).await;
            assert_eq!(p, plain, "{joined:?} in one block");
        }
        // A system message inside `messages` is a system prompt too.
        let msgs = json!([{"role": "system", "content": format!("{header}{PROMPT}")}, {"role": "user", "content": "hi"}]);
        let p = prompt(&s, "/v1/messages", &anthropic(Value::Null, msgs)).await;
        assert_eq!(p, plain, "{header} in a system message");
    }
}

#[tokio::test]
async fn billing_header_text_elsewhere_is_content() {
    let s = setup("ok", Tpl::Qwen3);
    let header = "x-anthropic-billing-header: cc_version=1; cch=a5145;";
    // Not a header: the prefix without its fields, and the same text in a user turn or a tool
    // result (say, a file the agent read) are what the model must see.
    let a = prompt(
        &s,
        "/v1/messages",
        &anthropic(
            json!("x-anthropic-billing-header: notes"),
            json!([{"role": "user", "content": "hi"}]),
        ),
    )
    .await;
    let b = prompt(
        &s,
        "/v1/messages",
        &anthropic(json!("notes"), json!([{"role": "user", "content": "hi"}])),
    )
    .await;
    assert_ne!(a, b, "a header without fields is text");
    let with = prompt(
        &s,
        "/v1/messages",
        &anthropic(
            json!(PROMPT),
            json!([{"role": "user", "content": format!("{header}hi")}]),
        ),
    )
    .await;
    let without = prompt(
        &s,
        "/v1/messages",
        &anthropic(json!(PROMPT), json!([{"role": "user", "content": "hi"}])),
    )
    .await;
    assert_ne!(with, without, "user text is never stripped");
    let tool = |text: &str| {
        anthropic(
            json!(PROMPT),
            json!([
                {"role": "user", "content": "read it"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "h.txt"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": text}]}
            ]),
        )
    };
    let with = prompt(&s, "/v1/messages", &tool(&format!("{header}rest"))).await;
    let without = prompt(&s, "/v1/messages", &tool("rest")).await;
    assert_ne!(with, without, "a tool result is never stripped");
}

#[tokio::test]
async fn anthropic_metadata_and_cache_markers_are_not_rendered() {
    let s = setup("ok", Tpl::Qwen3);
    // Turn n as Claude Code sends it: `cache_control` on the newest message, which is a block
    // list; `metadata.user_id` with its device and session ids.
    let turn = |user_id: &str, last: Value| {
        json!({
            "model": "m", "max_tokens": 4,
            "metadata": {"user_id": user_id},
            "system": [{"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "<system-reminder>r</system-reminder>"}, {"type": "text", "text": "list files"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
                last
            ],
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "medium"}
        })
    };
    let a = turn(
        r#"{"device_id":"a24c","account_uuid":"","session_id":"b3eb"}"#,
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py", "cache_control": {"type": "ephemeral"}}]}),
    );
    // The same turn as the next request resends it: another session, the marker moved on.
    let b = turn(
        r#"{"device_id":"0ec6","account_uuid":"","session_id":"b62e"}"#,
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a.py"}]}]}),
    );
    assert_eq!(
        prompt(&s, "/v1/messages?beta=true", &a).await,
        prompt(&s, "/v1/messages?beta=true", &b).await
    );
    // The newest user text as a marked block, then as the plain string Claude Code sends the turn
    // after.
    let msgs = |last: Value| anthropic(json!(PROMPT), json!([last]));
    let block = msgs(
        json!({"role": "user", "content": [{"type": "text", "text": "Run the tests.", "cache_control": {"type": "ephemeral"}}]}),
    );
    let string = msgs(json!({"role": "user", "content": "Run the tests."}));
    assert_eq!(
        prompt(&s, "/v1/messages", &block).await,
        prompt(&s, "/v1/messages", &string).await
    );
}

#[tokio::test]
async fn openai_chat_metadata_is_not_rendered() {
    let s = setup("ok", Tpl::Qwen3);
    let base = json!({
        "model": "hearth", "max_tokens": 4,
        "messages": [{"role": "system", "content": "You are opencode."}, {"role": "user", "content": "hi"}]
    });
    let plain = prompt(&s, "/v1/chat/completions", &base).await;
    let mut noisy = base.clone();
    for (k, v) in [
        ("user", json!("u-81f2")),
        ("metadata", json!({"session": "ses_4b1a"})),
        ("prompt_cache_key", json!("ses_4b1a")),
        ("safety_identifier", json!("h-77")),
        ("store", json!(false)),
        ("stream_options", json!({"include_usage": true})),
    ] {
        noisy[k] = v;
    }
    assert_eq!(prompt(&s, "/v1/chat/completions", &noisy).await, plain);
}

#[tokio::test]
async fn responses_metadata_and_item_ids_are_not_rendered() {
    let s = setup("ok", Tpl::Qwen3);
    // Codex's turn: every item carries an id, and `client_metadata` carries the turn's ids and
    // start time, all new on every request.
    let turn = |n: u32| {
        json!({
            "model": "hearth", "max_output_tokens": 4, "store": false,
            "prompt_cache_key": format!("01a2323f-{n}"),
            "client_metadata": {"turn_id": format!("01a23240-{n}"), "x-codex-turn-metadata": format!("{{\"turn_started_at_unix_ms\":{n}}}")},
            "include": ["reasoning.encrypted_content"],
            "input": [
                {"type": "message", "role": "developer", "id": format!("msg_{n}a"), "content": [{"type": "input_text", "text": "You are Codex."}]},
                {"type": "message", "role": "user", "id": format!("msg_{n}b"), "content": [{"type": "input_text", "text": "list files"}]},
                {"type": "function_call", "id": format!("fc_{n}"), "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
                {"type": "function_call_output", "id": format!("fco_{n}"), "call_id": "call_1", "output": "a.py"}
            ],
            "tools": [{"type": "function", "name": "exec_command", "description": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
        })
    };
    assert_eq!(
        prompt(&s, "/v1/responses", &turn(1)).await,
        prompt(&s, "/v1/responses", &turn(2)).await
    );
}

#[tokio::test]
async fn a_changed_date_is_content() {
    // A date in the system prompt (Claude Code, opencode and Codex all send one) is for the model:
    // it is rendered, and a new day is a new prompt.
    let s = setup("ok", Tpl::Qwen3);
    let day = |d: &str| {
        anthropic(
            json!(format!("{PROMPT}\nToday's date is {d}.")),
            json!([{"role": "user", "content": "hi"}]),
        )
    };
    assert_ne!(
        prompt(&s, "/v1/messages", &day("2026-12-01")).await,
        prompt(&s, "/v1/messages", &day("2026-12-02")).await
    );
}
