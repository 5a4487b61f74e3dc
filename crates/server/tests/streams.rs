//! Replies through the real HTTP stack with the scripted backend: reasoning and tool calls are
//! split the same streamed and not, at every cut of the text; SSE, Anthropic event and NDJSON
//! framing; n choices, logprobs, stop strings, usage, utility endpoints and metrics.

mod common;

use std::collections::BTreeMap;

use common::*;
use hearth_engine::Backend;
use hearth_server::scripted::{Cuts, Script};
use hearth_server::ServerConfig;
use serde_json::{json, Value};

const QWEN3_REPLY: &str = "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const CODER_REPLY: &str = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

fn openai_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}])
}

fn anthropic_tools() -> Value {
    json!([{"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}])
}

/// (content, reasoning, [(id, name, arguments)], finish reason).
type Msg = (
    String,
    Option<String>,
    Vec<(String, String, String)>,
    String,
);

/// The OpenAI message assembled from a stream: (content, reasoning, [(id, name, args)], finish).
fn fold_openai_stream(body: &str) -> (Msg, Value) {
    let frames = sse_frames(body);
    assert_eq!(frames.last().unwrap().1, "[DONE]");
    let (mut content, mut reasoning, mut finish, mut usage) =
        (String::new(), None::<String>, String::new(), Value::Null);
    let mut calls: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    for (ev, data) in &frames[..frames.len() - 1] {
        assert!(ev.is_none());
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        if let Some(u) = v.get("usage") {
            usage = u.clone();
        }
        for c in v["choices"].as_array().unwrap() {
            let d = &c["delta"];
            if let Some(s) = d["content"].as_str() {
                content.push_str(s);
            }
            if let Some(s) = d["reasoning_content"].as_str() {
                reasoning.get_or_insert_with(String::new).push_str(s);
            }
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                let e = calls.entry(tc["index"].as_u64().unwrap()).or_default();
                if let Some(id) = tc["id"].as_str() {
                    e.0 = id.to_string();
                }
                if let Some(n) = tc["function"]["name"].as_str() {
                    e.1 = n.to_string();
                }
                e.2.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
    }
    (
        (content, reasoning, calls.into_values().collect(), finish),
        usage,
    )
}

fn openai_message(v: &Value) -> Msg {
    let c = &v["choices"][0];
    let m = &c["message"];
    let calls = m["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["id"].as_str().unwrap().to_string(),
                t["function"]["name"].as_str().unwrap().to_string(),
                t["function"]["arguments"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (
        m["content"].as_str().unwrap_or("").to_string(),
        m["reasoning_content"].as_str().map(str::to_string),
        calls,
        c["finish_reason"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn openai_reasoning_and_json_tool_call_at_every_cut() {
    let s = setup(QWEN3_REPLY, Tpl::Qwen3);
    let body = |stream: bool| {
        json!({"model": "m", "seed": 7, "stream": stream, "tools": openai_tools(),
               "messages": [{"role": "user", "content": "Weather in Paris?"}]})
    };
    let r = post(s.app(), "/v1/chat/completions", &body(false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let whole = openai_message(&r.json());
    assert_eq!(whole.0, "Let me check.");
    assert_eq!(whole.1.as_deref(), Some("The user wants weather."));
    assert_eq!(whole.2.len(), 1);
    assert_eq!(whole.2[0].1, "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(&whole.2[0].2).unwrap(),
        json!({"city": "Paris"})
    );
    assert_eq!(whole.3, "tool_calls");
    let mut cuts: Vec<Cuts> = vec![Cuts::Tokens, Cuts::Chars(1), Cuts::Chars(3)];
    cuts.extend((1..QWEN3_REPLY.len()).map(|k| Cuts::At(vec![k])));
    for c in cuts {
        let mut script = Script::new(QWEN3_REPLY);
        script.cuts = c.clone();
        s.backend.set_script(script);
        let r = post(s.app(), "/v1/chat/completions", &body(true)).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["content-type"], "text/event-stream");
        let ((content, reasoning, calls, finish), _) = fold_openai_stream(&r.text());
        assert_eq!(
            (content, reasoning, calls, finish),
            whole.clone(),
            "cuts {c:?}"
        );
        let r = post(s.app(), "/v1/chat/completions", &body(false)).await;
        assert_eq!(openai_message(&r.json()), whole, "non-streamed, cuts {c:?}");
    }
}

#[tokio::test]
async fn openai_coder_xml_tool_call_streams_as_parsed() {
    let s = setup(CODER_REPLY, Tpl::Coder);
    let body = |stream: bool| {
        json!({"seed": 1, "stream": stream, "tools": openai_tools(), "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "And Paris for 3 days?"}]})
    };
    let r = post(s.app(), "/v1/chat/completions", &body(false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let whole = openai_message(&r.json());
    assert_eq!(whole.0, "Checking.");
    assert_eq!(
        serde_json::from_str::<Value>(&whole.2[0].2).unwrap(),
        json!({"city": "Paris", "days": 3})
    );
    for c in [Cuts::Tokens, Cuts::Chars(1), Cuts::Chars(7)] {
        let mut script = Script::new(CODER_REPLY);
        script.cuts = c.clone();
        s.backend.set_script(script);
        let r = post(s.app(), "/v1/chat/completions", &body(true)).await;
        let ((content, reasoning, calls, finish), _) = fold_openai_stream(&r.text());
        assert_eq!(
            (content, reasoning, calls, finish),
            whole.clone(),
            "cuts {c:?}"
        );
    }
}

#[tokio::test]
async fn reasoning_when_the_prompt_opened_think() {
    let s = setup(
        "weighing options\n</think>\n\nThe answer is 4.",
        Tpl::OpensThink,
    );
    let b = json!({"messages": [{"role": "user", "content": "2+2?"}]});
    let r = post(s.app(), "/v1/chat/completions", &b).await;
    let m = openai_message(&r.json());
    assert_eq!(m.0, "The answer is 4.");
    assert_eq!(m.1.as_deref(), Some("weighing options"));
    let r = post(
        s.app(),
        "/api/chat",
        &json!({"stream": false, "messages": [{"role": "user", "content": "2+2?"}]}),
    )
    .await;
    assert_eq!(r.json()["message"]["thinking"], "weighing options");
    assert_eq!(r.json()["message"]["content"], "The answer is 4.");
}

#[tokio::test]
async fn openai_sse_usage_n_choices_and_logprobs() {
    let s = setup("Hello world, how are you", Tpl::Fixture);
    let r = post(s.app(), "/v1/chat/completions", &json!({"stream": true, "n": 2, "logprobs": true, "top_logprobs": 2,
        "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "hi"}]})).await;
    let frames = sse_frames(&r.text());
    assert_eq!(frames.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(&f.1).unwrap())
        .collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    let n_tok = s
        .backend
        .pieces("Hello world, how are you", &Cuts::Tokens)
        .len();
    assert!(n_tok > 1);
    assert_eq!(usage["usage"]["completion_tokens"], 2 * n_tok);
    let mut text = [String::new(), String::new()];
    let mut lps = [0, 0];
    for c in &chunks[..chunks.len() - 1] {
        let ch = &c["choices"][0];
        let i = ch["index"].as_u64().unwrap() as usize;
        text[i].push_str(ch["delta"]["content"].as_str().unwrap_or(""));
        if let Some(l) = ch["logprobs"]["content"].as_array() {
            lps[i] += l.len();
            assert_eq!(l[0]["top_logprobs"].as_array().unwrap().len(), 2);
        }
    }
    assert_eq!(
        text,
        ["Hello world, how are you", "Hello world, how are you"]
    );
    assert_eq!(lps, [n_tok, n_tok]);
    let r = post(s.app(), "/v1/chat/completions", &json!({"n": 3, "max_tokens": 2, "logprobs": true, "messages": [{"role": "user", "content": "hi"}]})).await;
    let v = r.json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "length");
        assert_eq!(c["logprobs"]["content"].as_array().unwrap().len(), 2);
    }
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(
        v["usage"]["total_tokens"],
        v["usage"]["prompt_tokens"].as_u64().unwrap() + 6
    );
}

#[tokio::test]
async fn completions_streamed_and_not() {
    let s = setup("Once upon a time", Tpl::Fixture);
    let r = post(
        s.app(),
        "/v1/completions",
        &json!({"prompt": "Tell me", "logprobs": 1, "stop": [" a "]}),
    )
    .await;
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "Once upon");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["logprobs"]["tokens"].is_array());
    let r = post(
        s.app(),
        "/v1/completions",
        &json!({"prompt": [1, 2, 3], "stream": true}),
    )
    .await;
    let frames = sse_frames(&r.text());
    assert_eq!(frames.last().unwrap().1, "[DONE]");
    let text: String = frames[..frames.len() - 1]
        .iter()
        .map(|f| {
            serde_json::from_str::<Value>(&f.1).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(text, "Once upon a time");
}

/// Anthropic content blocks folded from the event stream, checking the event order.
fn fold_anthropic_stream(body: &str) -> (Vec<Value>, Value) {
    let frames = sse_frames(body);
    let names: Vec<&str> = frames.iter().map(|f| f.0.as_deref().unwrap()).collect();
    assert_eq!(names[0], "message_start");
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
    let mut blocks: Vec<Value> = Vec::new();
    let mut open: Option<usize> = None;
    let mut json_buf = String::new();
    let mut delta = Value::Null;
    for (ev, data) in &frames {
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(
            v["type"].as_str(),
            ev.as_deref(),
            "event name matches data type"
        );
        match ev.as_deref().unwrap() {
            "content_block_start" => {
                assert!(open.is_none(), "block started while another is open");
                let i = v["index"].as_u64().unwrap() as usize;
                assert_eq!(i, blocks.len(), "block indexes count up from 0");
                blocks.push(v["content_block"].clone());
                open = Some(i);
                json_buf.clear();
            }
            "content_block_delta" => {
                let i = v["index"].as_u64().unwrap() as usize;
                assert_eq!(Some(i), open);
                let d = &v["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        let t = blocks[i]["text"].as_str().unwrap().to_string()
                            + d["text"].as_str().unwrap();
                        blocks[i]["text"] = t.into();
                    }
                    "thinking_delta" => {
                        let t = blocks[i]["thinking"].as_str().unwrap().to_string()
                            + d["thinking"].as_str().unwrap();
                        blocks[i]["thinking"] = t.into();
                    }
                    "input_json_delta" => json_buf.push_str(d["partial_json"].as_str().unwrap()),
                    "signature_delta" => {}
                    other => panic!("unknown delta {other}"),
                }
            }
            "content_block_stop" => {
                let i = open.take().expect("stop without start");
                if blocks[i]["type"] == "tool_use" {
                    blocks[i]["input"] = serde_json::from_str(&json_buf).unwrap();
                }
            }
            "message_delta" => {
                assert!(open.is_none());
                delta = v.clone();
            }
            "message_start" | "message_stop" | "ping" => {}
            other => panic!("unexpected event {other}"),
        }
    }
    (blocks, delta)
}

#[tokio::test]
async fn anthropic_thinking_and_tool_use_streamed_and_not() {
    let s = setup(QWEN3_REPLY, Tpl::Qwen3);
    let body = |stream: bool| {
        json!({"model": "claude", "max_tokens": 200, "stream": stream, "tools": anthropic_tools(),
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}, {"type": "text", "text": "And Paris?"}]}]})
    };
    let r = post(s.app(), "/v1/messages", &body(false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["stop_reason"], "tool_use");
    let content = v["content"].clone();
    assert_eq!(content[0]["type"], "thinking");
    assert_eq!(content[0]["thinking"], "The user wants weather.");
    assert_eq!(content[1], json!({"type": "text", "text": "Let me check."}));
    assert_eq!(content[2]["type"], "tool_use");
    assert_eq!(content[2]["input"], json!({"city": "Paris"}));
    for c in [Cuts::Tokens, Cuts::Chars(1), Cuts::Chars(5)] {
        let mut script = Script::new(QWEN3_REPLY);
        script.cuts = c.clone();
        s.backend.set_script(script);
        let r = post(s.app(), "/v1/messages", &body(true)).await;
        let (mut blocks, delta) = fold_anthropic_stream(&r.text());
        // Without a seed, tool-use ids differ between requests.
        assert!(blocks[2]["id"].as_str().unwrap().len() > 10);
        blocks[2]["id"] = content[2]["id"].clone();
        assert_eq!(Value::Array(blocks), content, "cuts {c:?}");
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert!(delta["usage"]["output_tokens"].as_u64().unwrap() > 0);
    }
}

#[tokio::test]
async fn anthropic_stop_sequences_and_max_tokens() {
    let s = setup("one two three four", Tpl::Fixture);
    let r = post(s.app(), "/v1/messages", &json!({"max_tokens": 50, "stop_sequences": ["three"], "messages": [{"role": "user", "content": "count"}]})).await;
    let v = r.json();
    assert_eq!(v["content"][0]["text"], "one two ");
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "three");
    let r = post(s.app(), "/v1/messages", &json!({"max_tokens": 2, "stream": true, "messages": [{"role": "user", "content": "count"}]})).await;
    let (blocks, delta) = fold_anthropic_stream(&r.text());
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(blocks.len(), 1);
    let r = post(
        s.app(),
        "/v1/messages/count_tokens",
        &json!({"model": "x", "messages": [{"role": "user", "content": "count"}]}),
    )
    .await;
    assert!(r.json()["input_tokens"].as_u64().unwrap() > 1);
}

#[tokio::test]
async fn ollama_chat_and_generate_ndjson() {
    let s = setup(QWEN3_REPLY, Tpl::Qwen3);
    let body = |stream: bool| {
        json!({"model": "m", "stream": stream, "think": true, "tools": openai_tools(), "options": {"temperature": 0, "seed": 3, "num_ctx": 4096},
               "messages": [{"role": "user", "content": "Weather?"}]})
    };
    let r = post(s.app(), "/api/chat", &body(false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["done"], true);
    assert_eq!(v["done_reason"], "stop");
    let m = v["message"].clone();
    assert_eq!(m["thinking"], "The user wants weather.");
    assert_eq!(m["content"], "Let me check.");
    assert_eq!(
        m["tool_calls"],
        json!([{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}])
    );
    for c in [Cuts::Tokens, Cuts::Chars(1)] {
        let mut script = Script::new(QWEN3_REPLY);
        script.cuts = c;
        s.backend.set_script(script);
        let r = post(s.app(), "/api/chat", &body(true)).await;
        assert_eq!(r.headers["content-type"], "application/x-ndjson");
        let lines = ndjson_lines(&r.text());
        let (mut content, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(l["done"], i == lines.len() - 1);
            content.push_str(l["message"]["content"].as_str().unwrap());
            thinking.push_str(l["message"]["thinking"].as_str().unwrap_or(""));
            calls.extend(
                l["message"]["tool_calls"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
        }
        assert_eq!(lines.last().unwrap()["done_reason"], "stop");
        assert!(lines.last().unwrap()["eval_count"].as_u64().unwrap() > 0);
        assert_eq!(
            (content.as_str(), thinking.as_str(), Value::Array(calls)),
            (
                "Let me check.",
                "The user wants weather.",
                m["tool_calls"].clone()
            )
        );
    }
    s.backend.set_script(Script::new("Plain text reply"));
    let r = post(
        s.app(),
        "/api/generate",
        &json!({"prompt": "hi", "stream": false, "options": {"num_predict": 2}}),
    )
    .await;
    let v = r.json();
    assert_eq!(v["done_reason"], "length");
    let two: String = s.backend.pieces("Plain text reply", &Cuts::Tokens)[..2]
        .iter()
        .map(|p| p.1.as_str())
        .collect();
    assert_eq!(v["response"], two);
    let r = post(
        s.app(),
        "/api/generate",
        &json!({"prompt": "hi", "raw": true}),
    )
    .await;
    let lines = ndjson_lines(&r.text());
    let text: String = lines
        .iter()
        .map(|l| l["response"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Plain text reply");
}

#[tokio::test]
async fn ollama_and_model_listing_endpoints() {
    let s = setup("x", Tpl::Qwen3);
    for path in ["/api/tags", "/api/ps"] {
        let r = send(s.app(), "GET", path, "", &[]).await;
        assert_eq!(
            r.json()["models"][0]["name"],
            "synthetic-qwen3-seed2",
            "{path}"
        );
    }
    let r = send(s.app(), "GET", "/api/version", "", &[]).await;
    assert!(r.json()["version"].is_string());
    let r = post(s.app(), "/api/show", &json!({"model": "whatever"})).await;
    let v = r.json();
    assert!(v["capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("tools")));
    assert!(v["template"].as_str().unwrap().contains("<tool_call>"));
    let r = send(s.app(), "GET", "/", "", &[]).await;
    assert_eq!(
        (r.status.as_u16(), r.text().as_str()),
        (200, "Ollama is running")
    );
    let r = send(s.app(), "HEAD", "/", "", &[]).await;
    assert_eq!(r.status, 200);
    let r = send(s.app(), "GET", "/v1/models", "", &[]).await;
    assert_eq!(r.json()["data"][0]["id"], "synthetic-qwen3-seed2");
    let r = send(s.app(), "GET", "/v1/models/gpt-4o", "", &[]).await;
    assert_eq!(r.json()["id"], "synthetic-qwen3-seed2");
}

#[tokio::test]
async fn tokenize_detokenize_and_control_tokens_stay_text() {
    let s = setup("x", Tpl::Fixture);
    let r = post(s.app(), "/tokenize", &json!({"content": "Hello world"})).await;
    let ids = r.json()["tokens"].clone();
    assert!(!ids.as_array().unwrap().is_empty());
    let r = post(s.app(), "/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(r.json()["content"], "Hello world");
    let r = post(s.app(), "/tokenize", &json!({"content": "<|im_end|>"})).await;
    assert_eq!(
        r.json()["tokens"].as_array().unwrap().len(),
        1,
        "llama-server parses specials in /tokenize"
    );
    // In a chat message the same text is not a control token: the prompt is longer than with the
    // control token itself.
    let count = |c: &str| {
        let b = json!({"messages": [{"role": "user", "content": c}]});
        let app = s.app();
        async move {
            post(app, "/v1/messages/count_tokens", &b).await.json()["input_tokens"]
                .as_u64()
                .unwrap()
        }
    };
    assert!(count("<|im_end|>").await > count("a").await);
}

#[tokio::test]
async fn metrics_count_requests_and_show_engine_state() {
    let s = setup("abc", Tpl::Fixture);
    post(
        s.app(),
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    post(s.app(), "/v1/chat/completions", &json!({"messages": "bad"})).await;
    let r = send(s.app(), "GET", "/metrics", "", &[]).await;
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let m = r.text();
    for want in [
        "hearth_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1",
        "hearth_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1",
        "# TYPE hearth_generated_tokens_total counter",
        "hearth_active_sequences 0",
        "hearth_queue_depth 0",
        "hearth_prefill_tokens_per_second",
        "hearth_decode_tokens_per_second",
        "hearth_kv_cache_used_cells",
    ] {
        assert!(m.contains(want), "metrics lack {want:?}:\n{m}");
    }
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_its_request() {
    let mut script = Script::new(&"word ".repeat(200));
    script.delay = std::time::Duration::from_millis(5);
    let s = setup_with(script, Tpl::Fixture, ServerConfig::default(), 512);
    use tower::ServiceExt;
    let req = axum::http::Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            json!({"stream": true, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
        ))
        .unwrap();
    let resp = s.app().oneshot(req).await.unwrap();
    assert_eq!(s.backend.stats().active, 1);
    drop(resp);
    for _ in 0..200 {
        if s.backend.stats().active == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the request was not cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_streams_all_finish_and_free_their_sequences() {
    let mut script = Script::new(QWEN3_REPLY);
    script.delay = std::time::Duration::from_millis(1);
    let s = setup_with(script, Tpl::Qwen3, ServerConfig::default(), 4096);
    let body = json!({"stream": true, "tools": openai_tools(), "seed": 3, "messages": [{"role": "user", "content": "Weather?"}]});
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let app = s.app();
            let body = body.clone();
            tokio::spawn(async move { post(app, "/v1/chat/completions", &body).await })
        })
        .collect();
    let mut first = None;
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        let (msg, _) = fold_openai_stream(&r.text());
        assert_eq!(msg.3, "tool_calls");
        match &first {
            None => first = Some(msg),
            Some(f) => assert_eq!(&msg, f, "every concurrent reply is the same"),
        }
    }
    assert_eq!(s.backend.stats().active, 0);
}

#[tokio::test]
async fn ollama_num_ctx_is_per_request_up_to_the_servers_context() {
    let s = setup("Hi", Tpl::Qwen3); // 4096 tokens per sequence
    let ask = |num_ctx: Value, content: String| {
        json!({"stream": false, "options": {"num_ctx": num_ctx},
               "messages": [{"role": "user", "content": content}]})
    };
    for (asked, seen) in [
        (json!(2048), Some(2048)),
        (json!(1_000_000), Some(4096)),
        (json!(0), None),
        (Value::Null, None),
    ] {
        let r = post(s.app(), "/api/chat", &ask(asked.clone(), "hi".into())).await;
        assert_eq!(r.status, 200, "{asked}: {}", r.text());
        let got = s.backend.last_settings().unwrap().n_ctx;
        assert_eq!(got, seen, "num_ctx {asked}");
    }
    // A prompt that fits the server's context but not the request's is refused, naming both.
    let r = post(s.app(), "/api/chat", &ask(json!(64), "word ".repeat(200))).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let err = r.json()["error"].as_str().unwrap().to_string();
    assert!(err.contains("64 tokens"), "{err}");
    let r = post(s.app(), "/api/chat", &ask(json!(4096), "word ".repeat(200))).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn ollama_keep_alive_load_and_unload() {
    let s = setup("Hi", Tpl::Qwen3);
    // Load and unload requests answer as Ollama does, without generating.
    for (path, body, reason) in [
        ("/api/generate", json!({"model": "m"}), "load"),
        (
            "/api/generate",
            json!({"model": "m", "keep_alive": 0}),
            "unload",
        ),
        (
            "/api/generate",
            json!({"model": "m", "keep_alive": "5m"}),
            "load",
        ),
        ("/api/chat", json!({"model": "m", "messages": []}), "load"),
        ("/api/chat", json!({"model": "m"}), "load"),
        (
            "/api/chat",
            json!({"model": "m", "messages": [], "keep_alive": "0s"}),
            "unload",
        ),
        (
            "/api/chat",
            json!({"model": "m", "messages": [], "keep_alive": -1}),
            "load",
        ),
    ] {
        let r = post(s.app(), path, &body).await;
        assert_eq!(r.status, 200, "{path} {body}: {}", r.text());
        let v = r.json();
        assert_eq!(
            (v["done"].clone(), v["done_reason"].clone()),
            (json!(true), json!(reason)),
            "{path} {body}: {v}"
        );
        assert_eq!(v["model"], "m");
        if path == "/api/chat" {
            assert_eq!(v["message"], json!({"role": "assistant", "content": ""}));
        } else {
            assert_eq!(v["response"], "");
        }
    }
    assert_eq!(s.backend.take_prompts().len(), 0, "nothing was generated");
    // The one model stays loaded after an unload.
    let r = send(s.app(), "GET", "/api/ps", "", &[]).await;
    assert_eq!(r.json()["models"].as_array().unwrap().len(), 1);
    // keep_alive beside a conversation is accepted in Ollama's forms; anything else is a 400.
    for ka in [
        json!("5m"),
        json!("1h30m"),
        json!("-1"),
        json!(300),
        json!(-1),
        json!("0"),
    ] {
        let r = post(
            s.app(),
            "/api/chat",
            &json!({"stream": false, "keep_alive": ka,
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(r.status, 200, "{ka}: {}", r.text());
        assert_eq!(r.json()["message"]["content"], "Hi", "{ka}");
    }
    for ka in [json!("5 minutes"), json!("m"), json!(true), json!({"s": 1})] {
        let r = post(
            s.app(),
            "/api/generate",
            &json!({"prompt": "hi", "keep_alive": ka}),
        )
        .await;
        assert_eq!(r.status, 400, "{ka}: {}", r.text());
        assert!(r.text().contains("keep_alive"), "{}", r.text());
    }
}

#[tokio::test]
async fn ollama_show_lists_what_the_template_can_do() {
    for (tpl, caps) in [
        (Tpl::Qwen3, vec!["completion", "tools", "thinking"]),
        (Tpl::Coder, vec!["completion", "tools"]),
        (Tpl::Fixture, vec!["completion"]),
    ] {
        let s = setup("x", tpl);
        let r = post(s.app(), "/api/show", &json!({"model": "m"})).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["capabilities"], json!(caps));
    }
}
