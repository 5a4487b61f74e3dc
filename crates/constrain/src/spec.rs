//! What a request asks the output to be, and how each kind becomes an llguidance grammar.
//!
//! JSON is generated compactly and deterministically laid out: `", "` between items, `": "` after
//! keys, no other whitespace, so a model cannot wander off into unbounded blank space and a schema
//! whose strings and arrays are bounded yields output of bounded length. Objects that list
//! `properties` but say nothing of `additionalProperties` get no extra keys (as llama.cpp's and
//! XGrammar's converters do): a generator that may invent keys of any value is unbounded. Numbers
//! are bounded the way llama.cpp's converter bounds them: a number or integer the schema leaves
//! open gets a range (±2^53 - 1 for integers, ±10^12 for numbers) and numbers at most 6 digits after
//! the point (unless the schema's own range is so wide that the step would overflow llguidance's
//! 64-bit arithmetic), so a model cannot write digits forever; every value generated still
//! satisfies the schema as written. The `date`, `time` and `date-time` formats are narrowed too:
//! llguidance's regexes admit year 0000, February 29 of any year and fractions of a second of any
//! length, which common validators (Python's `datetime`) refuse or which never end.

use serde_json::{json, Map, Value};

use crate::gbnf;
use crate::ConstrainError;

/// A constraint on the generated text.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// One JSON value valid under the schema.
    JsonSchema(Value),
    /// Any JSON object (OpenAI `json_object`, Ollama `format: "json"`).
    JsonObject,
    /// Any JSON value.
    AnyJson,
    /// Text of a GBNF grammar (llama.cpp's dialect), starting at its `root` rule.
    Gbnf(String),
    /// One tool call, written in `syntax`, to one of `tools` with valid arguments.
    ToolCall {
        /// How the model writes a call.
        syntax: ToolSyntax,
        /// The tools that may be called (at least one).
        tools: Vec<Tool>,
        /// The reply may instead be free text that holds no call at all.
        optional: bool,
    },
}

/// How a model writes a tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// Qwen3 / Hermes: `<tool_call>\n{"name": "NAME", "arguments": {..}}\n</tool_call>`.
    Qwen3Json,
}

/// A callable tool.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// Function name.
    pub name: String,
    /// JSON Schema of its arguments object (`Value::Null`: any object).
    pub parameters: Value,
}

/// Separators and whitespace of generated JSON, as llguidance's `x-guidance` options.
fn layout() -> Value {
    json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false})
}

/// Deepest nesting of subschemas walked (serde_json already caps the nesting of any parsed value).
const MAX_DEPTH: usize = 128;

/// The schema as it is compiled: checked to be a schema, extra keys closed, the layout set.
pub(crate) fn prepare_schema(schema: &Value) -> Result<Value, ConstrainError> {
    let mut s = match schema {
        Value::Bool(true) => json!({}),
        Value::Bool(false) => {
            return Err(ConstrainError::Schema(
                "the schema `false` accepts no value".into(),
            ))
        }
        Value::Object(_) => schema.clone(),
        other => {
            return Err(ConstrainError::Schema(format!(
                "a schema must be an object or a boolean, not {}",
                kind(other)
            )))
        }
    };
    tighten(&mut s, false, 0)?;
    if let Value::Object(m) = &mut s {
        m.insert("x-guidance".into(), layout());
    }
    Ok(s)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Largest integer a JSON number holds exactly in an IEEE double (JavaScript's `MAX_SAFE_INTEGER`).
const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;
/// Largest magnitude of a generated non-integer number, when the schema gives none.
const MAX_NUMBER: f64 = 1e12;
/// Finest step of a generated non-integer number, when the schema gives no `multipleOf`.
const NUMBER_STEP: f64 = 1e-6;
/// Largest range / step ratio given to llguidance, whose multiple-of arithmetic is 64-bit.
const MAX_STEPS: f64 = 1e18;

/// Narrows what is generated to a bounded subset of what the schema accepts: every object schema
/// with `properties` and no word on extra keys gets `additionalProperties: false` (except directly
/// under `allOf`, where each part sees only its own properties and closing them would make the
/// intersection refuse the others' keys), and open numbers get a range and a step.
fn tighten(s: &mut Value, in_all_of: bool, depth: usize) -> Result<(), ConstrainError> {
    if depth > MAX_DEPTH {
        return Err(ConstrainError::Schema(format!(
            "the schema nests deeper than {MAX_DEPTH} levels"
        )));
    }
    let Value::Object(m) = s else {
        return Ok(());
    };
    if !in_all_of
        && m.get("properties").is_some_and(Value::is_object)
        && !m.contains_key("additionalProperties")
        && !m.contains_key("unevaluatedProperties")
    {
        m.insert("additionalProperties".into(), Value::Bool(false));
    }
    bound_numbers(m);
    bound_formats(m);
    let d = depth + 1;
    for key in [
        "additionalProperties",
        "items",
        "additionalItems",
        "contains",
        "not",
        "if",
        "then",
        "else",
    ] {
        if let Some(v) = m.get_mut(key) {
            match v {
                Value::Array(list) => {
                    for x in list {
                        tighten(x, false, d)?;
                    }
                }
                v => tighten(v, false, d)?,
            }
        }
    }
    for key in ["anyOf", "oneOf", "prefixItems"] {
        if let Some(Value::Array(list)) = m.get_mut(key) {
            for x in list {
                tighten(x, false, d)?;
            }
        }
    }
    if let Some(Value::Array(list)) = m.get_mut("allOf") {
        for x in list {
            tighten(x, true, d)?;
        }
    }
    for key in [
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "dependentSchemas",
    ] {
        if let Some(Value::Object(map)) = m.get_mut(key) {
            for (_, x) in map.iter_mut() {
                tighten(x, false, d)?;
            }
        }
    }
    Ok(())
}

/// Gives a number or integer schema the range and step it lacks (see the module's overview).
fn bound_numbers(m: &mut Map<String, Value>) {
    let has = |t: &str| match m.get("type") {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(a)) => a.iter().any(|x| x == t),
        _ => false,
    };
    let (number, integer) = (has("number"), has("integer"));
    if !number && !integer {
        return;
    }
    // Integers only: a schema that also allows non-integers gets the wider number bounds.
    let (lo, hi) = if number {
        (json!(-MAX_NUMBER), json!(MAX_NUMBER))
    } else {
        (json!(-MAX_SAFE_INTEGER), json!(MAX_SAFE_INTEGER))
    };
    if !m.contains_key("minimum") && !m.contains_key("exclusiveMinimum") {
        m.insert("minimum".into(), lo);
    }
    if !m.contains_key("maximum") && !m.contains_key("exclusiveMaximum") {
        m.insert("maximum".into(), hi);
    }
    let magnitude = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]
        .iter()
        .filter_map(|k| m.get(*k).and_then(Value::as_f64))
        .fold(0.0f64, |a, x| a.max(x.abs()));
    if number && !m.contains_key("multipleOf") && magnitude / NUMBER_STEP <= MAX_STEPS {
        m.insert("multipleOf".into(), json!(NUMBER_STEP));
    }
}

