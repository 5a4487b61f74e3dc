//! Structured output through the handlers: each API's fields become a grammar the backend receives
//! (the scripted backend plays its reply only if the grammar accepts it), forced tool calls come back
//! as tool calls, and bad schemas or grammars are 400s in the API's own shape naming the problem.

mod common;

use common::*;
use serde_json::{json, Value};

const CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

fn msgs() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}])
}

#[tokio::test]
async fn openai_json_schema_reaches_the_backend_and_holds_it_to_the_schema() {
    let s = setup("{\"a\": 7, \"b\": [\"x\"]}", Tpl::Fixture);
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}}, "required": ["a"]});
    let rf = json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": true}});
    let r = post(
        s.app(),
        "/v1/chat/completions",
        &json!({"messages": msgs(), "response_format": rf}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "{\"a\": 7, \"b\": [\"x\"]}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(s.backend.constrained(), 1);
    // The same reply under a schema it breaks is refused by the grammar, not passed off.
    let bad = json!({"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}});
    let r = post(
        s.app(),
        "/v1/chat/completions",
        &json!({"messages": msgs(), "response_format": bad}),
    )
    .await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("refuses"), "{}", r.text());
    // json_object, llama-server's grammar and json_schema fields, and the completions endpoint.
    for extra in [
        json!({"response_format": {"type": "json_object"}}),
        json!({"json_schema": {"type": "object"}}),
        json!({"grammar": "root ::= \"{\" [^}]* \"}\"\n"}),
    ] {
        let mut body = json!({"messages": msgs()});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = post(s.app(), "/v1/chat/completions", &body).await;
        assert_eq!(r.status, 200, "{extra}: {}", r.text());
        let mut body = json!({"prompt": "x"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = post(s.app(), "/v1/completions", &body).await;
        assert_eq!(r.status, 200, "{extra}: {}", r.text());
    }
    assert_eq!(s.backend.constrained(), 8);
    // No constraint asked, none sent.
    let r = post(
        s.app(),
        "/v1/chat/completions",
        &json!({"messages": msgs(), "response_format": {"type": "text"}}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(s.backend.constrained(), 8);
}

#[tokio::test]
async fn forced_tool_calls_come_back_as_tool_calls() {
    let s = setup(CALL, Tpl::Qwen3);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let r = post(
            s.app(),
            "/v1/chat/completions",
            &json!({"messages": msgs(), "tools": tools(), "tool_choice": choice}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let c = &r.json()["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(
            c["message"]["tool_calls"][0]["function"]["name"],
            "get_weather"
        );
        assert_eq!(
            c["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
    }
    // `strict` alone: a call or plain text, the call held to the schema.
    let mut strict = tools();
    strict[0]["function"]["strict"] = json!(true);
    let r = post(
        s.app(),
        "/v1/chat/completions",
        &json!({"messages": msgs(), "tools": strict}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.backend.constrained(), 3);
    // Anthropic: `any` and a named tool.
    let atools =
        json!([{"name": "get_weather", "input_schema": tools()[0]["function"]["parameters"]}]);
    for choice in [
        json!({"type": "any"}),
        json!({"type": "tool", "name": "get_weather"}),
    ] {
        let r = post(
            s.app(),
            "/v1/messages",
            &json!({"messages": msgs(), "max_tokens": 50, "tools": atools, "tool_choice": choice}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["stop_reason"], "tool_use");
        assert_eq!(v["content"][0]["input"], json!({"city": "Paris"}));
    }
    assert_eq!(s.backend.constrained(), 5);
    // A call to a tool the grammar does not allow is refused.
    let other = json!([{"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}]);
    let r = post(
        s.app(),
        "/v1/chat/completions",
        &json!({"messages": msgs(), "tools": other, "tool_choice": "required"}),
    )
    .await;
    assert_eq!(r.status, 500, "{}", r.text());
}

#[tokio::test]
async fn ollama_format() {
    let s = setup("{\"n\": 1}", Tpl::Fixture);
    for format in [
        json!("json"),
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    ] {
        let r = post(
            s.app(),
            "/api/chat",
            &json!({"messages": msgs(), "format": format, "stream": false}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["message"]["content"], "{\"n\": 1}");
        let r = post(
            s.app(),
            "/api/generate",
            &json!({"prompt": "x", "format": format, "stream": false}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["response"], "{\"n\": 1}");
    }
    assert_eq!(s.backend.constrained(), 4);
}

#[tokio::test]
async fn bad_schemas_and_grammars_are_400s_naming_the_problem() {
    let s = setup(CALL, Tpl::Qwen3);
    let openai = |body: Value, needle: &'static str, param: &'static str| {
        let app = s.app();
        async move {
            let r = post(app, "/v1/chat/completions", &body).await;
            assert_eq!(r.status, 400, "{}", r.text());
            let e = &r.json()["error"];
            assert!(
                e["message"].as_str().unwrap().contains(needle),
                "{e} lacks {needle}"
            );
            assert_eq!(e["type"], "invalid_request_error");
            if !param.is_empty() {
                assert_eq!(e["param"], param, "{e}");
            }
        }
    };
    let schema = |s: Value| json!({"messages": msgs(), "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}});
    openai(
        schema(json!({"type": "array", "uniqueItems": true})),
        "uniqueItems",
        "response_format",
    )
    .await;
    openai(
        schema(json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}})),
        "nope",
        "response_format",
    )
    .await;
    openai(
        schema(json!({"type": "strang"})),
        "strang",
        "response_format",
    )
    .await;
    openai(schema(json!(5)), "a number", "response_format").await;
    openai(
        json!({"messages": msgs(), "response_format": {"type": "json_schema"}}),
        "schema",
        "response_format",
    )
    .await;
    openai(
        json!({"messages": msgs(), "response_format": {"type": "yaml"}}),
        "yaml",
        "response_format",
    )
    .await;
    openai(
        json!({"messages": msgs(), "grammar": "root ::= \"a\"\nbad := x\n"}),
        "line 2, column 5",
        "grammar",
    )
    .await;
    openai(
        json!({"messages": msgs(), "grammar": "root ::= missing\n"}),
        "undefined rule `missing`",
        "grammar",
    )
    .await;
    openai(json!({"messages": msgs(), "grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}}), "only one", "").await;
    openai(json!({"messages": msgs(), "tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "nope", "").await;
    openai(
        json!({"messages": msgs(), "tool_choice": "required"}),
        "no tools",
        "",
    )
    .await;
    let mut bad_tool = tools();
    bad_tool[0]["function"]["parameters"] =
        json!({"type": "object", "properties": {"x": {"type": "array", "contains": {}}}});
    openai(
        json!({"messages": msgs(), "tools": bad_tool, "tool_choice": "required"}),
        "contains",
        "tools",
    )
    .await;
    // Anthropic and Ollama shapes.
    let r = post(s.app(), "/v1/messages", &json!({"messages": msgs(), "max_tokens": 9, "tool_choice": {"type": "any"},
        "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "array", "uniqueItems": true}}}}]})).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("uniqueItems"),
        "{}",
        r.text()
    );
    let r = post(
        s.app(),
        "/api/chat",
        &json!({"messages": msgs(), "format": {"type": "array", "uniqueItems": true}}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.json()["error"].as_str().unwrap().contains("uniqueItems"),
        "{}",
        r.text()
    );
    let r = post(
        s.app(),
        "/api/generate",
        &json!({"prompt": "x", "format": "xml"}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    // A template without a tool-call syntax cannot force a call.
    let f = setup(CALL, Tpl::Fixture);
    let r = post(
        f.app(),
        "/v1/chat/completions",
        &json!({"messages": msgs(), "tools": tools(), "tool_choice": "required"}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("tool-call syntax"), "{}", r.text());
    assert_eq!(s.backend.constrained() + f.backend.constrained(), 0);
}
