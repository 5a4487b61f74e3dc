//! Constraints over a real vocabulary (the tiny fixtures' byte-level BPE with ChatML specials):
//! random walks through the allowed tokens always end in text the spec accepts.

use std::sync::{Arc, OnceLock};

use hearth_tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::{ConstrainError, Constrainer, Spec, Tool, ToolSyntax};

fn tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/fixtures/tiny-qwen3.q4_0.gguf"
        );
        Arc::new(Tokenizer::open(path).expect("the tiny fixture's tokenizer"))
    })
    .clone()
}

fn constrainer() -> &'static Constrainer {
    static C: OnceLock<Constrainer> = OnceLock::new();
    C.get_or_init(|| {
        let tok = tokenizer();
        let n = tok.vocab_size() + 9; // padded logit rows, as real models have
        Constrainer::new(tok, n).unwrap()
    })
}

/// Follows the constraint with uniformly random allowed tokens (seeded) for at most `max` tokens;
/// returns the text and whether it ended on its own.
fn walk(spec: &Spec, seed: u64, max: usize) -> (String, bool) {
    let tok = tokenizer();
    let c = constrainer();
    let mut s = c.compile(spec).unwrap().start();
    let n_vocab = tok.vocab_size() + 9;
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::new();
    for _ in 0..max {
        let mut logits = vec![0.0f32; n_vocab];
        s.apply(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..n_vocab as u32)
            .filter(|&t| logits[t as usize].is_finite())
            .collect();
        assert!(!allowed.is_empty());
        for &t in &allowed {
            assert!(s.allows(t));
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let t = allowed[(rng % allowed.len() as u64) as usize];
        if tok.is_eog(t) {
            assert!(s.is_accepting());
            return (String::from_utf8(out).unwrap(), true);
        }
        s.commit(t).unwrap();
        out.extend_from_slice(tok.token_to_piece(t, false));
        if s.is_finished() {
            return (String::from_utf8(out).unwrap(), true);
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), false)
}

#[test]
fn bounded_schema_walks_end_in_valid_json() {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "kind": {"enum": ["cat", "dog", 3]},
            "v": {"const": "x"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 3},
            "opt": {"type": "boolean"}
        },
        "required": ["name", "kind", "v", "age", "tags"],
        "$defs": {"tag": {"type": "string", "maxLength": 4, "pattern": "^[a-z]*$"}}
    });
    let spec = Spec::JsonSchema(schema);
    for seed in 0..20 {
        let (text, done) = walk(&spec, seed, 400);
        assert!(done, "seed {seed}: did not finish: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let o = v.as_object().unwrap();
        let keys: Vec<&str> = o.keys().map(String::as_str).collect();
        assert!(
            keys.iter()
                .all(|k| ["name", "kind", "v", "age", "tags", "opt"].contains(k)),
            "{text}"
        );
        assert!(o["name"].as_str().unwrap().chars().count() <= 8, "{text}");
        assert!(
            [json!("cat"), json!("dog"), json!(3)].contains(&o["kind"]),
            "{text}"
        );
        assert_eq!(o["v"], json!("x"));
        assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{text}");
        let tags = o["tags"].as_array().unwrap();
        assert!(tags.len() <= 3);
        for t in tags {
            let t = t.as_str().unwrap();
            assert!(
                t.len() <= 4 && t.bytes().all(|b| b.is_ascii_lowercase()),
                "{text}"
            );
        }
        // Compact, fixed layout: `{"` opens, `", "` and `": "` separate, nothing around.
        assert!(
            text.starts_with("{\"name\": \"") && text.ends_with(['}', ']']),
            "{text}"
        );
    }
}

#[test]
fn json_object_and_any_json() {
    for seed in 0..10 {
        let (text, done) = walk(&Spec::JsonObject, seed, 300);
        if done {
            assert!(
                serde_json::from_str::<Value>(&text).unwrap().is_object(),
                "{text}"
            );
        }
        let (text, done) = walk(&Spec::AnyJson, seed, 300);
        if done {
            // A random walk writes numbers like 5e567: valid JSON that serde_json cannot hold.
            if let Err(e) = serde_json::from_str::<Value>(&text) {
                assert!(e.to_string().contains("number out of range"), "{e}: {text}");
            }
        }
    }
}

