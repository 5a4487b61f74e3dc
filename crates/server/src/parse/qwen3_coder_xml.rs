//! Qwen3-Coder tool calls:
//! `<tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>\n</function>\n</tool_call>`.
//!
//! Follows Qwen's reference parser (`qwen3coder_tool_parser.py`, as shipped in vLLM): a value runs
//! to `</parameter>`, or to the next `<parameter=` or `</function>` when the model left it open;
//! one leading and one trailing newline of a value are stripped; values are typed by the tool's
//! parameter schema (`_convert_param_value`). Text between the tags that is not a parameter is
//! ignored, as the reference parser's regexes skip it. Several `<function=` in one block are
//! several calls.
//!
//! The opening `<tool_call>` + `<function=NAME>` is matched by the caller; this file takes over
//! after it. The arguments stream as `{"p1":v1` `,"p2":v2` `}`: a typed value is sent when it
//! ends; a string value is sent as it is written (`{"p1":"` `part` `part` `"`), holding back only
//! a trailing newline and, at its start, text that could still be `null`.

use std::collections::HashMap;

use serde_json::Value;

use super::scan::{match_any, TagMatch};
use super::{call_id, Delta};

const PARAM_OPEN: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";
const FUNC_OPEN: &str = "<function=";
const FUNC_CLOSE: &str = "</function>";
const CALL_CLOSE: &str = "</tool_call>";

/// Where the scanner is inside the block.
#[derive(Debug)]
enum State {
    /// Between parameters of an open function.
    InFunction,
    /// Reading a parameter name that starts at `start` (after `<parameter=`).
    ParamName { start: usize },
    /// Reading the value of `name`, which starts at `start`; `stream` for string values.
    ParamValue {
        name: String,
        start: usize,
        stream: Option<StrStream>,
    },
    /// After `</function>`: expecting `</tool_call>` or another `<function=`.
    AfterFunction,
    /// Reading a function name that starts at `start` (after `<function=`).
    FunctionName { start: usize },
}

/// Progress of a string value sent while it is being written.
#[derive(Debug, Default)]
struct StrStream {
    /// `"name":"` was sent.
    opened: bool,
    /// Bytes of the body up to here were sent (escaped).
    sent: usize,
}

/// One open `<tool_call>` block.
#[derive(Debug)]
pub(super) struct XmlCall {
    /// Block text after the caller's `<function=NAME>`; cleared only with the block.
    body: String,
    /// Next byte of `body` to examine; always a char boundary.
    scan: usize,
    state: State,
    /// Index of the open (or last) call.
    index: usize,
    /// Name of the open call, to look up its schema.
    name: String,
    /// Parameters sent for the open call.
    params: usize,
}

/// What a piece of text did to the block.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Still open.
    More,
    /// `</tool_call>` read; the last `rest_len` bytes of the pushed piece follow it.
    Closed { rest_len: usize },
}

impl XmlCall {
    /// Opens call `index` named `name` and emits its start.
    pub(super) fn open(name: String, index: usize, seed: u64, out: &mut Vec<Delta>) -> XmlCall {
        out.push(Delta::ToolCallStart {
            index,
            id: call_id(seed, index),
            name: name.clone(),
        });
        XmlCall {
            body: String::new(),
            scan: 0,
            state: State::InFunction,
            index,
            name,
            params: 0,
        }
    }

    /// Index the next call in the reply gets.
    pub(super) fn next_index(&self) -> usize {
        self.index.saturating_add(1)
    }

