//! Streaming separation of model output into answer text, reasoning and tool calls.
//!
//! Qwen3-family models write their chain of thought between `<think>` and `</think>` and call tools
//! either as `<tool_call>{"name": .., "arguments": {..}}</tool_call>` (Qwen3) or as
//! `<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>` (Qwen3-Coder).
//! Tokens arrive one piece of text at a time and a tag may be cut anywhere, so [`StreamParser`]
//! releases plain text at once and holds back only what could still be the start of a tag (or
//! whitespace that is stripped when a tag follows), until the next piece decides it.
//!
//! [`parse_all`] is the non-streaming form: it runs the same state machine over the whole text, so a
//! reply is identical streamed or not, for every cut of the text into pieces.
//!
//! Behaviour, following llama-server where it is defined (`common_chat_parse_hermes_2_pro`,
//! `try_parse_reasoning`) and Qwen's own `qwen3coder_tool_parser.py` for the XML form:
//! - Reasoning is recognised only as a `<think>` block opening the output (after optional
//!   whitespace), or from the first byte when [`ParserConfig::starts_in_reasoning`] says the prompt
//!   already opened it. Its text is trimmed at both ends and the whitespace after `</think>` is
//!   skipped, as llama-server returns `reasoning_content`. A `<think>` later in the answer, or a
//!   `</think>` with no opened block, is answer text: the streamed text before it has already been
//!   released as content and cannot be recalled. A server whose rendered prompt ends inside an
//!   opened `<think>` (see [`prompt_opens_reasoning`]) sets `starts_in_reasoning`, which is the
//!   case llama.cpp's "text before `</think>` is reasoning" rule exists for.
//! - An unterminated `<think>` at the end of generation: everything after it is reasoning. When the
//!   prompt opened the block and the model writes `<think>` again first, the repeat is dropped.
//! - Tool calls are recognised in the answer, never inside reasoning. Whitespace right before a
//!   `<tool_call>`, between calls and after the last call at the end of the output is dropped, so
//!   the answer text does not end in the blank lines that separate the blocks. Text before a
//!   `<tool_call>` is answer text, released as it comes.
//! - Both syntaxes are read whatever the template teaches (a `<tool_call>` followed by `{` is
//!   JSON, by `<function=` XML), since models tuned on one sometimes write the other; the template
//!   decides only what a block that is neither is taken as (see below).
//! - Tool calls never break a client. A call is emitted only once it is complete, whole (start,
//!   arguments, end at once), and what is not a complete call of an offered tool is answer text,
//!   as written, with a logged warning. Never an error, never a panic:
//!   - A call cut off by the end of the output comes back as text, not lost and not run half
//!     written (a truncated `rm -rf /tmp/x` is another command). Complete means, for JSON, a
//!     block whose text parses (a cut inside the closing `</tool_call>` is fine); for XML, a
//!     function closed by `</function>` (or its block's `</tool_call>`). This replaces the
//!     reference parsers' "close an unterminated call with what was read": the agents issue asks
//!     for the text, and streaming a call's arguments before it is complete cannot be undone.
//!   - A call naming a tool the request did not offer is text (the names are the keys of
//!     [`ParserConfig::tool_schemas`]; an empty map offers every name).
//!   - A block that is not a call (invalid JSON, no name, arguments not an object, an empty
//!     function name) is text, tags included.
//! - Arguments follow the tool's JSON schema: Qwen3-Coder XML values are typed by it (integer,
//!   number, boolean, object / array parsed from JSON text; strings verbatim), and Qwen3 JSON
//!   values the model wrote as strings where the schema declares another type are converted the
//!   same way. Values that do not convert stay as written.
//! - Qwen3 JSON: a block is collected until its `</tool_call>`. A block that does not parse as
//!   `{"name": string, "arguments": object}` is released as answer text, tags included, unless it
//!   holds a later `<tool_call>` whose text does parse (the model restarted the call). In the Qwen3
//!   template's mode any `<tool_call>` opens a candidate block; in the Qwen3-Coder mode a
//!   `<tool_call>` followed by neither `{` nor `<function=` is text at once.
//! - Qwen3-Coder XML (see `qwen3_coder_xml`): values are verbatim, multi-line, and may contain `<`
//!   and tag lookalikes: `</parameter>` ends a value only before the next tag or the end of the
//!   output, and an open value ends at another tag only at the start of a line. A bare
//!   `<function=` without `<tool_call>` is not recognised.
//! - Arguments are compact JSON (`{"city":"Paris"}`), keys in the order written.
//!
//! The parser never panics and does work linear in the length of the output.