#[test]
fn masks_follow_the_schema() {
    let tok = tokenizer();
    let g = constrainer()
        .compile(&Spec::JsonSchema(json!({"enum": ["yes", "no"]})))
        .unwrap();
    let mut s = g.start();
    let quote = tok.encode("\"", false)[0];
    let brace = tok.encode("{", false)[0];
    assert!(s.allows(quote));
    assert!(!s.allows(brace));
    let eog: Vec<u32> = tok.eog_ids().collect();
    assert!(
        eog.iter().all(|&t| !s.allows(t)),
        "end of generation before the value"
    );
    for t in tok.encode("\"no\"", false) {
        assert!(s.allows(t));
        s.commit(t).unwrap();
    }
    assert!(s.is_accepting() && s.is_finished());
    // A disallowed token is an error, not a silent pass.
    let mut s = g.start();
    assert!(matches!(s.commit(brace), Err(ConstrainError::Violated(_))));
}

#[test]
fn gbnf_grammars_generate_their_language() {
    let spec = Spec::Gbnf("root ::= greeting \" \" name \"!\"\ngreeting ::= \"hi\" | \"hello\"\nname ::= [a-z]{1,5}\n".into());
    for seed in 0..10 {
        let (text, done) = walk(&spec, seed, 50);
        assert!(done, "{text}");
        let rest = text
            .strip_prefix("hi ")
            .or_else(|| text.strip_prefix("hello "))
            .unwrap_or_else(|| panic!("{text}"));
        let name = rest.strip_suffix('!').unwrap_or_else(|| panic!("{text}"));
        assert!(
            (1..=5).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase()),
            "{text}"
        );
    }
    // An ambiguity a greedy lexer would get wrong: "ab" + "c" must be reachable as "a" + "bc".
    let spec = Spec::Gbnf("root ::= (\"a\" | \"ab\") \"bc\"\n".into());
    let g = constrainer().compile(&spec).unwrap();
    let tok = tokenizer();
    let mut s = g.start();
    for b in ["a", "b", "c"] {
        let t = tok.encode(b, false)[0];
        assert!(s.allows(t), "{b}");
        s.commit(t).unwrap();
    }
    assert!(s.is_accepting());
}

#[test]
fn tool_calls_are_written_in_the_template_syntax() {
    let spec = Spec::ToolCall {
        syntax: ToolSyntax::Qwen3Json,
        tools: vec![
            Tool {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}),
            },
            Tool {
                name: "noop".into(),
                parameters: Value::Null,
            },
        ],
        optional: false,
    };
    for seed in 0..10 {
        let (text, done) = walk(&spec, seed, 300);
        if !done {
            continue; // `noop`'s arguments are any object, which a random walk may not close
        }
        let inner = text
            .strip_prefix("<tool_call>\n")
            .and_then(|t| t.strip_suffix("\n</tool_call>"))
            .unwrap_or_else(|| panic!("{text}"));
        let v: Value = serde_json::from_str(inner).unwrap();
        match v["name"].as_str().unwrap() {
            "get_weather" => {
                assert!(v["arguments"]["city"].as_str().unwrap().chars().count() <= 10)
            }
            "noop" => assert!(v["arguments"].is_object()),
            other => panic!("unknown tool {other}"),
        }
    }
}