    /// Adds a piece of the block and emits what it completes.
    pub(super) fn push(
        &mut self,
        piece: &str,
        out: &mut Vec<Delta>,
        schemas: &HashMap<String, Value>,
        seed: u64,
    ) -> Outcome {
        let schema = schemas.get(&self.name);
        self.body.push_str(piece);
        loop {
            let bytes = self.body.as_bytes();
            let Some(rest) = bytes.get(self.scan..) else {
                return Outcome::More;
            };
            if rest.is_empty() {
                return Outcome::More;
            }
            match &self.state {
                State::InFunction | State::AfterFunction => {
                    let in_fn = matches!(self.state, State::InFunction);
                    let b = rest[0];
                    if b != b'<' {
                        // Whitespace or stray text between tags: skipped. Jump to the next tag.
                        self.scan += rest.iter().position(|&c| c == b'<').unwrap_or(rest.len());
                        continue;
                    }
                    let tags: &[&'static str] = if in_fn {
                        &[PARAM_OPEN, FUNC_CLOSE, CALL_CLOSE]
                    } else {
                        &[FUNC_OPEN, CALL_CLOSE]
                    };
                    match match_any(rest, tags) {
                        (TagMatch::Partial, _) => return Outcome::More,
                        (TagMatch::No, _) => self.scan += 1,
                        (TagMatch::Full, tag) => {
                            let end = self.scan + tag.len();
                            self.scan = end;
                            match tag {
                                PARAM_OPEN => self.state = State::ParamName { start: end },
                                FUNC_OPEN => self.state = State::FunctionName { start: end },
                                FUNC_CLOSE => {
                                    self.close_function(out);
                                    self.state = State::AfterFunction;
                                }
                                _ => {
                                    if in_fn {
                                        self.close_function(out);
                                    }
                                    return self.closed(piece.len());
                                }
                            }
                        }
                    }
                }
                State::ParamName { start } | State::FunctionName { start } => {
                    let start = *start;
                    let Some(gt) = rest.iter().position(|&c| c == b'>') else {
                        self.scan = self.body.len();
                        return Outcome::More;
                    };
                    let end = self.scan + gt;
                    let name = self.body.get(start..end).unwrap_or("").trim().to_string();
                    self.scan = end + 1;
                    if matches!(self.state, State::ParamName { .. }) {
                        let stream = is_string_param(&name, schema).then(StrStream::default);
                        self.state = State::ParamValue {
                            name,
                            start: end + 1,
                            stream,
                        };
                    } else {
                        self.index = self.index.saturating_add(1);
                        self.name = name.clone();
                        self.params = 0;
                        out.push(Delta::ToolCallStart {
                            index: self.index,
                            id: call_id(seed, self.index),
                            name,
                        });
                        self.state = State::InFunction;
                    }
                }
                State::ParamValue { .. } => {
                    let Some(lt) = rest.iter().position(|&c| c == b'<') else {
                        self.scan = self.body.len();
                        self.stream_value(out);
                        return Outcome::More;
                    };
                    let at = self.scan + lt;
                    let tail = &bytes[at..];
                    match match_any(tail, &[PARAM_CLOSE, PARAM_OPEN, FUNC_CLOSE, CALL_CLOSE]) {
                        (TagMatch::Partial, _) => {
                            self.scan = at;
                            self.stream_value(out);
                            return Outcome::More;
                        }
                        (TagMatch::No, _) => self.scan = at + 1,
                        (TagMatch::Full, tag) => {
                            self.end_value(at, out, schemas);
                            let end = at + tag.len();
                            self.scan = end;
                            match tag {
                                PARAM_CLOSE => self.state = State::InFunction,
                                PARAM_OPEN => self.state = State::ParamName { start: end },
                                FUNC_CLOSE => {
                                    self.close_function(out);
                                    self.state = State::AfterFunction;
                                }
                                _ => {
                                    self.close_function(out);
                                    return self.closed(piece.len());
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// End of generation inside the block: a value cut off is taken as it is, and the open
    /// call is closed with what was read.
    pub(super) fn finish(&mut self, out: &mut Vec<Delta>, schemas: &HashMap<String, Value>) {
        match self.state {
            State::ParamValue { .. } => {
                self.end_value(self.body.len(), out, schemas);
                self.close_function(out);
            }
            State::InFunction | State::ParamName { .. } => self.close_function(out),
            State::AfterFunction | State::FunctionName { .. } => {}
        }
        self.state = State::AfterFunction;
    }

    fn closed(&mut self, piece_len: usize) -> Outcome {
        // The tag ends inside `piece` (it was not complete before), so this fits in it.
        let rest_len = self.body.len().saturating_sub(self.scan).min(piece_len);
        self.state = State::AfterFunction;
        Outcome::Closed { rest_len }
    }

    /// Sends what is certain of a string value: all of it read so far (`scan` stops before a
    /// possible tag) but a trailing newline, which is stripped if the value ends there. Nothing
    /// is sent while the value could still be `null`, which is typed null.
    fn stream_value(&mut self, out: &mut Vec<Delta>) {
        let State::ParamValue {
            name,
            start,
            stream: Some(st),
        } = &mut self.state
        else {
            return;
        };
        let Some(raw) = self.body.get(*start..self.scan) else {
            return;
        };
        if raw.is_empty() {
            // The first byte decides whether a leading newline is stripped.
            return;
        }
        let from = *start + usize::from(raw.starts_with('\n'));
        let end = self.scan - usize::from(self.scan > from && raw.ends_with('\n'));
        let Some(text) = self.body.get(from..end) else {
            return;
        };
        if !st.opened {
            if text.len() <= 4 && "null".starts_with(&text.to_ascii_lowercase()) {
                return;
            }
            let mut fragment = key_prefix(self.params, name);
            fragment.push('"');
            out.push(Delta::ToolCallArgs {
                index: self.index,
                fragment,
            });
            self.params += 1;
            st.opened = true;
            st.sent = from;
        }
        if let Some(text) = self.body.get(st.sent..end) {
            if !text.is_empty() {
                out.push(Delta::ToolCallArgs {
                    index: self.index,
                    fragment: escape_str(text),
                });
                st.sent = end;
            }
        }
    }

    /// Emits the parameter whose value ends at byte `end` (or its rest, if it was streamed).
    fn end_value(&mut self, end: usize, out: &mut Vec<Delta>, schemas: &HashMap<String, Value>) {
        let State::ParamValue {
            name,
            start,
            stream,
        } = &self.state
        else {
            return;
        };
        let (start, end) = strip_newlines(&self.body, *start, end);
        let raw = self.body.get(start..end).unwrap_or("");
        let fragment = match stream {
            Some(st) if st.opened => {
                let mut f = escape_str(self.body.get(st.sent.max(start)..end).unwrap_or(""));
                f.push('"');
                f
            }
            _ => {
                let value = convert_value(raw, name, schemas.get(&self.name));
                let mut f = key_prefix(self.params, name);
                f.push_str(&value.to_string());
                self.params += 1;
                f
            }
        };
        out.push(Delta::ToolCallArgs {
            index: self.index,
            fragment,
        });
        self.state = State::InFunction;
    }

    fn close_function(&mut self, out: &mut Vec<Delta>) {
        let fragment = if self.params == 0 { "{}" } else { "}" };
        out.push(Delta::ToolCallArgs {
            index: self.index,
            fragment: fragment.to_string(),
        });
        out.push(Delta::ToolCallEnd { index: self.index });
    }
}

/// `{"name":` for the first parameter, `,"name":` after.
fn key_prefix(params: usize, name: &str) -> String {
    let mut f = String::from(if params == 0 { "{" } else { "," });
    f.push_str(&Value::String(name.to_string()).to_string());
    f.push(':');
    f
}

/// The inside of a JSON string literal: escaping is per char, so pieces escaped one by one join
/// into the escape of the whole.
fn escape_str(s: &str) -> String {
    let quoted = Value::String(s.to_string()).to_string();
    quoted
        .get(1..quoted.len().saturating_sub(1))
        .unwrap_or("")
        .to_string()
}

/// The value's bounds without one leading and one trailing newline, as the reference parser.
fn strip_newlines(body: &str, start: usize, end: usize) -> (usize, usize) {
    let raw = body.get(start..end).unwrap_or("");
    let s = start + usize::from(raw.starts_with('\n'));
    let e = end - usize::from(end > s && raw.ends_with('\n'));
    (s, e)
}

/// The schema's type for a parameter: `None` when the schema does not say (a string).
fn param_type(param: &str, schema: Option<&Value>) -> Option<String> {
    // The reference accepts `{"properties": {..}}` or the properties map itself.
    let schema = schema?;
    let props = schema.get("properties").unwrap_or(schema);
    let p = props.as_object()?.get(param)?;
    match p.get("type") {
        Some(Value::String(t)) => Some(t.trim().to_ascii_lowercase()),
        // `["integer", "null"]`: the first type that is not null.
        Some(Value::Array(ts)) => Some(
            ts.iter()
                .filter_map(Value::as_str)
                .find(|t| *t != "null")
                .unwrap_or("string")
                .trim()
                .to_ascii_lowercase(),
        ),
        _ => None,
    }
}

fn is_string_type(t: &str) -> bool {
    matches!(t, "string" | "str" | "text" | "varchar" | "char" | "enum")
}

/// Whether a parameter's value is a JSON string whatever its text (so it can be streamed).
fn is_string_param(param: &str, schema: Option<&Value>) -> bool {
    match param_type(param, schema) {
        None => true,
        Some(t) => is_string_type(&t),
    }
}

/// Types a parameter value by the tool's schema, as the reference `_convert_param_value`:
/// `null` is null for any type; a parameter the schema does not list is a string; numbers,
/// booleans, objects and arrays are parsed from the text and stay strings if that fails.
/// (The reference parser also tries Python's `ast.literal_eval`; JSON stands in for it here.)
pub(super) fn convert_value(raw: &str, param: &str, schema: Option<&Value>) -> Value {
    if raw.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    let string = || Value::String(raw.to_string());
    let Some(ty) = param_type(param, schema) else {
        return string();
    };
    let t = ty.as_str();
    if is_string_type(t) {
        return string();
    }
    let trimmed = raw.trim();
    if ["int", "uint", "long", "short", "unsigned"]
        .iter()
        .any(|p| t.starts_with(p))
    {
        return trimmed
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| string());
    }
    if t.starts_with("num") || t.starts_with("float") || t.starts_with("double") {
        return match trimmed.parse::<f64>() {
            Ok(f) if f.is_finite() => {
                // Whole numbers are written as integers, as the reference does.
                if f.fract() == 0.0 && f.abs() < 9.0e15 {
                    Value::from(f as i64)
                } else {
                    serde_json::Number::from_f64(f).map_or_else(string, Value::Number)
                }
            }
            _ => string(),
        };
    }
    if matches!(t, "boolean" | "bool" | "binary") {
        return match trimmed.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => string(),
        };
    }
    // object / array / anything else: JSON if it parses.
    serde_json::from_str::<Value>(trimmed).unwrap_or_else(|_| string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::convert_value;

    #[test]
    fn typing() {
        let schema = json!({"type": "object", "properties": {
            "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
            "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"},
            "u": {"type": ["integer", "null"]}, "x": {"description": "untyped"}
        }});
        let c = |v: &str, p: &str| convert_value(v, p, Some(&schema));
        assert_eq!(c("3", "s"), json!("3"));
        assert_eq!(c("3", "i"), json!(3));
        assert_eq!(c(" -7 ", "i"), json!(-7));
        assert_eq!(c("3.5", "i"), json!("3.5"));
        assert_eq!(c("3.0", "n"), json!(3));
        assert_eq!(c("2.5", "n"), json!(2.5));
        assert_eq!(c("1e3", "n"), json!(1000));
        assert_eq!(c("nan", "n"), json!("nan"));
        assert_eq!(c("True", "b"), json!(true));
        assert_eq!(c("false", "b"), json!(false));
        assert_eq!(c("yes", "b"), json!("yes"));
        assert_eq!(c("{\"k\": [1, 2]}", "o"), json!({"k": [1, 2]}));
        assert_eq!(c("{bad", "o"), json!("{bad"));
        assert_eq!(c("[1, \"a\"]", "a"), json!([1, "a"]));
        assert_eq!(c("5", "u"), json!(5));
        assert_eq!(c("null", "i"), json!(null));
        assert_eq!(c("NULL", "s"), json!(null));
        assert_eq!(c("5", "x"), json!("5"));
        assert_eq!(c("5", "missing"), json!("5"));
        assert_eq!(convert_value("5", "i", None), json!("5"));
        // A bare properties map is accepted too.
        let bare = json!({"i": {"type": "int"}});
        assert_eq!(convert_value("5", "i", Some(&bare)), json!(5));
    }
}