mod qwen3_coder_xml;
mod qwen3_json;
mod scan;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use serde_json::{Map, Value};

use qwen3_coder_xml::{Context, XmlCall};
use scan::{is_ws, BlockOpen, TagMatch};

/// Which tool-call syntax the model writes, decided from its chat template. Either syntax is
/// parsed under both `Qwen3Json` and `Qwen3CoderXml` (see the module docs); the variant decides
/// what a `<tool_call>` followed by neither is taken as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// No tool calls are parsed: `<tool_call>` is ordinary text.
    None,
    /// Qwen3 / Hermes: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`.
    Qwen3Json,
    /// Qwen3-Coder: `<tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>\n</function>\n</tool_call>`.
    Qwen3CoderXml,
}

impl ToolFormat {
    /// Picks the format a chat template teaches the model.
    ///
    /// Qwen3-Coder's template writes `<function=` / `<parameter=` into its tool instructions and
    /// into past assistant turns; Qwen3's writes `<tool_call>\n{"name": ..`. The XML markers are
    /// checked first because the Coder template also contains `<tool_call>`.
    pub fn detect(template_source: &str) -> ToolFormat {
        if template_source.contains("<function=") || template_source.contains("<parameter=") {
            ToolFormat::Qwen3CoderXml
        } else if template_source.contains("<tool_call>") {
            ToolFormat::Qwen3Json
        } else {
            ToolFormat::None
        }
    }
}

/// What to separate out of one reply.
#[derive(Debug, Clone)]
pub struct ParserConfig {
    /// Tool-call syntax to recognise in the answer text.
    pub tools: ToolFormat,
    /// Separate `<think>` blocks into reasoning; when false, think tags are answer text.
    pub reasoning: bool,
    /// The rendered prompt already opened `<think>`, so the output starts inside the block.
    /// Ignored when `reasoning` is false.
    pub starts_in_reasoning: bool,
    /// JSON schema of each tool's parameters (`{"type": "object", "properties": {..}}`), by tool
    /// name, used to type argument values; its keys are the tools the request offered, and a call
    /// to another name is answer text. Empty: any name is a call and every XML value a string.
    /// Build it from a request with [`tool_schemas_from_request`].
    pub tool_schemas: HashMap<String, Value>,
    /// Seed of the tool-call ids, so a reply's ids are reproducible (and identical streamed and not).
    pub id_seed: u64,
}

impl ParserConfig {
    /// A configuration that passes all text through as content.
    pub fn plain() -> ParserConfig {
        ParserConfig {
            tools: ToolFormat::None,
            reasoning: false,
            starts_in_reasoning: false,
            tool_schemas: HashMap::new(),
            id_seed: 0,
        }
    }
}

/// Collects the parameter schemas of the tools in a request, by tool name.
///
/// Accepts the OpenAI shape (`[{"type": "function", "function": {"name", "parameters"}}]`), the
/// Anthropic shape (`[{"name", "input_schema"}]`) and the bare `[{"name", "parameters"}]` shape
/// (also the Responses API's); entries that match none are skipped, and so is a Responses
/// `namespace` entry (Codex sends one), whose name is not a function the model can call.
pub fn tool_schemas_from_request(tools: &Value) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    let Some(list) = tools.as_array() else {
        return out;
    };
    for tool in list {
        if tool.get("type").and_then(Value::as_str) == Some("namespace") {
            continue;
        }
        let f = tool.get("function").unwrap_or(tool);
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            continue;
        };
        let schema = f
            .get("parameters")
            .or_else(|| f.get("input_schema"))
            .cloned()
            .unwrap_or(Value::Null);
        out.insert(name.to_string(), schema);
    }
    out
}

/// True when a rendered prompt ends inside an opened `<think>` block (Qwen3 templates that write
/// `<think>\n` after `<|im_start|>assistant\n`), so the reply starts in reasoning. A prompt ending
/// in `<think>\n\n</think>\n\n` (Qwen3 with `enable_thinking=false`) does not.
pub fn prompt_opens_reasoning(prompt: &str) -> bool {
    prompt.trim_end().ends_with("<think>")
}

