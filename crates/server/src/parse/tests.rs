//! Corpus tests: every output is parsed whole, cut in two at every char boundary, cut at seeded
//! random places and fed one char at a time; all must give the hand-written expectation, and the
//! delta stream must be well formed. Plus seeded fuzzing (streamed equals whole on random texts
//! built from tag fragments) and linear-time checks on megabyte outputs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;

fn cfg(tools: ToolFormat, reasoning: bool, starts_in_reasoning: bool) -> ParserConfig {
    ParserConfig {
        tools,
        reasoning,
        starts_in_reasoning,
        tool_schemas: HashMap::new(),
        id_seed: 42,
    }
}

/// Qwen3 defaults: reasoning and JSON tool calls.
fn qwen3() -> ParserConfig {
    cfg(ToolFormat::Qwen3Json, true, false)
}

/// The tools the typed configurations offer: `run` and `f` with schemas, in the OpenAI and the
/// Anthropic shape, and `a`, `b`, `g` in the bare and Responses shapes, `b` without a schema.
fn offered_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
            "command": {"type": "string"}, "count": {"type": "integer"}, "force": {"type": "boolean"},
            "opts": {"type": "object"}, "ratio": {"type": "number"}, "note": {"type": "string"},
            "list": {"type": "array"}
        }}}},
        {"name": "f", "input_schema": {"type": "object", "properties": {"n": {"type": "number"}}}},
        {"name": "a", "parameters": {"type": "object", "properties": {"p": {"type": "string"}}}},
        {"name": "b"},
        {"type": "function", "name": "g", "parameters": {"properties": {"x": {"type": "string"}}}}
    ])
}

/// Qwen3-Coder: XML tool calls typed by the schemas of [`offered_tools`]; other names are text.
fn coder() -> ParserConfig {
    let mut c = cfg(ToolFormat::Qwen3CoderXml, true, false);
    c.tool_schemas = tool_schemas_from_request(&offered_tools());
    c
}

/// Qwen3 JSON calls checked against [`offered_tools`].
fn qwen3_typed() -> ParserConfig {
    let mut c = qwen3();
    c.tool_schemas = tool_schemas_from_request(&offered_tools());
    c
}

struct Case {
    name: &'static str,
    cfg: ParserConfig,
    input: &'static str,
    content: &'static str,
    reasoning: Option<&'static str>,
    /// (name, arguments JSON text)
    calls: &'static [(&'static str, &'static str)],
}

