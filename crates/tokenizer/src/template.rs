//! Chat templates: `tokenizer.chat_template` rendered the way transformers' `apply_chat_template`
//! renders it, byte for byte.
//!
//! transformers compiles the Jinja source in an `ImmutableSandboxedEnvironment` with
//! `trim_blocks=True`, `lstrip_blocks=True` (and `keep_trailing_newline` left off), the `loopcontrols`
//! extension and its `{% generation %}` tag, replaces the `tojson` filter with
//! `json.dumps(ensure_ascii=False)`, adds the globals `raise_exception` and `strftime_now`, and renders
//! with `messages`, `tools`, `documents`, `add_generation_prompt`, the special tokens and the caller's
//! extra keyword arguments (`enable_thinking`...). [`ChatTemplate`] sets MiniJinja up the same way
//! (MiniJinja is sandboxed by construction: templates see only the values passed in, with no route
//! to host objects, which is what jinja2's sandbox has to police) and closes the gaps between
//! MiniJinja and jinja2 that templates actually hit:
//!
//! * printing and `|string` use Python's `str()` (`True`, `None`, `['a', 1]`, `1e-07`) — see
//!   `pyrepr`;
//! * `tojson` is CPython's `json.dumps` with transformers' options — see `json`;
//! * Python string methods (`.strip()`, `.split(sep)[-1]`, `.startswith()`...) come from
//!   `minijinja_contrib::pycompat`, with the ones whose results differ from Python redone in `pystr`;
//! * `|string`, `|items`, `|trim`, `|join`, `|round`, `|length` and the `iterable` / `sequence` /
//!   `number` tests follow jinja2 — see `filters`.
//!
//! A known remaining difference: the `~` operator converts its operands with MiniJinja's spelling,
//! which agrees with Python's for strings, ints, bools, none and plain floats but not for floats in
//! exponent form (`1e-07`) or lists and maps (`["a"]` where Python says `['a']`); the templates in
//! use apply `|string` or `|tojson` to such values first.
//!
//! Templates come from model files and command lines, so rendering is bounded: every render has an
//! instruction budget ("fuel", so `{% for i in range(10**9) %}` or runaway recursion ends in an
//! error instead of a hang), recursion is capped, and output beyond a size limit is an error.
//! Request data (messages, tools, kwargs) cannot get around these bounds. A template written to
//! attack its host can get around them in process: MiniJinja offers no hook on `~`, `*` or
//! `namespace()` assignments, so a loop doubling a string held in a namespace exhausts memory in a
//! few dozen steps, and a list nested a few hundred thousand levels deep overflows the stack when
//! MiniJinja drops it. [`ChatTemplate::isolate`] therefore moves rendering into worker processes
//! with their own memory limit ([`isolated`]): such a template then fails its render with
//! [`TemplateError::ResourceLimit`] and nothing else is lost. Servers render that way; without
//! isolation a template is trusted as much as the file or command line it comes from.

pub mod builtin;
mod clock;
mod filters;
pub mod isolated;
mod json;
mod pyrepr;
mod pystr;

use minijinja::value::{Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use std::borrow::Cow;
use std::io;

/// The name the template is registered under in its environment (it shows up in error messages).
const TEMPLATE_NAME: &str = "chat_template";

/// Longest template source accepted; real ones are a few KiB to a few tens of KiB.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;

/// The ChatML template used when a model file carries none (the caller warns). It is the common
/// minimal form: `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
/// `<|im_start|>assistant\n` when a generation prompt is asked for.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// Bounds on one render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// MiniJinja instructions one render may execute. Real templates use a few hundred per message;
    /// the default leaves room for conversations of many thousands of messages and stops a runaway
    /// loop within about a second.
    pub fuel: u64,
    /// Largest rendered prompt in bytes.
    pub max_output_bytes: usize,
    /// Deepest nesting of macro calls and includes.
    pub recursion_limit: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            fuel: 20_000_000,
            max_output_bytes: 16 << 20,
            recursion_limit: 100,
        }
    }
}