/// One piece of a parsed reply, in output order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Answer text.
    Content(String),
    /// Reasoning text (inside `<think>`).
    Reasoning(String),
    /// A tool call begins; its name is known.
    ToolCallStart {
        /// Position of the call in the reply, from 0.
        index: usize,
        /// `call_` and 24 alphanumerics, deterministic per parser.
        id: String,
        /// Function name.
        name: String,
    },
    /// A piece of the call's arguments: concatenated, they form one JSON object's text.
    ToolCallArgs {
        /// Call position, as in `ToolCallStart`.
        index: usize,
        /// The next piece of the arguments JSON text.
        fragment: String,
    },
    /// The call's arguments are complete.
    ToolCallEnd {
        /// Call position, as in `ToolCallStart`.
        index: usize,
    },
}

/// A whole reply, split.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// Answer text.
    pub content: String,
    /// Reasoning text, `None` when there was none.
    pub reasoning: Option<String>,
    /// Tool calls in order.
    pub tool_calls: Vec<ParsedToolCall>,
}

/// One complete tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    /// `call_` and 24 alphanumerics.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as JSON object text.
    pub arguments: String,
}

impl Parsed {
    /// Folds a delta sequence into a reply; the inverse of streaming, used by [`parse_all`].
    pub fn from_deltas<I: IntoIterator<Item = Delta>>(deltas: I) -> Parsed {
        let mut p = Parsed::default();
        let mut reasoning = String::new();
        for d in deltas {
            match d {
                Delta::Content(s) => p.content.push_str(&s),
                Delta::Reasoning(s) => reasoning.push_str(&s),
                Delta::ToolCallStart { id, name, .. } => p.tool_calls.push(ParsedToolCall {
                    id,
                    name,
                    arguments: String::new(),
                }),
                Delta::ToolCallArgs { fragment, .. } => {
                    if let Some(c) = p.tool_calls.last_mut() {
                        c.arguments.push_str(&fragment);
                    }
                }
                Delta::ToolCallEnd { .. } => {}
            }
        }
        if !reasoning.is_empty() {
            p.reasoning = Some(reasoning);
        }
        p
    }
}

/// Parses a complete output; equal to folding [`StreamParser`]'s deltas for any cut of `text`.
pub fn parse_all(cfg: ParserConfig, text: &str) -> Parsed {
    let mut p = StreamParser::new(cfg);
    let mut deltas = p.push(text);
    deltas.extend(p.finish());
    Parsed::from_deltas(deltas)
}

/// Where the parser is in the output.
#[derive(Debug)]
enum Mode {
    /// Nothing but whitespace seen yet; a `<think>` here opens reasoning.
    Start,
    /// Inside `<think>`; `seen_text` once non-whitespace reasoning was released.
    Reasoning { seen_text: bool },
    /// After `</think>`: whitespace is skipped.
    AfterThink,
    /// Answer text, where tool calls may begin.
    Content,
    /// Inside a Qwen3 JSON `<tool_call>`.
    JsonCall(JsonBody),
    /// Inside a Qwen3-Coder XML `<tool_call>`, after `<function=NAME>`.
    XmlCall(Box<XmlCall>),
    /// `finish` was called.
    Done,
}

/// Text of a JSON tool-call block collected until its closing tag.
#[derive(Debug, Default)]
struct JsonBody {
    /// Text after `<tool_call>`.
    body: String,
    /// Bytes of `body` already searched for `</tool_call>`.
    scanned: usize,
    /// Whitespace dropped before `<tool_call>`, given back if the block turns out to be text.
    lead_ws: String,
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";

/// Incremental parser of one reply. Feed pieces with [`push`](Self::push), then call
/// [`finish`](Self::finish) once.
#[derive(Debug)]
pub struct StreamParser {
    cfg: ParserConfig,
    mode: Mode,
    /// Unprocessed input. Between calls it holds at most a partial tag (bounded, see
    /// `scan::match_xml_open`); the tool-call modes move their text into their own buffers.
    buf: String,
    /// Whitespace held back in the text modes: stripped if a tag follows, released otherwise.
    pending_ws: String,
    /// The last thing in the answer was a tool call, so trailing whitespace at the end is dropped.
    after_tool_call: bool,
    /// Index of the next tool call.
    next_index: usize,
    /// Deltas produced by the current call, merged where adjacent.
    out: Vec<Delta>,
    /// Text a closed tool-call block handed back, to be read as answer text before the rest.
    giveback: String,
}

impl StreamParser {
    /// A parser at the start of a reply.
    pub fn new(cfg: ParserConfig) -> Self {
        let mode = if !cfg.reasoning {
            Mode::Content
        } else if cfg.starts_in_reasoning {
            Mode::Reasoning { seen_text: false }
        } else {
            Mode::Start
        };
        StreamParser {
            cfg,
            mode,
            buf: String::new(),
            pending_ws: String::new(),
            after_tool_call: false,
            next_index: 0,
            out: Vec::new(),
            giveback: String::new(),
        }
    }

