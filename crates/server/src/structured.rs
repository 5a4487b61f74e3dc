//! Structured output: the request fields that constrain a reply, turned into one compiled grammar.
//!
//! - OpenAI: `response_format` (`text`, `json_object`, `json_schema`), llama-server's `grammar`
//!   (GBNF) and `json_schema`, and tool calls: `tool_choice: "required"` or a named function forces
//!   one call whose arguments follow the tool's `parameters`; with `"auto"`, tools marked
//!   `strict: true` make the reply either free text without a call or one call with valid
//!   arguments.
//! - Anthropic: `tool_choice` `{"type": "any"}` or `{"type": "tool", "name"}` forces a call whose
//!   `input` follows the tool's `input_schema`.
//! - Ollama: `format: "json"` (any JSON object) or `format: {schema}`.
//!
//! A constrained reply has no reasoning: the template is asked for `enable_thinking: false` (unless
//! the client set it) and the grammar applies from the first token, so the reply's text is the
//! value itself. Forced tool calls are written in the template's tool-call syntax so the ordinary
//! reply parser turns them into tool calls; a forced call under a template without a syntax the
//! grammar can write (Qwen3-Coder's XML form, none at all) is refused with a 400 rather than
//! silently unforced, while `strict` alone then leaves the reply free.

use std::sync::Arc;

use hearth_constrain::{ConstrainError, Constrainer, Grammar, Spec, Tool, ToolSyntax};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::parse::ToolFormat;
use crate::state::Loaded;

/// Which tools a reply must (or may) call.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolForce {
    /// No tool constraint.
    None,
    /// Exactly one call to one of these tool names (empty: any tool).
    Required(Vec<String>),
    /// Free text without a call, or one call with valid arguments to any tool.
    Strict,
}

/// The reply constraint of OpenAI's `response_format`, `grammar` and `json_schema` fields.
pub fn openai_format(
    response_format: Option<&Value>,
    grammar: Option<&str>,
    json_schema: Option<&Value>,
) -> Result<Option<Spec>, ApiError> {
    let from_format = match response_format {
        None | Some(Value::Null) => None,
        Some(Value::Object(rf)) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => None,
            // llama-server also takes a schema next to `json_object`.
            Some("json_object") => Some(match rf.get("schema") {
                Some(s) if !s.is_null() => Spec::JsonSchema(s.clone()),
                _ => Spec::JsonObject,
            }),
            Some("json_schema") => {
                let js = rf.get("json_schema").and_then(Value::as_object);
                let schema = js
                    .and_then(|j| j.get("schema"))
                    .or_else(|| rf.get("schema"));
                match schema {
                    Some(s) if !s.is_null() => Some(Spec::JsonSchema(s.clone())),
                    _ => return Err(ApiError::invalid_param(
                        "response_format",
                        "`response_format.json_schema.schema` is required for type `json_schema`",
                    )),
                }
            }
            other => {
                let got = other.map_or("nothing".to_string(), |t| format!("`{t}`"));
                return Err(ApiError::invalid_param(
                    "response_format",
                    format!("`response_format.type` must be `text`, `json_object` or `json_schema`, got {got}"),
                ));
            }
        },
        Some(_) => {
            return Err(ApiError::invalid_param(
                "response_format",
                "`response_format` must be an object",
            ))
        }
    };
    let given = [
        from_format.is_some(),
        grammar.is_some_and(|g| !g.is_empty()),
        json_schema.is_some_and(|s| !s.is_null()),
    ];
    if given.iter().filter(|&&b| b).count() > 1 {
        return Err(ApiError::bad_request(
            "give only one of `response_format`, `grammar` and `json_schema`",
        ));
    }
    Ok(from_format
        .or_else(|| {
            grammar
                .filter(|g| !g.is_empty())
                .map(|g| Spec::Gbnf(g.to_string()))
        })
        .or_else(|| {
            json_schema
                .filter(|s| !s.is_null())
                .map(|s| Spec::JsonSchema(s.clone()))
        }))
}

/// The reply constraint of Ollama's `format`.
pub fn ollama_format(format: Option<&Value>) -> Result<Option<Spec>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(Spec::JsonObject)),
        Some(Value::String(s)) => Err(ApiError::bad_request(format!(
            "`format` must be \"json\" or a JSON schema, got \"{s}\""
        ))),
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
            Ok(Some(Spec::JsonSchema(schema.clone())))
        }
        Some(_) => Err(ApiError::bad_request(
            "`format` must be \"json\" or a JSON schema",
        )),
    }
}