/// Everything a failed compile or render can report.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The source does not parse.
    #[error("chat template syntax error at line {line}, column {column}: {message}")]
    Syntax {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column (in characters) of the error.
        column: usize,
        /// What the parser found.
        message: String,
    },
    /// The template called `raise_exception(message)`, usually to reject the conversation's shape
    /// ("Conversation roles must alternate user/assistant/...").
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    /// Any other failure while rendering (undefined attribute, wrong type, unknown filter...).
    #[error("chat template render error{}: {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Render {
        /// MiniJinja's description of the failure.
        message: String,
        /// 1-based line of the template being executed, when known.
        line: Option<usize>,
    },
    /// The render used up its instruction budget (an endless or enormous loop, deep recursion).
    #[error("chat template ran out of its budget of {fuel} instructions (runaway loop?)")]
    OutOfFuel {
        /// The budget that was exhausted.
        fuel: u64,
    },
    /// The rendered text grew past the limit.
    #[error("chat template output exceeds {limit} bytes")]
    OutputTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The template source is implausibly large.
    #[error("chat template source is {len} bytes, more than the {limit} accepted")]
    SourceTooLarge {
        /// Size of the source given.
        len: usize,
        /// [`MAX_SOURCE_BYTES`].
        limit: usize,
    },
    /// A template file could not be read.
    #[error("cannot read chat template {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The inputs cannot be passed to a template (an extra keyword argument that would replace
    /// `messages`, `tools`, `documents` or `add_generation_prompt`, which Python rejects too).
    #[error("invalid chat template input: {0}")]
    InvalidInput(String),
    /// The render exhausted its worker's memory (or stack): the template builds values too large
    /// to keep (a template bomb).
    #[error("chat template exceeded its memory budget of {} MiB while rendering (a runaway template?)", limit_bytes >> 20)]
    ResourceLimit {
        /// The worker's memory limit.
        limit_bytes: u64,
    },
    /// The render took longer than its worker's time limit.
    #[error("chat template render took longer than {seconds} s")]
    Timeout {
        /// The limit.
        seconds: f64,
    },
    /// A render worker could not be started or answered nonsense.
    #[error("{0}")]
    Worker(String),
    /// Every render worker stayed busy for as long as a render may take: the request waited
    /// its turn that long and gives up (retry later).
    #[error("every chat template worker was busy for {seconds} s; retry later")]
    Busy {
        /// How long it waited.
        seconds: f64,
    },
}

impl TemplateError {
    /// Whether the template itself is at fault in a way no conversation can avoid (it ran out of
    /// memory or time, or could not run at all), as opposed to refusing this conversation.
    pub fn is_resource(&self) -> bool {
        matches!(
            self,
            TemplateError::ResourceLimit { .. }
                | TemplateError::Timeout { .. }
                | TemplateError::Worker(_)
                | TemplateError::OutOfFuel { .. }
                | TemplateError::OutputTooLarge { .. }
        )
    }
}

/// What a chat template is rendered with; the names are the variables the template sees.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatInput {
    /// The conversation: objects with `role`, `content` (string, null, or a list of parts) and
    /// optionally `reasoning_content`, `tool_calls` (each `{"type": "function", "function": {"name",
    /// "arguments"}}`, arguments an object or a JSON string), `tool_call_id`, `name`. Passed as given.
    pub messages: Vec<serde_json::Value>,
    /// Tool definitions (JSON schemas), or `None` for a request without tools. Templates see `tools`
    /// either way (as none when absent), as with transformers.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Whether to end with the header of an assistant turn for the model to continue.
    pub add_generation_prompt: bool,
    /// Extra variables (`enable_thinking`, and whatever else a request's `chat_template_kwargs`
    /// carries). They override `bos_token` / `eos_token`.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// Text of the BOS token, for templates that write `{{ bos_token }}`.
    pub bos_token: String,
    /// Text of the EOS token.
    pub eos_token: String,
}

