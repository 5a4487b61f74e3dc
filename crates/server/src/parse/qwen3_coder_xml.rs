//! Qwen3-Coder tool calls:
//! `<tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>\n</function>\n</tool_call>`.
//!
//! Follows Qwen's reference parser (`qwen3coder_tool_parser.py`, as shipped in vLLM) where it is
//! safe: one leading and one trailing newline of a value are stripped; values are typed by the
//! tool's parameter schema (`_convert_param_value`); text between the tags that is not a parameter
//! is ignored; several `<function=` in one block are several calls. It differs where the
//! reference would cut a value or run a broken call:
//! - A value is code as often as not, so a `</parameter>` ends it only when what follows (after
//!   whitespace) is the next tag the template writes there: `<parameter=`, `</function>` or
//!   `</tool_call>`, or the end of the output. A `</parameter>` inside the value stays in it.
//! - A value the model left open ends at `<parameter=`, `</function>` or `</tool_call>` only at
//!   the start of a line, where the template puts them; inline they are value text.
//! - A call is emitted whole when its `</function>` (or the block's `</tool_call>`) arrives, never
//!   piece by piece: a call cut off by the end of the output must come back as text, and what was
//!   streamed cannot be taken back. The cut-off function's text is returned as it was written.
//! - A function the request did not offer ends the block: its text, and what follows, is answer
//!   text again.
//!
//! The opening `<tool_call>` + `<function=NAME>` is matched by the caller; this file takes over
//! after it. Work is linear in the block's length: the scan never moves back, and a call's text is
//! held once.

use std::collections::HashMap;

use serde_json::Value;

use super::scan::{is_ws, match_any, TagMatch};
use super::{call_id, Delta};

const PARAM_OPEN: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";
const FUNC_OPEN: &str = "<function=";
const FUNC_CLOSE: &str = "</function>";
const CALL_CLOSE: &str = "</tool_call>";
/// The tags that may follow a parameter's value.
const AFTER_VALUE: &[&str] = &[PARAM_OPEN, FUNC_CLOSE, CALL_CLOSE];
/// Longest whitespace run after `</parameter>` still read as the gap before the next tag.
const MAX_GAP: usize = 256;
/// Longest function name in `<function=NAME>` after the first.
const MAX_NAME: usize = 256;

/// Where the scanner is inside the block.
#[derive(Debug)]
enum State {
    /// Between parameters of an open function.
    InFunction,
    /// Reading a parameter name that starts at `start` (after `<parameter=`).
    ParamName { start: usize },
    /// Reading the value of `name`, which starts at `start`.
    ParamValue { name: String, start: usize },
    /// A `</parameter>` at `end` (the value is `start..end`) may close the value; what follows
    /// `after` decides.
    ParamClose {
        name: String,
        start: usize,
        end: usize,
        after: usize,
    },
    /// After `</function>` (which ended at `from`): expecting `</tool_call>` or another
    /// `<function=`.
    AfterFunction { from: usize },
    /// Reading a function name that starts at `start`; its `<function=` is at `tag`.
    FunctionName { start: usize, tag: usize },
}

/// One open `<tool_call>` block.
#[derive(Debug)]
pub(super) struct XmlCall {
    /// The block as written, from its `<tool_call>`.
    text: String,
    /// Whitespace dropped before the block, given back with it if the first call is cut off.
    lead_ws: String,
    /// Next byte of `text` to examine; always a char boundary.
    scan: usize,
    state: State,
    /// Where the open function's text starts in `text` (0 for the first, which owns the opening).
    func_start: usize,
    /// Name of the open function.
    name: String,
    /// Parameters read for the open function: (name, raw value), in order written.
    params: Vec<(String, String)>,
    /// Index of the next call emitted.
    next_index: usize,
    /// Calls emitted by this block.
    emitted: usize,
}

/// What a piece of text did to the block.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Still open.
    More,
    /// The block ended; `rest` (everything after it) is to be read as answer text again.
    Closed { rest: String },
}

impl XmlCall {
    /// Opens a block whose text so far is `opening` (`<tool_call>`, whitespace, `<function=NAME>`)
    /// for call `index` of function `name`.
    pub(super) fn open(opening: &str, lead_ws: String, name: String, index: usize) -> XmlCall {
        XmlCall {
            text: opening.to_string(),
            lead_ws,
            scan: opening.len(),
            state: State::InFunction,
            func_start: 0,
            name,
            params: Vec::new(),
            next_index: index,
            emitted: 0,
        }
    }

    /// Index the next call in the reply gets.
    pub(super) fn next_index(&self) -> usize {
        self.next_index
    }

    /// Whether this block emitted a call.
    pub(super) fn emitted(&self) -> bool {
        self.emitted > 0
    }