/// A calendar date of years 1000-9999 that exists (February 29 only in leap years).
const DATE_RX: &str = concat!(
    "(?:[1-9][0-9]{3}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])",
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))",
    "|(?:[1-9][0-9](?:0[48]|[2468][048]|[13579][26])|(?:[2468][048]|[13579][26])00)-02-29)"
);
/// A time of day with at most microseconds and a zone, without leap seconds.
const TIME_RX: &str =
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";

/// Narrows the date and time formats (see the module's overview) with a `pattern`, which
/// llguidance intersects with the format's own regex; a schema's own pattern is left alone.
fn bound_formats(m: &mut Map<String, Value>) {
    if m.contains_key("pattern") {
        return;
    }
    let rx = match m.get("format").and_then(Value::as_str) {
        Some("date") => format!("^{DATE_RX}$"),
        Some("time") => format!("^{TIME_RX}$"),
        Some("date-time") => format!("^{DATE_RX}[tT]{TIME_RX}$"),
        _ => return,
    };
    m.insert("pattern".into(), Value::String(rx));
}

/// The llguidance grammar of a spec; `Err` names what is wrong with the spec itself.
pub(crate) fn to_llg(spec: &Spec) -> Result<llguidance::api::TopLevelGrammar, ConstrainError> {
    use llguidance::api::TopLevelGrammar;
    Ok(match spec {
        Spec::JsonSchema(s) => TopLevelGrammar::from_json_schema(prepare_schema(s)?),
        Spec::JsonObject => {
            TopLevelGrammar::from_json_schema(prepare_schema(&json!({"type": "object"}))?)
        }
        Spec::AnyJson => TopLevelGrammar::from_json_schema(prepare_schema(&json!({}))?),
        Spec::Gbnf(text) => TopLevelGrammar::from_lark(gbnf::to_lark(text)?),
        Spec::ToolCall {
            syntax,
            tools,
            optional,
        } => TopLevelGrammar::from_lark(tool_call_lark(*syntax, tools, *optional)?),
    })
}