/// Variables transformers passes by name, which extra keyword arguments cannot replace.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// A compiled chat template with its sandboxed environment. Compile once, render per request;
/// it is `Send + Sync`.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    limits: Limits,
    /// Render workers, once [`ChatTemplate::isolate`]d.
    workers: Option<isolated::Workers>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("limits", &self.limits)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` with the default [`Limits`]. A syntax error names its line and column.
    pub fn new(source: &str) -> Result<ChatTemplate, TemplateError> {
        ChatTemplate::with_limits(source, Limits::default())
    }

    /// Compiles `source` with explicit bounds on each render.
    pub fn with_limits(source: &str, limits: Limits) -> Result<ChatTemplate, TemplateError> {
        if source.len() > MAX_SOURCE_BYTES {
            return Err(TemplateError::SourceTooLarge {
                len: source.len(),
                limit: MAX_SOURCE_BYTES,
            });
        }
        let rewritten = rewrite_generation_tags(source);
        let mut env = environment(&limits);
        env.add_template_owned(TEMPLATE_NAME, rewritten.clone().into_owned())
            .map_err(|e| convert_error(e, &rewritten, &limits, false))?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            limits,
            workers: None,
        })
    }

    /// Reads and compiles a template file (`--chat-template FILE`).
    pub fn from_path(path: &std::path::Path) -> Result<ChatTemplate, TemplateError> {
        let read = |source| TemplateError::Read {
            path: path.to_path_buf(),
            source,
        };
        let len = std::fs::metadata(path).map_err(read)?.len();
        if len > MAX_SOURCE_BYTES as u64 {
            return Err(TemplateError::SourceTooLarge {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                limit: MAX_SOURCE_BYTES,
            });
        }
        let source = std::fs::read_to_string(path).map_err(read)?;
        ChatTemplate::new(&source)
    }

    /// The ChatML fallback ([`CHATML_TEMPLATE`]) for model files without a template.
    pub fn chatml() -> ChatTemplate {
        match ChatTemplate::new(CHATML_TEMPLATE) {
            Ok(t) => t,
            // The constant is covered by tests; this arm is unreachable in practice.
            Err(e) => unreachable!("built-in ChatML template does not compile: {e}"),
        }
    }

    /// The source this template was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The bounds each render runs under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// From now on, renders run in worker processes started by `cmd`, each under its memory and
    /// time limits (see [`isolated`]).
    pub fn isolate(mut self, cmd: isolated::WorkerCommand) -> ChatTemplate {
        self.workers = Some(isolated::Workers::new(&self, cmd));
        self
    }

    /// Whether renders run in worker processes.
    pub fn is_isolated(&self) -> bool {
        self.workers.is_some()
    }

    /// A dry render of a short sample conversation (system, user, assistant, user), to find a
    /// template that cannot render at all before the first request does.
    pub fn check(&self) -> Result<(), TemplateError> {
        let msg = |role: &str, content: &str| serde_json::json!({"role": role, "content": content});
        let input = ChatInput {
            messages: vec![
                msg("system", "You are a helpful assistant."),
                msg("user", "Hello!"),
                msg("assistant", "Hello! How can I help?"),
                msg("user", "What is 2 + 2?"),
            ],
            add_generation_prompt: true,
            ..ChatInput::default()
        };
        match self.render(&input) {
            Err(e) if e.is_resource() => Err(e),
            // A template may refuse this conversation (no system role, say): not a defect.
            _ => Ok(()),
        }
    }

    /// Renders the prompt for `input` (in a worker when isolated).
    pub fn render(&self, input: &ChatInput) -> Result<String, TemplateError> {
        match &self.workers {
            Some(w) => w.render(input),
            None => self.render_here(input),
        }
    }

    /// Renders in this process, whether isolated or not (what a worker runs).
    pub fn render_here(&self, input: &ChatInput) -> Result<String, TemplateError> {
        let ctx = context(input)?;
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| convert_error(e, &self.source, &self.limits, false))?;
        let mut sink = CappedWriter {
            buf: Vec::new(),
            limit: self.limits.max_output_bytes,
            overflowed: false,
        };
        let result = template.render_captured_to(ctx, &mut sink);
        if let Err(e) = result {
            return Err(convert_error(
                e,
                &self.source,
                &self.limits,
                sink.overflowed,
            ));
        }
        String::from_utf8(sink.buf).map_err(|e| TemplateError::Render {
            message: format!("rendered text is not UTF-8: {e}"),
            line: None,
        })
    }
}

/// The sandboxed environment with transformers' settings and this module's Python shims.
fn environment(limits: &Limits) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // jinja2's default `Undefined`: prints empty, is falsy and iterable, errors on attribute access.
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_debug(false);
    env.set_fuel(Some(limits.fuel));
    env.set_recursion_limit(limits.recursion_limit);

    env.set_formatter(|out, _state, value| {
        let written = match value.as_str() {
            Some(s) if value.kind() == ValueKind::String => out.write_str(s),
            _ => out.write_str(&pyrepr::py_str(value)?),
        };
        written.map_err(|_| Error::new(ErrorKind::WriteFailure, "cannot write output"))
    });
    env.set_unknown_method_callback(pystr::method_callback);

    env.add_filter("tojson", json::tojson);
    env.add_filter("string", filters::string);
    env.add_filter("items", filters::items);
    env.add_filter("trim", filters::trim);
    env.add_filter("join", filters::join);
    env.add_filter("round", filters::round);
    env.add_filter("length", filters::length);
    env.add_filter("count", filters::length);
    // jinja2's tests are Python's protocols: a string is a sequence, none is not iterable, a bool
    // is a number. MiniJinja answers these three differently.
    env.add_test("iterable", |v: &Value| {
        !matches!(
            v.kind(),
            ValueKind::None
                | ValueKind::Bool
                | ValueKind::Number
                | ValueKind::Plain
                | ValueKind::Invalid
        )
    });
    env.add_test("sequence", |v: &Value| {
        matches!(
            v.kind(),
            ValueKind::String
                | ValueKind::Bytes
                | ValueKind::Seq
                | ValueKind::Map
                | ValueKind::Undefined
        )
    });
    env.add_test("number", |v: &Value| {
        matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
    });
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |format: &str| {
        clock::DateTime::now_utc().strftime(format)
    });
    env
}

/// Marks an error as coming from the template's own `raise_exception`.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: &Value) -> Result<Value, Error> {
    let message = pyrepr::py_str(message)?;
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// The template's variables, as transformers passes them:
/// `render(messages=..., tools=..., documents=None, add_generation_prompt=..., **special_tokens, **kwargs)`.
fn context(input: &ChatInput) -> Result<Value, TemplateError> {
    if let Some(key) = RESERVED.iter().find(|k| input.kwargs.contains_key(**k)) {
        return Err(TemplateError::InvalidInput(format!(
            "chat template keyword argument `{key}` would replace a variable the caller sets"
        )));
    }
    let mut vars: Vec<(String, Value)> = vec![
        ("messages".into(), Value::from_serialize(&input.messages)),
        ("tools".into(), Value::from_serialize(&input.tools)),
        ("documents".into(), Value::from(())),
        (
            "add_generation_prompt".into(),
            Value::from(input.add_generation_prompt),
        ),
    ];
    let mut specials = vec![
        ("bos_token", input.bos_token.as_str()),
        ("eos_token", input.eos_token.as_str()),
    ];
    specials.retain(|(k, _)| !input.kwargs.contains_key(*k));
    vars.extend(
        specials
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Value::from(v))),
    );
    vars.extend(
        input
            .kwargs
            .iter()
            .map(|(k, v)| (k.clone(), Value::from_serialize(v))),
    );
    Ok(Value::from_iter(vars))
}

/// Collects the rendered text and refuses to grow past `limit`.
struct CappedWriter {
    buf: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("chat template output limit reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn convert_error(err: Error, source: &str, limits: &Limits, overflowed: bool) -> TemplateError {
    if overflowed {
        return TemplateError::OutputTooLarge {
            limit: limits.max_output_bytes,
        };
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&err);
    while let Some(c) = cause {
        if let Some(raised) = c.downcast_ref::<Raised>() {
            return TemplateError::Raised(raised.0.clone());
        }
        cause = c.source();
    }
    match err.kind() {
        ErrorKind::OutOfFuel => TemplateError::OutOfFuel { fuel: limits.fuel },
        ErrorKind::SyntaxError | ErrorKind::BadEscape => {
            let line = err.line().unwrap_or(0);
            let column = err
                .range()
                .and_then(|r| column_of(source, r.start))
                .unwrap_or(1);
            TemplateError::Syntax {
                line,
                column,
                message: err.detail().unwrap_or("invalid syntax").to_owned(),
            }
        }
        _ => TemplateError::Render {
            message: err.to_string(),
            line: err.line(),
        },
    }
}

/// 1-based character column of byte `offset` in `source`.
fn column_of(source: &str, offset: usize) -> Option<usize> {
    let before = source.get(..offset)?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Some(before.get(line_start..)?.chars().count() + 1)
}

/// transformers registers a `{% generation %}...{% endgeneration %}` block (it marks assistant
/// text for training masks and otherwise renders its body). MiniJinja has no custom tags, so the
/// pair is rewritten to `{% if true %}...{% endif %}`, keeping the whitespace-control markers, which
/// renders identically.
fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len() + 16);
    let mut rest = source;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i..];
        match generation_tag(tag) {
            Some((len, replacement)) => {
                out.push_str(&replacement);
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// If `tag` starts with `{% generation %}` or `{% endgeneration %}` (with optional `-`/`+` markers),
/// its length and the `if` / `endif` tag replacing it.
fn generation_tag(tag: &str) -> Option<(usize, String)> {
    let rest = tag.strip_prefix("{%")?;
    let (open, rest) = split_marker(rest);
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r']);
    let word_len = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let word = &rest[..word_len];
    let replacement = match word {
        "generation" => "if true",
        "endgeneration" => "endif",
        _ => return None,
    };
    let rest = rest[word_len..].trim_start_matches([' ', '\t', '\n', '\r']);
    let (close, rest) = match rest.as_bytes().first() {
        Some(b'-' | b'+') => (&rest[..1], &rest[1..]),
        _ => ("", rest),
    };
    let after = rest.strip_prefix("%}")?;
    let len = tag.len() - after.len();
    Some((len, format!("{{%{open} {replacement} {close}%}}")))
}

fn split_marker(s: &str) -> (&str, &str) {
    match s.as_bytes().first() {
        Some(b'-' | b'+') => (&s[..1], &s[1..]),
        _ => ("", s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_if_blocks() {
        assert_eq!(
            rewrite_generation_tags(
                "a{%- generation -%}b{% endgeneration %}c{% if x %}{% endif %}"
            ),
            "a{%- if true -%}b{% endif %}c{% if x %}{% endif %}"
        );
        assert_eq!(
            rewrite_generation_tags("{% generations %}"),
            "{% generations %}"
        );
    }

    #[test]
    fn columns_count_characters() {
        assert_eq!(column_of("ab\ncdé{{", 7), Some(4));
        assert_eq!(column_of("x", 5), None);
    }
}