/// OpenAI's `tool_choice` (with the tools' `strict` flags).
pub fn openai_tool_force(choice: Option<&Value>, tools: &[Value]) -> Result<ToolForce, ApiError> {
    let strict = tools.iter().any(|t| {
        t.get("function")
            .and_then(|f| f.get("strict"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    });
    match choice {
        None | Some(Value::Null) => Ok(if strict {
            ToolForce::Strict
        } else {
            ToolForce::None
        }),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(ToolForce::None),
            "auto" => Ok(if strict {
                ToolForce::Strict
            } else {
                ToolForce::None
            }),
            "required" => Ok(ToolForce::Required(Vec::new())),
            other => Err(ApiError::invalid_param(
                "tool_choice",
                format!("`tool_choice` must be none, auto, required or a function, got `{other}`"),
            )),
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "tool_choice",
                        "`tool_choice.function.name` is required",
                    )
                })?;
            Ok(ToolForce::Required(vec![name.to_string()]))
        }
        Some(_) => Err(ApiError::invalid_param(
            "tool_choice",
            "`tool_choice` must be a string or an object",
        )),
    }
}

/// Anthropic's `tool_choice`.
pub fn anthropic_tool_force(choice: Option<&Value>) -> Result<ToolForce, ApiError> {
    let Some(Value::Object(o)) = choice else {
        return Ok(ToolForce::None);
    };
    match o.get("type").and_then(Value::as_str) {
        Some("any") => Ok(ToolForce::Required(Vec::new())),
        Some("tool") => match o.get("name").and_then(Value::as_str) {
            Some(n) => Ok(ToolForce::Required(vec![n.to_string()])),
            None => Err(ApiError::bad_request(
                "tool_choice.name: required for type \"tool\"",
            )),
        },
        _ => Ok(ToolForce::None),
    }
}

/// The tool-call constraint for `tools` (OpenAI, Anthropic or bare shape) under `force`.
pub fn tool_spec(l: &Loaded, tools: &[Value], force: &ToolForce) -> Result<Option<Spec>, ApiError> {
    let (names, optional) = match force {
        ToolForce::None => return Ok(None),
        ToolForce::Required(names) => (names.as_slice(), false),
        ToolForce::Strict => (&[][..], true),
    };
    let mut all = Vec::with_capacity(tools.len());
    for t in tools {
        let f = t.get("function").unwrap_or(t);
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            continue;
        };
        let strict = f.get("strict").and_then(Value::as_bool).unwrap_or(false);
        let parameters = f
            .get("parameters")
            .or_else(|| f.get("input_schema"))
            .cloned()
            .unwrap_or(Value::Null);
        // With `strict` alone, only strict tools' arguments are held to their schema.
        let parameters = if optional && !strict {
            Value::Null
        } else {
            parameters
        };
        all.push(Tool {
            name: name.to_string(),
            parameters,
        });
    }
    if all.is_empty() {
        return Err(ApiError::bad_request(
            "a tool call is required but no tools are given",
        ));
    }
    let chosen: Vec<Tool> = if names.is_empty() {
        all
    } else {
        let picked: Vec<Tool> = all
            .into_iter()
            .filter(|t| names.contains(&t.name))
            .collect();
        if picked.is_empty() {
            return Err(ApiError::bad_request(format!(
                "tool_choice names `{}`, which is not among the tools",
                names.join("`, `")
            )));
        }
        picked
    };
    let syntax = match l.tool_format {
        ToolFormat::Qwen3Json => ToolSyntax::Qwen3Json,
        // `strict` is set by default by some SDKs: where the grammar cannot write the template's
        // syntax, the reply stays free (the parser still reads calls) rather than failing.
        _ if optional => return Ok(None),
        ToolFormat::Qwen3CoderXml => {
            return Err(ApiError::bad_request(
                "forcing a tool call is not supported for this model's tool-call syntax (Qwen3-Coder XML); use tool_choice auto",
            ))
        }
        ToolFormat::None => {
            return Err(ApiError::bad_request(
                "this model's chat template has no tool-call syntax, so a tool call cannot be forced",
            ))
        }
    };
    Ok(Some(Spec::ToolCall {
        syntax,
        tools: chosen,
        optional,
    }))
}