    /// Adds a piece of the block and emits the calls it completes.
    pub(super) fn push(&mut self, piece: &str, out: &mut Vec<Delta>, cx: &Context) -> Outcome {
        self.text.push_str(piece);
        loop {
            let Some(rest) = self.text.as_bytes().get(self.scan..) else {
                return Outcome::More;
            };
            if rest.is_empty() {
                return Outcome::More;
            }
            match self.step(out, cx) {
                Step::Continue => {}
                Step::Wait => return Outcome::More,
                Step::Closed { rest_from } => {
                    let rest = self.text.get(rest_from..).unwrap_or("").to_string();
                    return Outcome::Closed { rest };
                }
            }
        }
    }

    /// One move of the scanner at `scan`, which is before the end of `text`.
    fn step(&mut self, out: &mut Vec<Delta>, cx: &Context) -> Step {
        let bytes = self.text.as_bytes();
        let rest = &bytes[self.scan..];
        match &self.state {
            State::InFunction | State::AfterFunction { .. } => {
                let in_fn = matches!(self.state, State::InFunction);
                if rest[0] != b'<' {
                    // Whitespace or stray text between tags: skipped. Jump to the next tag.
                    self.scan += rest.iter().position(|&c| c == b'<').unwrap_or(rest.len());
                    return Step::Continue;
                }
                let tags: &[&'static str] = if in_fn {
                    AFTER_VALUE
                } else {
                    &[FUNC_OPEN, CALL_CLOSE]
                };
                match match_any(rest, tags) {
                    (TagMatch::Partial, _) => Step::Wait,
                    (TagMatch::No, _) => {
                        self.scan += 1;
                        Step::Continue
                    }
                    (TagMatch::Full, tag) => {
                        let at = self.scan;
                        self.scan += tag.len();
                        match tag {
                            PARAM_OPEN => {
                                self.state = State::ParamName { start: self.scan };
                                Step::Continue
                            }
                            FUNC_OPEN => {
                                self.state = State::FunctionName {
                                    start: self.scan,
                                    tag: at,
                                };
                                Step::Continue
                            }
                            FUNC_CLOSE => {
                                self.close_function(out, cx);
                                self.state = State::AfterFunction { from: self.scan };
                                Step::Continue
                            }
                            _ => {
                                if in_fn {
                                    self.close_function(out, cx);
                                }
                                self.state = State::AfterFunction { from: self.scan };
                                Step::Closed {
                                    rest_from: self.scan,
                                }
                            }
                        }
                    }
                }
            }
            State::ParamName { start } => {
                let start = *start;
                let Some(gt) = rest.iter().position(|&c| c == b'>') else {
                    self.scan = self.text.len();
                    return Step::Wait;
                };
                let end = self.scan + gt;
                let name = self.text.get(start..end).unwrap_or("").trim().to_string();
                self.scan = end + 1;
                self.state = State::ParamValue {
                    name,
                    start: end + 1,
                };
                Step::Continue
            }
            State::FunctionName { start, tag } => {
                let (start, tag) = (*start, *tag);
                // Searched from the name's start each time: it is at most MAX_NAME bytes.
                let region = &bytes[start..];
                let stop = region
                    .iter()
                    .take(MAX_NAME + 1)
                    .position(|&c| matches!(c, b'>' | b'<' | b'\n'));
                let name = match stop {
                    Some(n) if region[n] == b'>' => self.text.get(start..start + n),
                    None if region.len() <= MAX_NAME => {
                        self.scan = self.text.len();
                        return Step::Wait;
                    }
                    _ => None,
                };
                let name = name.map(str::trim).unwrap_or("");
                if name.is_empty() || !cx.offered(name) {
                    // Not a call this request allows: the rest of the block is text again.
                    tracing::warn!(
                        function = name,
                        "the model called a function the request did not offer; returned as text"
                    );
                    self.state = State::AfterFunction { from: tag };
                    return Step::Closed { rest_from: tag };
                }
                self.name = name.to_string();
                self.params.clear();
                self.func_start = tag;
                self.scan = start + stop.unwrap_or(0) + 1;
                self.state = State::InFunction;
                Step::Continue
            }
            State::ParamValue { name, start } => {
                let (name, start) = (name.clone(), *start);
                let Some(lt) = rest.iter().position(|&c| c == b'<') else {
                    self.scan = self.text.len();
                    return Step::Wait;
                };
                let at = self.scan + lt;
                let tail = &bytes[at..];
                // Tags other than `</parameter>` end an open value only at a line start.
                let line_start = at == start || bytes.get(at.wrapping_sub(1)) == Some(&b'\n');
                let tags: &[&'static str] = if line_start {
                    &[PARAM_CLOSE, PARAM_OPEN, FUNC_CLOSE, CALL_CLOSE]
                } else {
                    &[PARAM_CLOSE]
                };
                match match_any(tail, tags) {
                    (TagMatch::Partial, _) => {
                        self.scan = at;
                        Step::Wait
                    }
                    (TagMatch::No, _) => {
                        self.scan = at + 1;
                        Step::Continue
                    }
                    (TagMatch::Full, PARAM_CLOSE) => {
                        self.state = State::ParamClose {
                            name,
                            start,
                            end: at,
                            after: at + PARAM_CLOSE.len(),
                        };
                        self.scan = at + PARAM_CLOSE.len();
                        Step::Continue
                    }
                    (TagMatch::Full, _) => {
                        // An open value ends here; the tag is read as between parameters.
                        self.end_value(&name, start, at);
                        self.scan = at;
                        self.state = State::InFunction;
                        Step::Continue
                    }
                }
            }
            State::ParamClose {
                name,
                start,
                end,
                after,
            } => {
                let (name, start, end, after) = (name.clone(), *start, *end, *after);
                let gap_and_rest = &bytes[after..];
                let gap = gap_and_rest.iter().take_while(|b| is_ws(**b)).count();
                let next = &gap_and_rest[gap..];
                let decided = if gap > MAX_GAP {
                    Some(false)
                } else if next.is_empty() {
                    None
                } else {
                    match match_any(next, AFTER_VALUE) {
                        (TagMatch::Full, _) => Some(true),
                        (TagMatch::Partial, _) => None,
                        (TagMatch::No, _) => Some(false),
                    }
                };
                match decided {
                    None => {
                        self.scan = self.text.len();
                        Step::Wait
                    }
                    Some(true) => {
                        self.end_value(&name, start, end);
                        self.scan = after + gap;
                        self.state = State::InFunction;
                        Step::Continue
                    }
                    Some(false) => {
                        // Value text that looks like a closing tag: the value goes on.
                        self.scan = after;
                        self.state = State::ParamValue { name, start };
                        Step::Continue
                    }
                }
            }
        }
    }