#[test]
fn unsupported_or_invalid_specs_are_named() {
    let c = constrainer();
    for (schema, word) in [
        (json!({"type": "array", "uniqueItems": true}), "uniqueItems"),
        (
            json!({"type": "object", "propertyNames": {"maxLength": 3}}),
            "propertyNames",
        ),
        (
            json!({"type": "array", "contains": {"type": "integer"}}),
            "contains",
        ),
    ] {
        let e = c
            .compile(&Spec::JsonSchema(schema.clone()))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(word), "{schema}: {e}");
    }
    let e = c
        .compile(&Spec::JsonSchema(json!({"type": "wat"})))
        .unwrap_err()
        .to_string();
    assert!(e.contains("wat"), "{e}");
    let e = c
        .compile(&Spec::JsonSchema(json!({"$ref": "#/$defs/missing"})))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing"), "{e}");
    let e = c
        .compile(&Spec::Gbnf("root ::= \"a\" undefined-thing\n".into()))
        .unwrap_err();
    assert!(
        matches!(
            e,
            ConstrainError::Gbnf {
                line: 1,
                column: 14,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn compiled_grammars_are_cached() {
    let c = constrainer();
    let spec = Spec::JsonSchema(json!({"type": "integer", "minimum": 0, "maximum": 9}));
    let t0 = std::time::Instant::now();
    c.compile(&spec).unwrap();
    let first = t0.elapsed();
    let t1 = std::time::Instant::now();
    for _ in 0..10 {
        c.compile(&spec).unwrap();
    }
    assert!(
        t1.elapsed() < first * 10,
        "cache hits should be cheaper than compiling"
    );
}

#[test]
fn an_optional_tool_call_is_a_valid_call_or_text_without_one() {
    let tok = tokenizer();
    let spec = Spec::ToolCall {
        syntax: ToolSyntax::Qwen3Json,
        tools: vec![Tool {
            name: "f".into(),
            parameters: json!({"properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"]}),
        }],
        optional: true,
    };
    let g = constrainer().compile(&spec).unwrap();
    // Plain text may end anywhere.
    let mut s = g.start();
    for t in tok.encode("Hello there", false) {
        s.commit(t).unwrap();
    }
    assert!(s.is_accepting() && !s.is_finished());
    // Once the call opens, its JSON is held to the schema.
    let mut s = g.start();
    for t in tok.encode(
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": ",
        false,
    ) {
        assert!(s.allows(t), "{}", tok.token_text(t));
        s.commit(t).unwrap();
    }
    assert!(!s.allows(tok.encode("\"", false)[0]));
    assert!(s.allows(tok.encode("7", false)[0]));
    // And the tag cannot hide inside text: after "ok <tool_call", `>` is refused.
    let mut s = g.start();
    for b in "ok <tool_call".bytes() {
        let t = tok.encode(std::str::from_utf8(&[b]).unwrap(), false)[0];
        s.commit(t).unwrap();
    }
    assert!(!s.allows(tok.encode(">", false)[0]));
    assert!(s.allows(tok.encode("s", false)[0]));
}

#[test]
fn numbers_end() {
    // Open numbers cannot run on: a random walk ends within the bounded digits.
    let spec =
        Spec::JsonSchema(json!({"type": "array", "maxItems": 3, "items": {"type": "number"}}));
    for seed in 0..20 {
        let (text, done) = walk(&spec, seed, 200);
        assert!(done, "{text}");
        let v: Vec<f64> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v.iter().all(|x| x.abs() <= 1e12), "{text}");
        for n in text
            .trim_matches(&['[', ']'][..])
            .split(", ")
            .filter(|n| !n.is_empty())
        {
            let frac = n.split_once('.').map_or("", |(_, f)| f);
            let frac = frac.split(&['e', 'E'][..]).next().unwrap_or("");
            assert!(frac.len() <= 6, "{n} in {text}");
        }
    }
    // A range the step cannot cover is left without one rather than overflowing llguidance's
    // 64-bit arithmetic (a debug build panics there; a release build would wrap).
    let wide = json!({"type": "number", "minimum": -1e15, "maximum": 1e15});
    constrainer().compile(&Spec::JsonSchema(wide)).unwrap();
}

#[test]
fn dates_and_times_are_real_ones() {
    let leap = |y: u32| y.is_multiple_of(4) && (!y.is_multiple_of(100) || y.is_multiple_of(400));
    let spec = Spec::JsonSchema(json!({"type": "object", "properties": {
        "d": {"type": "string", "format": "date"},
        "t": {"type": "string", "format": "date-time"}}, "required": ["d", "t"]}));
    for seed in 0..60 {
        let (text, done) = walk(&spec, seed, 200);
        assert!(done, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        for date in [v["d"].as_str().unwrap(), &v["t"].as_str().unwrap()[..10]] {
            let parts: Vec<u32> = date.split('-').map(|p| p.parse().unwrap()).collect();
            let (y, mo, d) = (parts[0], parts[1], parts[2]);
            let days = match mo {
                2 if leap(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            assert!(
                (1000..=9999).contains(&y) && (1..=12).contains(&mo) && (1..=days).contains(&d),
                "{text}"
            );
        }
        let t = v["t"].as_str().unwrap();
        let sec: u32 = t[17..19].parse().unwrap();
        assert!(sec < 60, "{text}");
        if let Some(frac) = t[19..].strip_prefix('.') {
            assert!(
                frac.bytes().take_while(u8::is_ascii_digit).count() <= 6,
                "{text}"
            );
        }
    }
}