    /// Feeds the next piece of output; returns what it decided.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        if matches!(self.mode, Mode::Done) {
            // Text after finish is a caller bug; keep it rather than lose it.
            self.emit_content(text);
            return std::mem::take(&mut self.out);
        }
        self.buf.push_str(text);
        loop {
            let buf = std::mem::take(&mut self.buf);
            let mut pos = 0;
            self.run(&buf, &mut pos);
            // What is left is short (a partial tag), so this copy keeps the work linear.
            let rest = buf.get(pos..).unwrap_or("");
            if self.giveback.is_empty() {
                self.buf = rest.to_string();
                break;
            }
            // A block ended and gave text back (it was not a call after all): read it first. Each
            // give-back starts after a `<tool_call>` already consumed, so this ends.
            let mut again = std::mem::take(&mut self.giveback);
            again.push_str(rest);
            self.buf = again;
        }
        std::mem::take(&mut self.out)
    }

    /// Ends the reply: releases held text and closes an open block (see the module docs).
    pub fn finish(&mut self) -> Vec<Delta> {
        if matches!(self.mode, Mode::Done) {
            return std::mem::take(&mut self.out);
        }
        let mode = std::mem::replace(&mut self.mode, Mode::Done);
        let rest = std::mem::take(&mut self.buf);
        match mode {
            Mode::Start | Mode::Content => {
                // A held partial tag is text after all.
                if !rest.is_empty() || !self.after_tool_call {
                    self.flush_ws_as_content();
                }
                self.emit_content(&rest);
            }
            Mode::Reasoning { seen_text } => {
                // Unterminated think: all of it is reasoning, trimmed at the end.
                let rest = rest.trim_end();
                if !rest.is_empty() {
                    if seen_text {
                        self.flush_ws_as_reasoning();
                    }
                    self.emit_reasoning(rest.trim_start());
                }
            }
            Mode::AfterThink | Mode::Done => {}
            Mode::JsonCall(mut j) => {
                j.body.push_str(&rest);
                // Generation may stop inside the closing tag: that partial tag is not JSON.
                let block = match j.body.rfind('<') {
                    Some(lt) if TOOL_CLOSE.as_bytes().starts_with(&j.body.as_bytes()[lt..]) => {
                        &j.body[..lt]
                    }
                    _ => &j.body[..],
                };
                let block = block.to_string();
                self.resolve_json_block(&j.lead_ws, &block, false);
            }
            Mode::XmlCall(mut x) => {
                // The call modes take all their input, so `rest` is empty; pushed for safety.
                let cx = Context {
                    schemas: &self.cfg.tool_schemas,
                    seed: self.cfg.id_seed,
                };
                let text = match x.push(&rest, &mut self.out, &cx) {
                    qwen3_coder_xml::Outcome::More => x.finish(),
                    qwen3_coder_xml::Outcome::Closed { rest } => rest,
                };
                self.next_index = x.next_index();
                self.emit_content(&text);
            }
        }
        self.pending_ws.clear();
        std::mem::take(&mut self.out)
    }

    /// Processes `buf[pos..]` until it is used up or only a partial tag remains.
    fn run(&mut self, buf: &str, pos: &mut usize) {
        // Each step consumes input or changes mode towards consuming it, so this ends.
        loop {
            let progressed = match self.mode {
                Mode::Start => self.step_start(buf, pos),
                Mode::Reasoning { .. } => self.step_reasoning(buf, pos),
                Mode::AfterThink => self.step_after_think(buf, pos),
                Mode::Content => self.step_content(buf, pos),
                Mode::JsonCall(_) => self.step_json(buf, pos),
                Mode::XmlCall(_) => self.step_xml(buf, pos),
                Mode::Done => false,
            };
            if !progressed || *pos >= buf.len() {
                break;
            }
        }
    }

    /// Leading whitespace is held; `<think>` opens reasoning, anything else is the answer.
    fn step_start(&mut self, buf: &str, pos: &mut usize) -> bool {
        let bytes = buf.as_bytes();
        let n = bytes[*pos..].iter().take_while(|b| is_ws(**b)).count();
        self.pending_ws.push_str(&buf[*pos..*pos + n]);
        *pos += n;
        if *pos >= bytes.len() {
            return false;
        }
        match scan::match_tag(&bytes[*pos..], THINK_OPEN) {
            TagMatch::Full => {
                *pos += THINK_OPEN.len();
                self.pending_ws.clear();
                self.mode = Mode::Reasoning { seen_text: false };
                true
            }
            TagMatch::Partial => false,
            TagMatch::No => {
                self.mode = Mode::Content;
                true
            }
        }
    }

    /// Reasoning text up to `</think>`: leading whitespace dropped, trailing whitespace held.
    fn step_reasoning(&mut self, buf: &str, pos: &mut usize) -> bool {
        let Mode::Reasoning { mut seen_text } = self.mode else {
            return false;
        };
        let bytes = buf.as_bytes();
        let mut i = *pos;
        let mut text_start = i;
        let mut closed = false;
        while i < bytes.len() {
            let b = bytes[i];
            if is_ws(b) {
                if text_start < i {
                    self.flush_ws_as_reasoning();
                    self.emit_reasoning(&buf[text_start..i]);
                    seen_text = true;
                }
                if seen_text {
                    self.pending_ws.push(b as char);
                }
                i += 1;
                text_start = i;
            } else if b == b'<' {
                // Before any reasoning text, a repeated `<think>` (the prompt opened the block
                // and the model wrote it again) is dropped.
                let at_start = !seen_text && text_start == i;
                let tags: &[&'static str] = if at_start {
                    &[THINK_CLOSE, THINK_OPEN]
                } else {
                    &[THINK_CLOSE]
                };
                match scan::match_any(&bytes[i..], tags) {
                    (TagMatch::Full, THINK_OPEN) => {
                        i += THINK_OPEN.len();
                        text_start = i;
                    }
                    (TagMatch::Full, _) => {
                        closed = true;
                        break;
                    }
                    (TagMatch::Partial, _) => break,
                    (TagMatch::No, _) => i += 1,
                }
            } else {
                i += 1;
            }
        }
        if text_start < i {
            self.flush_ws_as_reasoning();
            self.emit_reasoning(&buf[text_start..i]);
            seen_text = true;
        }
        if closed {
            self.pending_ws.clear();
            *pos = i + THINK_CLOSE.len();
            self.mode = Mode::AfterThink;
            true
        } else {
            *pos = i;
            self.mode = Mode::Reasoning { seen_text };
            false
        }
    }

    fn step_after_think(&mut self, buf: &str, pos: &mut usize) -> bool {
        let bytes = buf.as_bytes();
        *pos += bytes[*pos..].iter().take_while(|b| is_ws(**b)).count();
        if *pos >= bytes.len() {
            return false;
        }
        self.mode = Mode::Content;
        true
    }

    /// Answer text: released at once, except whitespace (when tools are on, it is dropped
    /// before a tool call) and a partial `<tool_call>` opening.
    fn step_content(&mut self, buf: &str, pos: &mut usize) -> bool {
        let bytes = buf.as_bytes();
        if self.cfg.tools == ToolFormat::None {
            self.flush_ws_as_content();
            self.emit_content(&buf[*pos..]);
            *pos = bytes.len();
            return false;
        }
        let mut i = *pos;
        let mut text_start = i;
        // (start of `<tool_call>`, bytes of the whole opening, function name for XML)
        let mut opened: Option<(usize, usize, Option<String>)> = None;
        let json_mode = self.cfg.tools == ToolFormat::Qwen3Json;
        while i < bytes.len() {
            let b = bytes[i];
            if is_ws(b) {
                if text_start < i {
                    self.flush_ws_as_content();
                    self.emit_content(&buf[text_start..i]);
                    self.after_tool_call = false;
                }
                self.pending_ws.push(b as char);
                i += 1;
                text_start = i;
            } else if b == b'<' {
                match scan::match_tag(&bytes[i..], TOOL_OPEN) {
                    TagMatch::Full => {
                        let after = i + TOOL_OPEN.len();
                        match scan::match_block_open(&bytes[after..]) {
                            BlockOpen::Xml { len, name } if self.offered(&name) => {
                                opened = Some((i, TOOL_OPEN.len() + len, Some(name)));
                                break;
                            }
                            BlockOpen::Xml { name, .. } => {
                                tracing::warn!(
                                    function = %name,
                                    "the model called a function the request did not offer; returned as text"
                                );
                                i = after;
                            }
                            BlockOpen::Json => {
                                opened = Some((i, TOOL_OPEN.len(), None));
                                break;
                            }
                            BlockOpen::Partial => break,
                            // Qwen3's parser takes any block as a candidate and decides at its end.
                            BlockOpen::Other if json_mode => {
                                opened = Some((i, TOOL_OPEN.len(), None));
                                break;
                            }
                            // `<tool_call>` not followed by a call: plain text.
                            BlockOpen::Other => i = after,
                        }
                    }
                    TagMatch::Partial => break,
                    TagMatch::No => i += 1,
                }
            } else {
                i += 1;
            }
        }
        if text_start < i {
            self.flush_ws_as_content();
            self.emit_content(&buf[text_start..i]);
            self.after_tool_call = false;
        }
        let Some((at, len, name)) = opened else {
            *pos = i;
            return false;
        };
        *pos = at + len;
        let lead_ws = std::mem::take(&mut self.pending_ws);
        match name {
            Some(name) => {
                let opening = buf.get(at..at + len).unwrap_or("");
                let x = XmlCall::open(opening, lead_ws, name, self.next_index);
                self.mode = Mode::XmlCall(Box::new(x));
            }
            None => {
                self.mode = Mode::JsonCall(JsonBody {
                    lead_ws,
                    ..JsonBody::default()
                });
            }
        }
        true
    }

    fn step_json(&mut self, buf: &str, pos: &mut usize) -> bool {
        let Mode::JsonCall(j) = &mut self.mode else {
            return false;
        };
        let piece = &buf[*pos..];
        j.body.push_str(piece);
        // A close tag may straddle the previous end, so back up by its length less one.
        let from = floor_char(&j.body, j.scanned.saturating_sub(TOOL_CLOSE.len() - 1));
        let found = j.body[from..].find(TOOL_CLOSE).map(|r| from + r);
        j.scanned = j.body.len();
        let Some(at) = found else {
            *pos = buf.len();
            return false;
        };
        // The tag was not complete before this piece, so what follows it lies in the piece.
        let rest_len = (j.body.len() - at - TOOL_CLOSE.len()).min(piece.len());
        *pos = buf.len() - rest_len;
        let Mode::JsonCall(mut j) = std::mem::replace(&mut self.mode, Mode::Content) else {
            return false;
        };
        j.body.truncate(at);
        self.resolve_json_block(&j.lead_ws, &j.body, true);
        true
    }

    /// Emits a JSON block as a call, or as answer text when it is not one. A block that is not
    /// a call but holds another `<tool_call>` (the model restarted) yields the call after the
    /// last one, the text before it being answer text.
    fn resolve_json_block(&mut self, lead_ws: &str, block: &str, closed: bool) {
        let call = qwen3_json::parse_call(block);
        if let Some((name, args)) = call.clone().filter(|(n, _)| self.offered(n)) {
            self.emit_json_call(name, args);
            return;
        }
        if let Some(k) = block.rfind(TOOL_OPEN) {
            let inner = qwen3_json::parse_call(&block[k + TOOL_OPEN.len()..]);
            if let Some((name, args)) = inner.filter(|(n, _)| self.offered(n)) {
                self.emit_content(lead_ws);
                self.emit_content(TOOL_OPEN);
                self.emit_content(block[..k].trim_end_matches(|c: char| is_ws_char(c)));
                self.emit_json_call(name, args);
                return;
            }
        }
        match (&call, closed) {
            (Some((name, _)), _) => tracing::warn!(
                function = %name,
                "the model called a function the request did not offer; returned as text"
            ),
            (None, true) => {
                tracing::warn!("a tool-call block is not a valid call; returned as text")
            }
            (None, false) => {
                tracing::warn!("a tool call was cut off by the end of the reply; returned as text")
            }
        }
        // Not a call after all: the whole block is answer text, tags included.
        self.emit_content(lead_ws);
        self.emit_content(TOOL_OPEN);
        self.emit_content(block);
        if closed {
            self.emit_content(TOOL_CLOSE);
        }
        self.after_tool_call = false;
    }

    /// Inside a Qwen3-Coder block: all of the input goes to it; when it ends, what follows it is
    /// handed back to be read as answer text.
    fn step_xml(&mut self, buf: &str, pos: &mut usize) -> bool {
        let Mode::XmlCall(x) = &mut self.mode else {
            return false;
        };
        let piece = &buf[*pos..];
        *pos = buf.len();
        let cx = Context {
            schemas: &self.cfg.tool_schemas,
            seed: self.cfg.id_seed,
        };
        match x.push(piece, &mut self.out, &cx) {
            qwen3_coder_xml::Outcome::More => false,
            qwen3_coder_xml::Outcome::Closed { rest } => {
                self.next_index = x.next_index();
                if x.emitted() {
                    self.after_tool_call = true;
                }
                self.mode = Mode::Content;
                self.giveback = rest;
                false
            }
        }
    }

    /// Whether the request offered a tool of this name; any name when it listed none.
    fn offered(&self, name: &str) -> bool {
        self.cfg.tool_schemas.is_empty() || self.cfg.tool_schemas.contains_key(name)
    }

    /// Emits a Qwen3 JSON call. Argument values the model wrote as strings where the tool's
    /// schema declares another type are converted as Qwen3-Coder's are (`"3"` → `3` for an
    /// integer, JSON text for an object or array); values that do not convert stay as written.
    fn emit_json_call(&mut self, name: String, mut args: Map<String, Value>) {
        let schema = self.cfg.tool_schemas.get(&name);
        for (k, v) in args.iter_mut() {
            if let Value::String(s) = v {
                if qwen3_coder_xml::declares_non_string(k, schema) {
                    *v = qwen3_coder_xml::convert_value(s, k, schema);
                }
            }
        }
        let index = self.next_index;
        let id = call_id(self.cfg.id_seed, index);
        self.out.push(Delta::ToolCallStart { index, id, name });
        self.out.push(Delta::ToolCallArgs {
            index,
            fragment: Value::Object(args).to_string(),
        });
        self.out.push(Delta::ToolCallEnd { index });
        self.next_index = index.saturating_add(1);
        self.after_tool_call = true;
    }

    fn flush_ws_as_content(&mut self) {
        let ws = std::mem::take(&mut self.pending_ws);
        self.emit_content(&ws);
    }

    fn flush_ws_as_reasoning(&mut self) {
        let ws = std::mem::take(&mut self.pending_ws);
        self.emit_reasoning(&ws);
    }

    fn emit_content(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        if let Some(Delta::Content(last)) = self.out.last_mut() {
            last.push_str(s);
        } else {
            self.out.push(Delta::Content(s.to_string()));
        }
    }

    fn emit_reasoning(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        if let Some(Delta::Reasoning(last)) = self.out.last_mut() {
            last.push_str(s);
        } else {
            self.out.push(Delta::Reasoning(s.to_string()));
        }
    }
}

fn is_ws_char(c: char) -> bool {
    c.is_ascii() && is_ws(c as u8)
}

/// The largest char boundary of `s` at or below `i`.
fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `call_` and 24 alphanumerics from a splitmix64 stream keyed by the seed and the call index:
/// unique-looking like OpenAI's ids, but reproducible so streamed and whole replies agree.
pub fn call_id(seed: u64, index: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut state = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    for _ in 0..24 {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // ALPHABET has 62 entries; the index is < 62 so `get` always succeeds.
        let c = ALPHABET.get((z % 62) as usize).copied().unwrap_or(b'a');
        id.push(c as char);
    }
    id
}