/// A reply may have one constraint: a format and a forced tool call together are refused.
pub fn one_of(format: Option<Spec>, tools: Option<Spec>) -> Result<Option<Spec>, ApiError> {
    match (format, tools) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "a reply can follow a response format or a forced tool call, not both",
        )),
        (f, t) => Ok(f.or(t)),
    }
}

/// Template variables for a constrained reply: thinking off unless the client decided.
pub fn no_thinking(mut kwargs: Map<String, Value>) -> Map<String, Value> {
    kwargs
        .entry("enable_thinking")
        .or_insert(Value::Bool(false));
    kwargs
}

/// Compiles `spec` for this model; a spec the engine refuses is a 400 naming why (`param` is the
/// request field it came from).
pub fn compile(l: &Loaded, param: &str, spec: &Spec) -> Result<Grammar, ApiError> {
    let c: Arc<Constrainer> = l
        .constrainer()
        .map_err(|e| ApiError::internal(format!("structured output is unavailable: {e}")))?;
    c.compile(spec).map_err(|e| match e {
        ConstrainError::Vocab(_) | ConstrainError::Violated(_) => ApiError::internal(e.to_string()),
        _ => ApiError::invalid_param(param, format!("`{param}`: {e}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_formats() {
        assert_eq!(openai_format(None, None, None).unwrap(), None);
        assert_eq!(
            openai_format(Some(&json!({"type": "text"})), None, None).unwrap(),
            None
        );
        assert_eq!(
            openai_format(Some(&json!({"type": "json_object"})), None, None).unwrap(),
            Some(Spec::JsonObject)
        );
        let s = json!({"type": "integer"});
        assert_eq!(
            openai_format(Some(&json!({"type": "json_schema", "json_schema": {"name": "n", "schema": s, "strict": true}})), None, None).unwrap(),
            Some(Spec::JsonSchema(s.clone()))
        );
        assert_eq!(
            openai_format(None, Some("root ::= \"a\""), None).unwrap(),
            Some(Spec::Gbnf("root ::= \"a\"".into()))
        );
        assert_eq!(
            openai_format(None, None, Some(&s)).unwrap(),
            Some(Spec::JsonSchema(s.clone()))
        );
        for bad in [
            json!({"type": "xml"}),
            json!({"type": "json_schema"}),
            json!("json"),
        ] {
            assert!(openai_format(Some(&bad), None, None).is_err(), "{bad}");
        }
        assert!(openai_format(
            Some(&json!({"type": "json_object"})),
            Some("root ::= \"a\""),
            None
        )
        .is_err());
    }

    #[test]
    fn ollama_formats() {
        assert_eq!(
            ollama_format(Some(&json!("json"))).unwrap(),
            Some(Spec::JsonObject)
        );
        assert_eq!(ollama_format(Some(&json!(""))).unwrap(), None);
        assert_eq!(
            ollama_format(Some(&json!({"type": "object"}))).unwrap(),
            Some(Spec::JsonSchema(json!({"type": "object"})))
        );
        assert!(ollama_format(Some(&json!("yaml"))).is_err());
        assert!(ollama_format(Some(&json!(3))).is_err());
    }

    #[test]
    fn tool_choices() {
        let strict = [json!({"type": "function", "function": {"name": "f", "strict": true}})];
        assert_eq!(openai_tool_force(None, &[]).unwrap(), ToolForce::None);
        assert_eq!(openai_tool_force(None, &strict).unwrap(), ToolForce::Strict);
        assert_eq!(
            openai_tool_force(Some(&json!("none")), &strict).unwrap(),
            ToolForce::None
        );
        assert_eq!(
            openai_tool_force(Some(&json!("required")), &[]).unwrap(),
            ToolForce::Required(vec![])
        );
        assert_eq!(
            openai_tool_force(
                Some(&json!({"type": "function", "function": {"name": "f"}})),
                &[]
            )
            .unwrap(),
            ToolForce::Required(vec!["f".into()])
        );
        assert!(openai_tool_force(Some(&json!("sometimes")), &[]).is_err());
        assert_eq!(
            anthropic_tool_force(Some(&json!({"type": "any"}))).unwrap(),
            ToolForce::Required(vec![])
        );
        assert_eq!(
            anthropic_tool_force(Some(&json!({"type": "tool", "name": "g"}))).unwrap(),
            ToolForce::Required(vec!["g".into()])
        );
        assert_eq!(
            anthropic_tool_force(Some(&json!({"type": "auto"}))).unwrap(),
            ToolForce::None
        );
    }
}