/// The Lark grammar of one tool call: the call's JSON is one schema, an `anyOf` over the tools,
/// each fixing its `name` and constraining `arguments` by the tool's parameters. When `optional`,
/// the alternative is text in which the call's opening tag never appears.
fn tool_call_lark(
    syntax: ToolSyntax,
    tools: &[Tool],
    optional: bool,
) -> Result<String, ConstrainError> {
    if tools.is_empty() {
        return Err(ConstrainError::Schema(
            "a forced tool call needs at least one tool".into(),
        ));
    }
    let mut calls = Vec::with_capacity(tools.len());
    for t in tools {
        let params = match &t.parameters {
            Value::Null => json!({"type": "object"}),
            p => p.clone(),
        };
        let mut params = prepare_schema(&params)
            .map_err(|e| ConstrainError::Schema(format!("tool `{}`: {}", t.name, strip(&e))))?;
        if let Value::Object(m) = &mut params {
            m.remove("x-guidance");
            // Arguments are always an object, whatever the schema leaves open.
            if !m.contains_key("type") {
                m.insert("type".into(), json!("object"));
            }
        }
        let mut props = Map::new();
        props.insert("name".into(), json!({"const": t.name}));
        props.insert("arguments".into(), params);
        calls.push(json!({
            "type": "object",
            "properties": props,
            "required": ["name", "arguments"],
            "additionalProperties": false,
        }));
    }
    let mut schema = if calls.len() == 1 {
        calls.pop().unwrap_or_default()
    } else {
        json!({"anyOf": calls})
    };
    if let Value::Object(m) = &mut schema {
        m.insert("x-guidance".into(), layout());
    }
    let (open, close) = match syntax {
        ToolSyntax::Qwen3Json => ("<tool_call>", "</tool_call>"),
    };
    let mut g = String::new();
    if optional {
        // A negated regex may match invalid UTF-8 unless intersected with `(?s:.*)`.
        g.push_str(&format!(
            "start: call_block | TEXT\nTEXT: /(?s:.*)/ & ~/(?s:.*){}(?s:.*)/\n",
            regex_escape(open)
        ));
    } else {
        g.push_str("start: call_block\n");
    }
    g.push_str(&format!(
        "call_block: {} call {}\ncall: %json {schema}\n",
        Value::from(format!("{open}\n")),
        Value::from(format!("\n{close}")),
    ));
    Ok(g)
}

/// `s` as a literal inside a Lark `/regex/` (Rust regex syntax, `/` escaped for Lark).
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == ' ' {
            out.push(c);
        } else {
            out.push_str(&format!("\\x{{{:X}}}", c as u32));
        }
    }
    out
}

/// The message of a schema error without its "invalid JSON schema: " prefix.
fn strip(e: &ConstrainError) -> String {
    match e {
        ConstrainError::Schema(m) => m.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_with_properties_are_closed_except_under_all_of() {
        let s = prepare_schema(&json!({
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {}}}},
            "$defs": {"d": {"properties": {"x": {}}}},
            "allOf": [{"properties": {"y": {}}}],
            "items": {"type": "object"}
        }))
        .unwrap();
        assert_eq!(s["additionalProperties"], json!(false));
        assert_eq!(s["properties"]["a"]["additionalProperties"], json!(false));
        assert_eq!(s["$defs"]["d"]["additionalProperties"], json!(false));
        assert!(s["allOf"][0].get("additionalProperties").is_none());
        assert!(
            s["items"].get("additionalProperties").is_none(),
            "no properties: any object"
        );
        assert_eq!(s["x-guidance"]["whitespace_flexible"], json!(false));
        let open = prepare_schema(&json!({"properties": {"a": {}}, "additionalProperties": true}))
            .unwrap();
        assert_eq!(open["additionalProperties"], json!(true));
    }

    #[test]
    fn open_numbers_get_a_range_and_a_step() {
        let s = prepare_schema(&json!({"properties": {
            "n": {"type": "number", "minimum": 0},
            "i": {"type": "integer"},
            "m": {"type": ["number", "null"], "multipleOf": 0.5, "exclusiveMaximum": 3},
            "s": {"type": "string"}
        }}))
        .unwrap();
        let p = &s["properties"];
        assert_eq!(
            p["n"],
            json!({"type": "number", "minimum": 0, "maximum": 1e12, "multipleOf": 1e-6})
        );
        assert_eq!(
            p["i"],
            json!({"type": "integer", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER})
        );
        assert_eq!(
            p["m"],
            json!({"type": ["number", "null"], "multipleOf": 0.5, "exclusiveMaximum": 3, "minimum": -1e12})
        );
        assert_eq!(p["s"], json!({"type": "string"}));
        let wide = prepare_schema(&json!({"type": "number", "maximum": 1e300})).unwrap();
        assert!(wide.get("multipleOf").is_none(), "{wide}");
    }

    #[test]
    fn non_schemas_are_refused() {
        assert!(matches!(
            prepare_schema(&json!(false)),
            Err(ConstrainError::Schema(_))
        ));
        let e = prepare_schema(&json!([1])).unwrap_err();
        assert!(e.to_string().contains("an array"), "{e}");
        assert_eq!(
            prepare_schema(&json!(true)).unwrap()["x-guidance"],
            layout()
        );
    }

    #[test]
    fn tool_call_grammar_fixes_the_name() {
        let tools = [Tool {
            name: "get_weather".into(),
            parameters: json!({"properties": {"city": {"type": "string"}}}),
        }];
        let g = tool_call_lark(ToolSyntax::Qwen3Json, &tools, false).unwrap();
        assert!(
            g.starts_with(
                "start: call_block\ncall_block: \"<tool_call>\\n\" call \"\\n</tool_call>\""
            ),
            "{g}"
        );
        assert!(g.contains(r#""name":{"const":"get_weather"}"#), "{g}");
        let g = tool_call_lark(ToolSyntax::Qwen3Json, &tools, true).unwrap();
        assert!(g.starts_with("start: call_block | TEXT\n"), "{g}");
        assert!(tool_call_lark(ToolSyntax::Qwen3Json, &[], false).is_err());
    }
}
