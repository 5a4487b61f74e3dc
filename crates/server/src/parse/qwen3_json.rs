//! Qwen3 (Hermes-style) tool calls: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`.
//!
//! The block between the tags is parsed whole once its closing tag arrives; the arguments are
//! re-serialised compactly (key order kept), as llama-server's `json::dump()` does.

use serde_json::{Map, Value};

/// Name and arguments of one block, or `None` when the block is not a tool call.
///
/// `arguments` must be an object; it may also be spelled `parameters` (some Qwen fine-tunes), may
/// be missing (an empty object) or may be a string holding a JSON object (taken as that object).
pub(super) fn parse_call(block: &str) -> Option<(String, Map<String, Value>)> {
    let v: Value = serde_json::from_str(block.trim()).ok()?;
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    // Clients take the arguments as an object (Anthropic's `tool_use.input` must be one), so
    // anything else means this is not a well-formed call.
    let args = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::String(s)) => {
            // Arguments already encoded as a string: accept it only if it is a JSON object.
            match serde_json::from_str(s).ok()? {
                Value::Object(m) => m,
                _ => return None,
            }
        }
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return None,
    };
    Some((name.to_string(), args))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::parse_call;

    #[test]
    fn blocks() {
        let ok = |b: &str| parse_call(b).map(|(n, a)| format!("{n} {}", Value::Object(a)));
        assert_eq!(
            ok("\n{\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": [true]}}\n").as_deref(),
            Some("f {\"b\":1,\"a\":[true]}")
        );
        assert_eq!(ok("{\"name\": \"f\"}").as_deref(), Some("f {}"));
        assert_eq!(
            ok("{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 2}\"}").as_deref(),
            Some("f {\"x\":2}")
        );
        assert_eq!(
            ok("{\"name\": \"f\", \"parameters\": {\"x\": \"é\"}}").as_deref(),
            Some("f {\"x\":\"é\"}")
        );
        assert_eq!(ok("{\"name\": \"f\", \"arguments\": {"), None);
        assert_eq!(ok("{\"arguments\": {}}"), None);
        assert_eq!(ok("{\"name\": \"\"}"), None);
        assert_eq!(ok("[1]"), None);
        assert_eq!(ok(""), None);
        assert_eq!(ok("{\"name\": \"f\", \"arguments\": \"not json\"}"), None);
        assert_eq!(ok("{\"name\": \"f\", \"arguments\": [1]}"), None);
        assert_eq!(ok("{\"name\": \"f\", \"arguments\": \"3\"}"), None);
    }
}