    /// End of the output inside the block: calls already complete stand; a function cut off is
    /// returned as the text it was, and so is text written after the last `</function>` when no
    /// `</tool_call>` followed.
    pub(super) fn finish(&mut self) -> String {
        let state = std::mem::replace(&mut self.state, State::AfterFunction { from: 0 });
        match state {
            State::AfterFunction { from } => {
                // Only whitespace or a cut-off `</tool_call>` after the last call: nothing lost.
                let tail = self.text.get(from..).unwrap_or("");
                let t = tail.trim();
                if t.is_empty() || CALL_CLOSE.starts_with(t) {
                    String::new()
                } else {
                    tail.to_string()
                }
            }
            _ => {
                tracing::warn!(
                    function = %self.name,
                    "a tool call was cut off by the end of the reply; returned as text"
                );
                let cut = self.text.get(self.func_start..).unwrap_or("");
                if self.func_start == 0 {
                    format!("{}{cut}", self.lead_ws)
                } else {
                    cut.to_string()
                }
            }
        }
    }

    /// Records the value of `name` spanning `start..end` (newlines still to strip).
    fn end_value(&mut self, name: &str, start: usize, end: usize) {
        let (s, e) = strip_newlines(&self.text, start, end);
        let raw = self.text.get(s..e).unwrap_or("").to_string();
        // A parameter written twice keeps its first place and its last value.
        match self.params.iter_mut().find(|(n, _)| n == name) {
            Some(p) => p.1 = raw,
            None => self.params.push((name.to_string(), raw)),
        }
    }

    /// Emits the open function as a whole call.
    fn close_function(&mut self, out: &mut Vec<Delta>, cx: &Context) {
        let schema = cx.schemas.get(&self.name);
        let mut args = serde_json::Map::new();
        for (k, raw) in self.params.drain(..) {
            let v = convert_value(&raw, &k, schema);
            args.insert(k, v);
        }
        let index = self.next_index;
        out.push(Delta::ToolCallStart {
            index,
            id: call_id(cx.seed, index),
            name: std::mem::take(&mut self.name),
        });
        out.push(Delta::ToolCallArgs {
            index,
            fragment: Value::Object(args).to_string(),
        });
        out.push(Delta::ToolCallEnd { index });
        self.next_index = index.saturating_add(1);
        self.emitted += 1;
    }
}

/// What the block needs to know about the request.
pub(super) struct Context<'a> {
    /// Parameter schemas by tool name; the names are the tools offered (empty: any name).
    pub schemas: &'a HashMap<String, Value>,
    /// Seed of the call ids.
    pub seed: u64,
}

impl Context<'_> {
    /// Whether the request offered a function of this name (any name when it listed none).
    pub fn offered(&self, name: &str) -> bool {
        self.schemas.is_empty() || self.schemas.contains_key(name)
    }
}

/// Result of one scanner move.
enum Step {
    Continue,
    /// More text is needed to decide.
    Wait,
    /// The block ended; text from this byte on is answer text.
    Closed {
        rest_from: usize,
    },
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

/// Whether the schema declares `param` with a type other than string, so that text written for
/// it should be converted (used for Qwen3 JSON arguments the model wrote as strings).
pub(super) fn declares_non_string(param: &str, schema: Option<&Value>) -> bool {
    param_type(param, schema).is_some_and(|t| !is_string_type(&t))
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