fn corpus() -> Vec<Case> {
    vec![
        Case {
            name: "plain passthrough",
            cfg: ParserConfig::plain(),
            input: "Hello, world!\n  a < b, <div>x</div> <think> </tool_call>\n\n",
            content: "Hello, world!\n  a < b, <div>x</div> <think> </tool_call>\n\n",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "plain text through the qwen3 parser",
            cfg: qwen3(),
            input: "\n Hello <b>bold</b>, a < b, x <tool y <<tool_cal\n",
            content: "\n Hello <b>bold</b>, a < b, x <tool y <<tool_cal\n",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "think then answer",
            cfg: qwen3(),
            input: "<think>\nLet me think.\n\nStep 2: a<b.\n</think>\n\nThe answer is 4.",
            content: "The answer is 4.",
            reasoning: Some("Let me think.\n\nStep 2: a<b."),
            calls: &[],
        },
        Case {
            name: "starts inside think",
            cfg: cfg(ToolFormat::Qwen3Json, true, true),
            input: "Hmm, 2+2.\n</think>\n\n4\n",
            content: "4\n",
            reasoning: Some("Hmm, 2+2."),
            calls: &[],
        },
        Case {
            name: "think opened by the prompt and repeated by the model",
            cfg: cfg(ToolFormat::Qwen3Json, true, true),
            input: "\n<think>\nfirst <think> stays\n</think>\n\nok",
            content: "ok",
            reasoning: Some("first <think> stays"),
            calls: &[],
        },
        Case {
            name: "empty think block written by the model",
            cfg: qwen3(),
            input: "<think>\n\n</think>\n\nHi",
            content: "Hi",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "think then tool call",
            cfg: qwen3(),
            input: "<think>\nNeed the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            content: "",
            reasoning: Some("Need the weather."),
            calls: &[("get_weather", r#"{"city":"Paris"}"#)],
        },
        Case {
            name: "two json calls after content",
            cfg: qwen3(),
            input: "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\", \"unit\": \"c\", \"deep\": {\"x\": [1, 2.5, null, \"</tool\"]}}}\n</tool_call>\n",
            content: "Let me check both.",
            reasoning: None,
            calls: &[
                ("get_weather", r#"{"city":"Paris"}"#),
                ("get_weather", r#"{"city":"東京","unit":"c","deep":{"x":[1,2.5,null,"</tool"]}}"#),
            ],
        },
        Case {
            name: "json call between text",
            cfg: qwen3(),
            input: "A\n<tool_call>{\"name\":\"f\"}</tool_call>\nB",
            content: "A\nB",
            reasoning: None,
            calls: &[("f", "{}")],
        },
        Case {
            name: "malformed tool json is text",
            cfg: qwen3(),
            input: "Try: <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> done",
            content: "Try: <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> done",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "json block restarted inside is recovered",
            cfg: qwen3(),
            input: "<tool_call>\n{\"name\": \n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}\n</tool_call>",
            content: "<tool_call>\n{\"name\":",
            reasoning: None,
            calls: &[("f", r#"{"a":"b"}"#)],
        },
        Case {
            name: "unterminated think",
            cfg: qwen3(),
            input: "  <think>\nstill thinking about é and 中文 </thi",
            content: "",
            reasoning: Some("still thinking about é and 中文 </thi"),
            calls: &[],
        },
        Case {
            name: "unterminated json call that parses",
            cfg: qwen3(),
            input: "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": 1}}\n</tool_",
            content: "",
            reasoning: None,
            calls: &[("f", r#"{"q":1}"#)],
        },
        Case {
            name: "unterminated json call that does not parse",
            cfg: qwen3(),
            input: "ok \n<tool_call>\n{\"name\": \"f\", \"argu",
            content: "ok \n<tool_call>\n{\"name\": \"f\", \"argu",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "coder xml with typed parameters",
            cfg: coder(),
            input: "I'll run it.\n\n<tool_call>\n<function=run>\n<parameter=command>\nls -la\ncd /tmp\n</parameter>\n<parameter=count>\n3\n</parameter>\n<parameter=force>\ntrue\n</parameter>\n<parameter=opts>\n{\"a\": [1, {\"b\": null}]}\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=note>\n\nline with a < b and </param text\n\n</parameter>\n<parameter=list>\n[1, \"x\"]\n</parameter>\n</function>\n</tool_call>",
            content: "I'll run it.",
            reasoning: None,
            calls: &[(
                "run",
                r#"{"command":"ls -la\ncd /tmp","count":3,"force":true,"opts":{"a":[1,{"b":null}]},"ratio":0.5,"note":"\nline with a < b and </param text\n","list":[1,"x"]}"#,
            )],
        },
        Case {
            name: "coder xml values that do not fit their type stay strings",
            cfg: coder(),
            input: "<tool_call>\n<function=run>\n<parameter=count>\nmany\n</parameter>\n<parameter=force>\nyes\n</parameter>\n<parameter=extra>\n7\n</parameter>\n<parameter=command>\nNull\n</parameter>\n<parameter=note>\nnullify\n</parameter>\n<parameter=u>nu</parameter>\n<parameter=e></parameter>\n<parameter=n2>\n\n</parameter>\n</function>\n</tool_call>",
            content: "",
            reasoning: None,
            calls: &[(
                "run",
                r#"{"count":"many","force":"yes","extra":"7","command":null,"note":"nullify","u":"nu","e":"","n2":""}"#,
            )],
        },
        Case {
            name: "coder two calls, the second cut off in a value, comes back as text",
            cfg: coder(),
            input: "<think>\nplan\n</think>\n\n<tool_call>\n<function=f>\n<parameter=n>\n1e3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=g>\n<parameter=x>\nhello\nwor",
            content: "\n<tool_call>\n<function=g>\n<parameter=x>\nhello\nwor",
            reasoning: Some("plan"),
            calls: &[("f", r#"{"n":1000}"#)],
        },
        Case {
            name: "coder parameters left open, two functions in one block",
            cfg: coder(),
            input: "<tool_call>\n<function=a>\n<parameter=p>\n1\n<parameter=q>\n2\n</function>\n<function=b>\n</function>\n</tool_call>\ntail",
            content: "\ntail",
            reasoning: None,
            calls: &[("a", r#"{"p":"1","q":"2"}"#), ("b", "{}")],
        },
        Case {
            name: "coder string values are verbatim: code with tags inside",
            cfg: coder(),
            input: "Writing it.\n<tool_call>\n<function=run>\n<parameter=command>\ncat > t.rs <<'EOF'\nfn f(a: u8, b: u8) -> bool { a < b && b > 2 }\n// \"<parameter=x>\" and </function> and </tool_call> inline\nconst CLOSE: &str = \"</parameter>\";\n</parameter> ends a value only before the next tag\n</parameter>\n\n\tEOF\n  indented\n</parameter>\n<parameter=count>\n2\n</parameter>\n</function>\n</tool_call>",
            content: "Writing it.",
            reasoning: None,
            calls: &[(
                "run",
                r#"{"command":"cat > t.rs <<'EOF'\nfn f(a: u8, b: u8) -> bool { a < b && b > 2 }\n// \"<parameter=x>\" and </function> and </tool_call> inline\nconst CLOSE: &str = \"</parameter>\";\n</parameter> ends a value only before the next tag\n</parameter>\n\n\tEOF\n  indented","count":2}"#,
            )],
        },
        Case {
            name: "coder value that ends in a closing-tag lookalike at the end of its block",
            cfg: coder(),
            input: "<tool_call>\n<function=a>\n<parameter=p>\nx </parameter>y\n</parameter>   \n\n  </function></tool_call>",
            content: "",
            reasoning: None,
            calls: &[("a", r#"{"p":"x </parameter>y"}"#)],
        },
        Case {
            name: "coder call cut off after a closed parameter comes back as text",
            cfg: coder(),
            input: "Let me run it.\n\n<tool_call>\n<function=run>\n<parameter=command>\nrm -rf /tmp/x\n</parameter>\n",
            content: "Let me run it.\n\n<tool_call>\n<function=run>\n<parameter=command>\nrm -rf /tmp/x\n</parameter>\n",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "coder call cut off in its function name comes back as text",
            cfg: coder(),
            input: "ok <tool_call>\n<function=ru",
            content: "ok <tool_call>\n<function=ru",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "coder call whose tool_call close was cut off is complete",
            cfg: coder(),
            input: "<tool_call>\n<function=f>\n<parameter=n>\n2.5\n</parameter>\n</function>\n</tool_",
            content: "",
            reasoning: None,
            calls: &[("f", r#"{"n":2.5}"#)],
        },
        Case {
            name: "coder text after the last function with no tool_call close is kept",
            cfg: coder(),
            input: "<tool_call>\n<function=b>\n</function>\nI called b.",
            content: "\nI called b.",
            reasoning: None,
            calls: &[("b", "{}")],
        },
        Case {
            name: "coder function the request did not offer is text",
            cfg: coder(),
            input: "Sure.\n<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>",
            content: "Sure.\n<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "coder second function not offered: the first is a call, the rest text",
            cfg: coder(),
            input: "<tool_call>\n<function=b>\n</function>\n<function=nope>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=a>\n<parameter=p>\nq\n</parameter>\n</function>\n</tool_call>",
            content: "<function=nope>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
            reasoning: None,
            calls: &[("b", "{}"), ("a", r#"{"p":"q"}"#)],
        },
        Case {
            name: "coder empty function name is text",
            cfg: coder(),
            input: "<tool_call>\n<function=>\n</function>\n</tool_call>",
            content: "<tool_call>\n<function=>\n</function>\n</tool_call>",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "coder parameter written twice keeps the last value",
            cfg: coder(),
            input: "<tool_call>\n<function=run>\n<parameter=count>\n1\n</parameter>\n<parameter=note>\nn\n</parameter>\n<parameter=count>\n2\n</parameter>\n</function>\n</tool_call>",
            content: "",
            reasoning: None,
            calls: &[("run", r#"{"count":2,"note":"n"}"#)],
        },
        Case {
            name: "json block under the coder template is a call",
            cfg: coder(),
            input: "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"command\": \"ls\", \"count\": \"4\"}}\n</tool_call>",
            content: "",
            reasoning: None,
            calls: &[("run", r#"{"command":"ls","count":4}"#)],
        },
        Case {
            name: "xml block under the qwen3 template is a call",
            cfg: qwen3_typed(),
            input: "On it.\n<tool_call>\n<function=f>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>",
            content: "On it.",
            reasoning: None,
            calls: &[("f", r#"{"n":7}"#)],
        },
        Case {
            name: "json arguments written as strings are typed by the schema",
            cfg: qwen3_typed(),
            input: "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"count\": \"3\", \"force\": \"true\", \"opts\": \"{\\\"a\\\": [1]}\", \"list\": \"[2]\", \"ratio\": \"x\", \"command\": 5, \"note\": \"7\"}}\n</tool_call>",
            content: "",
            reasoning: None,
            calls: &[(
                "run",
                r#"{"count":3,"force":true,"opts":{"a":[1]},"list":[2],"ratio":"x","command":5,"note":"7"}"#,
            )],
        },
        Case {
            name: "json call to a tool the request did not offer is text",
            cfg: qwen3_typed(),
            input: "Checking.\n<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n",
            content: "Checking.\n<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "json calls, the second cut off, comes back as text",
            cfg: qwen3_typed(),
            input: "Two.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 2",
            content: "Two.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 2",
            reasoning: None,
            calls: &[("f", r#"{"n":1}"#)],
        },
        Case {
            name: "coder tool_call tag without a function is text",
            cfg: coder(),
            input: "see <tool_call> tag</tool_call> and <tool_call>\n<functio",
            content: "see <tool_call> tag</tool_call> and <tool_call>\n<functio",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "unicode everywhere",
            cfg: qwen3(),
            input: "<think>\nпривет 😀\n</think>\n\n答え: 😀 <b>ok</b> ü",
            content: "答え: 😀 <b>ok</b> ü",
            reasoning: Some("привет 😀"),
            calls: &[],
        },
        Case {
            name: "reasoning off: think tags are text",
            cfg: cfg(ToolFormat::None, false, true),
            input: "<think>\nx\n</think>\n\ny",
            content: "<think>\nx\n</think>\n\ny",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "stray close tag is text",
            cfg: qwen3(),
            input: "abc</think>def",
            content: "abc</think>def",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "think later in the answer is text",
            cfg: qwen3(),
            input: "Hi <think>x</think>",
            content: "Hi <think>x</think>",
            reasoning: None,
            calls: &[],
        },
        Case {
            name: "tool calls are not parsed inside reasoning",
            cfg: qwen3(),
            input: "<think>\n<tool_call>{\"name\":\"f\"}</tool_call>\n</think>\nok",
            content: "ok",
            reasoning: Some("<tool_call>{\"name\":\"f\"}</tool_call>"),
            calls: &[],
        },
        Case {
            name: "empty output",
            cfg: qwen3(),
            input: "",
            content: "",
            reasoning: None,
            calls: &[],
        },
    ]
}

/// Checks the delta stream's shape: no empty text, calls numbered 0.. in order, arguments only
/// inside an open call, nothing else while a call is open, and arguments that are a JSON object.
fn check_well_formed(name: &str, deltas: &[Delta]) {
    let mut open: Option<(usize, String)> = None;
    let mut next = 0;
    for d in deltas {
        match d {
            Delta::Content(s) | Delta::Reasoning(s) => {
                assert!(!s.is_empty(), "{name}: empty text delta");
                assert!(open.is_none(), "{name}: text inside a call: {deltas:?}");
            }
            Delta::ToolCallStart { index, id, .. } => {
                assert!(open.is_none(), "{name}: nested call");
                assert_eq!(*index, next, "{name}: call index");
                assert_eq!(id, &call_id(42, *index), "{name}: id");
                open = Some((*index, String::new()));
            }
            Delta::ToolCallArgs { index, fragment } => {
                let (i, args) = open.as_mut().expect("args outside a call");
                assert_eq!(i, index, "{name}: args index");
                args.push_str(fragment);
            }
            Delta::ToolCallEnd { index } => {
                let (i, args) = open.take().expect("end outside a call");
                assert_eq!(i, *index, "{name}: end index");
                let v: Value = serde_json::from_str(&args)
                    .unwrap_or_else(|e| panic!("{name}: arguments {args:?}: {e}"));
                assert!(v.is_object(), "{name}: arguments not an object: {args}");
                next += 1;
            }
        }
    }
    assert!(open.is_none(), "{name}: call left open");
}

fn stream(cfg: &ParserConfig, pieces: &[&str]) -> (Parsed, Vec<Delta>) {
    let mut p = StreamParser::new(cfg.clone());
    let mut all = Vec::new();
    for piece in pieces {
        all.extend(p.push(piece));
    }
    all.extend(p.finish());
    (Parsed::from_deltas(all.clone()), all)
}

/// Splits `s` at the given byte positions, moved down to char boundaries.
fn cut_at<'a>(s: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut pieces = Vec::new();
    let mut last = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| floor_char(s, c)).collect();
    cuts.sort_unstable();
    for c in cuts {
        if c >= last {
            pieces.push(&s[last..c]);
            last = c;
        }
    }
    pieces.push(&s[last..]);
    pieces
}

/// xorshift64*: deterministic cuts without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % (n.max(1) as u64)) as usize
    }
}

fn expected(case: &Case) -> Parsed {
    Parsed {
        content: case.content.to_string(),
        reasoning: case.reasoning.map(str::to_string),
        tool_calls: case
            .calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| ParsedToolCall {
                id: call_id(42, i),
                name: name.to_string(),
                arguments: args.to_string(),
            })
            .collect(),
    }
}

fn check_all_cuts(case: &Case) {
    let want = expected(case);
    let whole = parse_all(case.cfg.clone(), case.input);
    assert_eq!(whole, want, "{}: parse_all", case.name);
    let (_, deltas) = stream(&case.cfg, &[case.input]);
    check_well_formed(case.name, &deltas);

    let s = case.input;
    for cut in 0..=s.len() {
        if !s.is_char_boundary(cut) {
            continue;
        }
        let (got, deltas) = stream(&case.cfg, &[&s[..cut], &s[cut..]]);
        assert_eq!(got, want, "{}: cut at {cut}: {:?}", case.name, &s[..cut]);
        check_well_formed(case.name, &deltas);
    }
    let chars: Vec<String> = s.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    let (got, deltas) = stream(&case.cfg, &pieces);
    assert_eq!(got, want, "{}: one char at a time", case.name);
    check_well_formed(case.name, &deltas);

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ s.len() as u64);
    for _ in 0..50 {
        let n = 1 + rng.below(12);
        let cuts: Vec<usize> = (0..n).map(|_| rng.below(s.len() + 1)).collect();
        let pieces = cut_at(s, &cuts);
        let (got, deltas) = stream(&case.cfg, &pieces);
        assert_eq!(got, want, "{}: pieces {pieces:?}", case.name);
        check_well_formed(case.name, &deltas);
    }
}

#[test]
fn corpus_every_cut() {
    for case in corpus() {
        check_all_cuts(&case);
    }
}

/// Nothing is lost or duplicated: for outputs without tool calls, the reply's text is the input
/// without the think tags, up to whitespace (the documented stripping).
#[test]
fn no_text_lost_without_tools() {
    let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    for case in corpus().iter().filter(|c| c.calls.is_empty()) {
        let got = parse_all(case.cfg.clone(), case.input);
        let mut input = case.input.to_string();
        let opened = case.cfg.reasoning
            && (case.cfg.starts_in_reasoning || input.trim_start().starts_with(THINK_OPEN));
        if opened {
            // The opening tag, or its repeat when the prompt opened the block, is dropped.
            if input.trim_start().starts_with(THINK_OPEN) {
                input = input.replacen(THINK_OPEN, "", 1);
            }
            input = input.replacen(THINK_CLOSE, "", 1);
        }
        let text = format!("{}{}", got.reasoning.unwrap_or_default(), got.content);
        assert_eq!(squash(&text), squash(&input), "{}", case.name);
    }
}

/// Nothing is lost or duplicated with Qwen3 JSON calls either: the answer text and each call
/// written back as `<tool_call>{"name":..,"arguments":..}</tool_call>`, in delta order, give
/// the input up to whitespace (and the arguments key when the model left it out).
#[test]
fn no_text_lost_with_json_calls() {
    let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    for case in corpus().iter() {
        // (Typed configurations change values and may hold XML calls: not this round trip.)
        if case.cfg.tools != ToolFormat::Qwen3Json
            || case.calls.is_empty()
            || !case.cfg.tool_schemas.is_empty()
        {
            continue;
        }
        let (got, deltas) = stream(&case.cfg, &[case.input]);
        let mut text = String::new();
        let mut reasoning_done = false;
        for d in &deltas {
            match d {
                Delta::Reasoning(s) => {
                    if !reasoning_done {
                        text.push_str(THINK_OPEN);
                        reasoning_done = true;
                    }
                    text.push_str(s);
                }
                Delta::Content(s) => text.push_str(s),
                Delta::ToolCallStart { name, .. } => {
                    if reasoning_done {
                        text.push_str(THINK_CLOSE);
                        reasoning_done = false;
                    }
                    text.push_str(&format!("{TOOL_OPEN}{{\"name\":\"{name}\""));
                }
                Delta::ToolCallArgs { fragment, .. } => {
                    if case.input.contains("\"arguments\"") {
                        text.push_str(&format!(",\"arguments\":{fragment}"));
                    }
                }
                Delta::ToolCallEnd { .. } => text.push_str(&format!("}}{TOOL_CLOSE}")),
            }
        }
        assert!(!got.tool_calls.is_empty());
        // Generation cut inside the closing tag: the call was closed anyway.
        let mut input = case.input.to_string();
        if let Some(i) = (1..TOOL_CLOSE.len())
            .rev()
            .find(|&i| input.ends_with(&TOOL_CLOSE[..i]))
        {
            input.push_str(&TOOL_CLOSE[i..]);
        }
        assert_eq!(squash(&text), squash(&input), "{}", case.name);
    }
}

/// Random texts built from tag fragments: never a panic, always well formed, and streamed in
/// random pieces equal to parsed whole.
#[test]
fn fuzz_streamed_equals_whole() {
    const FRAGS: &[&str] = &[
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"a<b\"}}\n</tool_call>",
        "<tool_call>\n<function=run>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\n",
        "<tool_call>\n{\"name\": \"g\"",
        "<think>\nhm\n</think>\n\n",
        "<",
        "<parameter=s>",
        "Nu",
        "ll",
        "\n</parameter>",
        "<function=run>",
        "<parameter=count>",
        "\\",
        ">",
        "\n",
        " ",
        "a",
        "é",
        "😀",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool",
        "_call>",
        "</th",
        "ink>",
        "{\"name\": \"f\"",
        ", \"arguments\": {\"x\": 1}",
        "}",
        "<function=f>",
        "<function=",
        "<parameter=n>",
        "</parameter>",
        "</function>",
        "2",
        "<parameter=",
        "null",
        "{",
        "\"",
        "<function=nope>",
        "<function=g>",
        "<tool_call>\n<function=Bash>\n",
        "</parameter> x",
        "</parameter>\n",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": \"2\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"nope\"}\n</tool_call>",
    ];
    let configs = [
        ParserConfig::plain(),
        qwen3(),
        cfg(ToolFormat::Qwen3Json, true, true),
        coder(),
        cfg(ToolFormat::Qwen3CoderXml, false, false),
        qwen3_typed(),
    ];
    let mut rng = Rng(7);
    let (mut with_calls, mut with_reasoning) = (0, 0);
    for round in 0..6000 {
        let n = 1 + rng.below(30);
        let text: String = (0..n).map(|_| FRAGS[rng.below(FRAGS.len())]).collect();
        let c = &configs[round % configs.len()];
        let whole = parse_all(c.clone(), &text);
        let cuts: Vec<usize> = (0..rng.below(8))
            .map(|_| rng.below(text.len() + 1))
            .collect();
        let pieces = cut_at(&text, &cuts);
        let (got, deltas) = stream(c, &pieces);
        assert_eq!(got, whole, "text {text:?} pieces {pieces:?} cfg {c:?}");
        with_calls += usize::from(!whole.tool_calls.is_empty());
        with_reasoning += usize::from(whole.reasoning.is_some());
        check_well_formed(&text, &deltas);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(
            stream(c, &pieces).0,
            whole,
            "char by char: {text:?} cfg {c:?}"
        );
    }
    // The alphabet must reach the interesting paths, not only plain text.
    assert!(with_calls > 300, "{with_calls} rounds with tool calls");
    assert!(
        with_reasoning > 300,
        "{with_reasoning} rounds with reasoning"
    );
}

/// Feeds `text` in `step`-byte pieces, checking the held-back buffer stays small, within `limit`.
fn feed_linear(c: &ParserConfig, text: &str, step: usize, limit: Duration) -> Parsed {
    let t = Instant::now();
    let mut p = StreamParser::new(c.clone());
    let mut deltas = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let j = floor_char(text, (i + step).min(text.len())).max(i + 1);
        let j = (i..=j)
            .rev()
            .find(|&k| text.is_char_boundary(k))
            .unwrap_or(text.len());
        deltas.extend(p.push(&text[i..j]));
        assert!(p.buf.len() < 1024, "held back {} bytes", p.buf.len());
        i = j;
    }
    deltas.extend(p.finish());
    assert!(t.elapsed() < limit, "took {:?}", t.elapsed());
    Parsed::from_deltas(deltas)
}

#[test]
fn long_outputs_are_linear() {
    // Not a speed test: a quadratic parser would take hours on these 1 MB inputs, a linear one
    // takes seconds even unoptimised on a loaded machine (20 s was once missed under load 14).
    let limit = Duration::from_secs(120);
    let filler = "lorem < ipsum <tool dolor\n".repeat(40_000); // ~1 MB
                                                               // Unterminated JSON call followed by 1 MB: released as text at the end.
    let text = format!("<tool_call>\n{filler}");
    let got = feed_linear(&qwen3(), &text, 3, limit);
    assert_eq!(got.content, text);
    // Unterminated XML value of 1 MB: the call was cut off, so all of it comes back as text.
    let text = format!("<tool_call>\n<function=run>\n<parameter=command>\n{filler}");
    let got = feed_linear(&coder(), &text, 3, limit);
    assert!(got.tool_calls.is_empty());
    assert_eq!(got.content, text);
    // A 1 MB value full of closing-tag lookalikes, then closed: one call with all of it.
    let code = "a </parameter> b\n</parameter>\tc <parameter=x>\n".repeat(25_000);
    let text = format!("<tool_call>\n<function=run>\n<parameter=command>\n{code}</parameter>\n</function>\n</tool_call>");
    let got = feed_linear(&coder(), &text, 3, limit);
    assert_eq!(got.tool_calls.len(), 1);
    let args: Value = serde_json::from_str(&got.tool_calls[0].arguments).unwrap();
    assert_eq!(args["command"], code[..code.len() - 1]);
    // 1 MB of reasoning and of answer text, with tag-like text throughout.
    let text = format!("<think>\n{filler}</think>\n\n{filler}");
    let got = feed_linear(&qwen3(), &text, 5, limit);
    assert_eq!(got.content, filler);
    // Many calls and many false starts in one piece.
    let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call> x <tool_call>\n<function=f>\n";
    let text = call.repeat(20_000);
    let t = Instant::now();
    let got = parse_all(coder(), &text);
    assert!(got.tool_calls.len() > 1000);
    let got = parse_all(qwen3(), &text);
    assert_eq!(got.tool_calls.len(), 20_000);
    assert!(t.elapsed() < limit, "took {:?}", t.elapsed());
    // 1 MB of whitespace after a call is held, not re-scanned.
    let text = format!(
        "<tool_call>{{\"name\":\"f\"}}</tool_call>{}x",
        " ".repeat(1 << 20)
    );
    let got = feed_linear(&qwen3(), &text, 1, limit);
    assert_eq!(got.content.len(), (1 << 20) + 1);
}

#[test]
fn detect_formats_from_templates() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared");
    let coder = std::fs::read_to_string(format!("{root}/templates/Qwen3-Coder.jinja"));
    let qwen3 = std::fs::read_to_string(format!("{root}/tokenizers/qwen3/tokenizer_config.json"));
    if let (Ok(coder), Ok(qwen3)) = (coder, qwen3) {
        assert_eq!(ToolFormat::detect(&coder), ToolFormat::Qwen3CoderXml);
        let cfg: Value = serde_json::from_str(&qwen3).expect("tokenizer_config.json");
        let tpl = cfg["chat_template"].as_str().expect("chat_template");
        assert_eq!(ToolFormat::detect(tpl), ToolFormat::Qwen3Json);
    }
    assert_eq!(ToolFormat::detect("{{ messages }}"), ToolFormat::None);
}

#[test]
fn schemas_from_every_request_shape() {
    let got = tool_schemas_from_request(&offered_tools());
    let mut names: Vec<&str> = got.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["a", "b", "f", "g", "run"]);
    assert_eq!(got["b"], Value::Null);
    assert_eq!(got["f"]["properties"]["n"]["type"], "number");
    // Codex's Responses tools: functions are offered, `namespace` and `web_search` are not.
    let codex = json!([
        {"type": "function", "name": "exec_command", "strict": false,
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "function", "name": "spawn_agent"}]},
        {"type": "web_search", "external_web_access": true}
    ]);
    let got = tool_schemas_from_request(&codex);
    assert_eq!(got.keys().collect::<Vec<_>>(), ["exec_command"]);
    assert!(tool_schemas_from_request(&json!({"not": "a list"})).is_empty());
}

#[test]
fn prompt_opening_think() {
    assert!(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
    assert!(!prompt_opens_reasoning(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ));
    assert!(!prompt_opens_reasoning("<|im_start|>assistant\n"));
}

#[test]
fn ids_are_deterministic_and_distinct() {
    let a = call_id(1, 0);
    assert_eq!(a.len(), 29);
    assert!(a.starts_with("call_"));
    assert!(a[5..].bytes().all(|b| b.is_ascii_alphanumeric()));
    assert_eq!(a, call_id(1, 0));
    assert_ne!(a, call_id(1, 1));
    assert_ne!(a, call_id(2, 0));
}

/// A Qwen3-Coder call is emitted whole when its function closes, nothing before: a call cut off
/// later must come back as text, and what was streamed could not be taken back.
#[test]
fn coder_call_is_emitted_when_its_function_closes() {
    let mut p = StreamParser::new(coder());
    assert_eq!(
        p.push("Ok.\n<tool_call>\n<function=run>\n"),
        vec![Delta::Content("Ok.".into())]
    );
    assert_eq!(p.push("<parameter=count>\n3\n</parameter>\n"), vec![]);
    assert_eq!(p.push("<parameter=force>\nfalse\n</parameter>\n"), vec![]);
    assert_eq!(
        p.push("</function>"),
        vec![
            Delta::ToolCallStart {
                index: 0,
                id: call_id(42, 0),
                name: "run".into()
            },
            Delta::ToolCallArgs {
                index: 0,
                fragment: "{\"count\":3,\"force\":false}".into()
            },
            Delta::ToolCallEnd { index: 0 },
        ]
    );
    assert_eq!(p.push("\n</tool_call>"), vec![]);
    assert!(p.finish().is_empty());

    // The same call cut off before `</function>`: its text, held so far, is all released.
    let mut p = StreamParser::new(coder());
    let text = "Ok.\n<tool_call>\n<function=run>\n<parameter=count>\n3\n</parameter>\n";
    let mut d = p.push(text);
    d.extend(p.finish());
    assert_eq!(Parsed::from_deltas(d).content, text);
}

/// A `</parameter>` is held until the next text says whether it closes the value.
#[test]
fn closing_tag_lookalike_waits_for_what_follows() {
    let mut p = StreamParser::new(coder());
    let head = "<tool_call>\n<function=a>\n<parameter=p>\nx\n</parameter>\n";
    assert_eq!(p.push(head), vec![]);
    // Not followed by a tag: value text after all.
    assert_eq!(p.push("y\n</parameter>\n<para"), vec![]);
    let mut d = p.push("meter=z>\n1\n</parameter>\n</function>\n</tool_call>");
    d.extend(p.finish());
    let got = Parsed::from_deltas(d);
    assert_eq!(got.tool_calls.len(), 1);
    assert_eq!(
        got.tool_calls[0].arguments,
        r#"{"p":"x\n</parameter>\ny","z":"1"}"#
    );
}

#[test]
fn content_streams_without_delay() {
    let mut p = StreamParser::new(qwen3());
    assert_eq!(p.push("Hello"), vec![Delta::Content("Hello".into())]);
    // Whitespace waits for the next text (it is dropped before a tool call).
    assert_eq!(p.push(" "), vec![]);
    assert_eq!(p.push("wor"), vec![Delta::Content(" wor".into())]);
    assert_eq!(p.push("ld <"), vec![Delta::Content("ld".into())]);
    assert_eq!(p.push("b>"), vec![Delta::Content(" <b>".into())]);
    let mut p = StreamParser::new(ParserConfig::plain());
    assert_eq!(p.push("a "), vec![Delta::Content("a ".into())]);
    assert_eq!(
        p.push("<tool_call>"),
        vec![Delta::Content("<tool_call>".into())]
    );
}
