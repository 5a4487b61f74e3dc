//! The one server pipeline: a wire API's request becomes a [`GenRequest`] (no API's shape),
//! [`prepare`] turns that into engine requests, and each submitted choice comes back as a
//! [`Reply`]: a neutral stream of [`Piece`]s (text, reasoning and tool-call deltas, log-probabilities,
//! the finish). Each API is then a thin renderer of that stream, streamed
//! ([`crate::stream`]) or whole ([`Reply::fold`], the same stream folded, so a reply is the same
//! either way).
//!
//! [`prepare`] is the one place that validates the generation fields, compiles a constraint,
//! applies the thinking switch ("a constrained reply has no reasoning"), renders the template and
//! tokenizes; [`start`] runs it on tokio's blocking pool, never on the async workers.

use std::sync::Arc;

use hearth_constrain::Spec;
use hearth_engine::{Event, FinishReason, Request, TokenLogprob, Usage};
use hearth_tokenizer::template::ChatInput;
use serde_json::{Map, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::error::ApiError;
use crate::fields::Sampling;
use crate::parse::{
    prompt_opens_reasoning, tool_schemas_from_request, Delta, ParsedToolCall, ParserConfig,
    StreamParser, ToolFormat,
};
use crate::state::Loaded;
use crate::structured::{self, ToolForce};

/// What the prompt is made from.
#[derive(Debug, Clone)]
pub enum PromptInput {
    /// A conversation through the chat template: OpenAI-style messages (`role`, `content` as text,
    /// `tool_calls`, `reasoning_content`, ...), function tools as the template sees them (`None`:
    /// no tools), and extra template variables.
    Chat {
        /// The conversation.
        messages: Vec<Value>,
        /// Function tools (`{"type": "function", "function": {..}}`).
        tools: Option<Vec<Value>>,
        /// Extra template variables (`chat_template_kwargs`).
        kwargs: Map<String, Value>,
    },
    /// Raw text: special tokens written in it are parsed, BOS is added as the model asks (as
    /// llama-server does for completions).
    Text(String),
    /// Token ids, checked against the vocabulary.
    Ids(Vec<u64>),
}

/// A generation request in no API's shape.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// The prompt.
    pub prompt: PromptInput,
    /// The API's thinking switch (`None`: the template's default). Given as `enable_thinking`
    /// unless the request's own template variables set it.
    pub thinking: Option<bool>,
    /// Sampling settings, validated by [`prepare`].
    pub sampling: Sampling,
    /// Choices, each its own sequence (seed + i).
    pub n: usize,
    /// Token budget (`None`: until the end of generation or the context).
    pub max_tokens: Option<usize>,
    /// A smaller context for this request than the server's (Ollama's `num_ctx`).
    pub n_ctx: Option<usize>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Alternatives per token to report with log-probabilities (`None`: none).
    pub logprobs: Option<usize>,
    /// A response format the reply must follow, and the request field it came from.
    pub format: Option<(Spec, &'static str)>,
    /// Tool calls the reply must (or may) make.
    pub tool_force: ToolForce,
    /// Separate reasoning and tool calls out of the reply text (chat); off for raw completions.
    pub parse: bool,
}

impl GenRequest {
    /// A request for `prompt` with every other field at its default.
    pub fn new(prompt: PromptInput) -> GenRequest {
        GenRequest {
            prompt,
            thinking: None,
            sampling: Sampling::default(),
            n: 1,
            max_tokens: None,
            n_ctx: None,
            stop: Vec::new(),
            logprobs: None,
            format: None,
            tool_force: ToolForce::None,
            parse: true,
        }
    }
}

/// Engine requests ready to submit, one per choice, with how to read each reply.
pub struct Prepared {
    /// Per choice: the engine request and its parser configuration.
    pub choices: Vec<(Request, ParserConfig)>,
    /// Prompt tokens.
    pub n_prompt: usize,
}

/// Validates `req`, compiles its constraint, renders and tokenizes its prompt. Blocking work: run
/// it through [`start`].
pub fn prepare(l: &Loaded, req: GenRequest) -> Result<Prepared, ApiError> {
    let sampling = req.sampling;
    sampling.config(0)?;
    let tools = match &req.prompt {
        PromptInput::Chat { tools, .. } => tools.clone().filter(|t| !t.is_empty()),
        _ => None,
    };
    let tool_spec = match req.tool_force {
        ToolForce::None => None,
        ref force => structured::tool_spec(l, tools.as_deref().unwrap_or(&[]), force)?,
    };
    let format = req.format.clone();
    let spec = structured::one_of(format.as_ref().map(|f| f.0.clone()), tool_spec)?;
    let constraint = spec
        .as_ref()
        .map(|s| {
            let param = match s {
                Spec::ToolCall { .. } => "tools",
                _ => format.as_ref().map_or("response_format", |f| f.1),
            };
            structured::compile(l, param, s)
        })
        .transpose()?;
    let constrained = constraint.is_some();
    let (ids, in_think) = match req.prompt {
        PromptInput::Chat {
            messages,
            tools,
            mut kwargs,
        } => {
            if let Some(on) = req.thinking {
                kwargs
                    .entry("enable_thinking")
                    .or_insert(Value::Bool(on && !constrained));
            }
            if constrained {
                kwargs = structured::no_thinking(kwargs);
            }
            let tools = tools.filter(|t| !t.is_empty());
            chat_prompt(l, messages, tools, kwargs)?
        }
        PromptInput::Text(text) => {
            let tok = l.tok();
            (tok.encode_with_specials(&text, tok.add_bos(), true), false)
        }
        PromptInput::Ids(raw) => {
            let ids = crate::fields::token_ids("prompt", &raw, l.info().n_vocab)?;
            (ids, false)
        }
    };
    let n_ctx = req.n_ctx.map_or(l.info().n_ctx, |c| c.min(l.info().n_ctx));
    check_prompt(&ids, n_ctx)?;
    let max_tokens = match (req.max_tokens, l.max_tokens) {
        (Some(n), Some(cap)) => Some(n.min(cap)),
        (n, cap) => n.or(cap),
    };
    let tools_v = tools.map(Value::Array);
    let choices = (0..req.n.max(1))
        .map(|i| {
            let sampler = sampling.config(i as u64)?;
            let parser = if req.parse {
                parser_config(l, tools_v.as_ref(), in_think, constrained, sampler.seed)
            } else {
                ParserConfig::plain()
            };
            let request = Request {
                prompt: ids.clone(),
                max_tokens,
                n_ctx: req.n_ctx,
                sampler,
                stop: req.stop.clone(),
                logprobs: req.logprobs,
                constraint: constraint.clone(),
            };
            Ok((request, parser))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Prepared {
        choices,
        n_prompt: ids.len(),
    })
}

/// Prepares `req` on the blocking pool and submits every choice.
pub async fn start(l: Arc<Loaded>, req: GenRequest) -> Result<(Vec<Reply>, usize), ApiError> {
    let l2 = l.clone();
    let prepared = tokio::task::spawn_blocking(move || prepare(&l2, req))
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))??;
    let n_prompt = prepared.n_prompt;
    Ok((submit(&l, prepared)?, n_prompt))
}

/// Submits every choice of a prepared request. When a [`Reply`] is dropped (the client went away)
/// the next event fails to send and the engine cancels that sequence.
pub fn submit(l: &Loaded, prepared: Prepared) -> Result<Vec<Reply>, ApiError> {
    prepared
        .choices
        .into_iter()
        .map(|(request, parser)| {
            let (tx, rx) = unbounded_channel();
            let sink: hearth_engine::Sink = Box::new(move |ev| tx.send(ev).is_ok());
            l.backend
                .submit(request, sink)
                .map_err(ApiError::from_submit)?;
            Ok(Reply {
                rx,
                parser: StreamParser::new(parser),
                tool_calls: false,
                over: false,
            })
        })
        .collect()
}

/// Renders the conversation through the chat template and tokenizes it; also says whether the
/// template opened `<think>` at the end (the reply then starts inside reasoning).
pub fn chat_prompt(
    l: &Loaded,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    kwargs: Map<String, Value>,
) -> Result<(Vec<u32>, bool), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let is_system = |m: &Value| m.get("role").and_then(Value::as_str) == Some("system");
    let late: Vec<String> = messages
        .iter()
        .skip(1)
        .filter(|m| is_system(m))
        .filter_map(|m| m.get("content").and_then(Value::as_str))
        .filter(|c| !c.is_empty())
        .map(|c| {
            // As the template sees it (control-token texts broken by the escape mark).
            let mut v = Value::String(c.to_string());
            l.encoder.escape(&mut v);
            v.as_str().unwrap_or_default().to_string()
        })
        .collect();
    let first = l.render_chat(&chat_input(
        l,
        messages.clone(),
        tools.clone(),
        kwargs.clone(),
    ));
    let rendered = match first {
        Ok(r) if late.iter().all(|c| r.contains(c.as_str())) => r,
        Err(e) if late.is_empty() => return Err(e),
        // System messages after the first one: rendered where they stand when the template
        // does, else (the template refused them or dropped their text) merged into one system
        // message at the start, in order.
        _ => l.render_chat(&chat_input(l, merge_system(messages), tools, kwargs))?,
    };
    Ok((
        l.encoder.encode(l.tok(), &rendered),
        prompt_opens_reasoning(&rendered),
    ))
}

/// The conversation with every system message's text joined (blank lines between) into one
/// system message at the start.
fn merge_system(messages: Vec<Value>) -> Vec<Value> {
    let (system, rest): (Vec<Value>, Vec<Value>) = messages
        .into_iter()
        .partition(|m| m.get("role").and_then(Value::as_str) == Some("system"));
    let text: Vec<&str> = system
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_str))
        .filter(|c| !c.is_empty())
        .collect();
    let mut out = Vec::with_capacity(rest.len() + 1);
    out.push(serde_json::json!({"role": "system", "content": text.join("\n\n")}));
    out.extend(rest);
    out
}

/// The template's input for a conversation, with the model's special tokens.
pub fn chat_input(
    l: &Loaded,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    kwargs: Map<String, Value>,
) -> ChatInput {
    let tok = l.tok();
    let text = |id: Option<u32>| {
        id.map(|i| tok.token_text(i).to_string())
            .unwrap_or_default()
    };
    ChatInput {
        messages,
        tools,
        add_generation_prompt: true,
        kwargs,
        bos_token: text(tok.bos_id()),
        eos_token: text(tok.eos_id()),
    }
}

/// Refuses an empty prompt or one that leaves no room to generate, naming both sizes.
fn check_prompt(ids: &[u32], n_ctx: usize) -> Result<(), ApiError> {
    if ids.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if ids.len() >= n_ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {} tokens but the context per sequence is {} tokens",
            ids.len(),
            n_ctx
        )));
    }
    Ok(())
}

/// The parser configuration for a reply. A constrained reply is read without reasoning: its
/// grammar applies from the first token, so all of it is the answer.
fn parser_config(
    l: &Loaded,
    tools: Option<&Value>,
    in_think: bool,
    constrained: bool,
    seed: u64,
) -> ParserConfig {
    let has_tools = tools.is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()));
    ParserConfig {
        tools: if has_tools {
            l.tool_format
        } else {
            ToolFormat::None
        },
        reasoning: !constrained,
        starts_in_reasoning: in_think && !constrained,
        tool_schemas: tools.map(tool_schemas_from_request).unwrap_or_default(),
        id_seed: seed,
    }
}

/// One piece of a reply, in order.
#[derive(Debug, Clone)]
pub enum Piece {
    /// One generated token: what it released, parsed.
    Token {
        /// Token id.
        id: u32,
        /// The text it released (before parsing; may be empty while held back).
        text: String,
        /// That text, separated into answer, reasoning and tool calls.
        deltas: Vec<Delta>,
        /// Its log-probabilities, when asked for.
        logprob: Option<TokenLogprob>,
    },
    /// The end.
    Done(End),
    /// The request failed after it started.
    Error(String),
}

/// How a reply ended.
#[derive(Debug, Clone)]
pub struct End {
    /// The last deltas (held-back text released, open blocks closed).
    pub deltas: Vec<Delta>,
    /// Text released at the end (before parsing).
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
    /// The stop string that ended it.
    pub stop: Option<String>,
    /// Token counts and timings.
    pub usage: Usage,
    /// The reply made at least one tool call.
    pub tool_calls: bool,
}

/// One choice's reply as it arrives.
pub struct Reply {
    rx: UnboundedReceiver<Event>,
    parser: StreamParser,
    tool_calls: bool,
    over: bool,
}

impl Reply {
    /// The next piece; `None` after the end.
    pub async fn next(&mut self) -> Option<Piece> {
        if self.over {
            return None;
        }
        let piece = match self.rx.recv().await {
            Some(Event::Token { id, text, logprob }) => {
                let deltas = self.parser.push(&text);
                self.note_calls(&deltas);
                Piece::Token {
                    id,
                    text,
                    deltas,
                    logprob,
                }
            }
            Some(Event::Done {
                finish,
                stop,
                text,
                usage,
            }) => {
                let mut deltas = self.parser.push(&text);
                deltas.extend(self.parser.finish());
                self.note_calls(&deltas);
                self.over = true;
                Piece::Done(End {
                    deltas,
                    text,
                    finish,
                    stop,
                    usage,
                    tool_calls: self.tool_calls,
                })
            }
            Some(Event::Error(e)) => {
                self.over = true;
                Piece::Error(e)
            }
            None => {
                self.over = true;
                Piece::Error("the backend dropped the request".into())
            }
        };
        Some(piece)
    }

    fn note_calls(&mut self, deltas: &[Delta]) {
        self.tool_calls |= deltas
            .iter()
            .any(|d| matches!(d, Delta::ToolCallStart { .. }));
    }

    /// The whole reply: the same pieces, folded.
    pub async fn fold(mut self) -> Result<Whole, ApiError> {
        let mut w = Whole::default();
        let mut reasoning = String::new();
        while let Some(piece) = self.next().await {
            match piece {
                Piece::Token {
                    id,
                    text,
                    deltas,
                    logprob,
                } => {
                    w.text.push_str(&text);
                    w.absorb(deltas, &mut reasoning);
                    w.tokens.push(TokenOut { id, text, logprob });
                }
                Piece::Done(end) => {
                    w.text.push_str(&end.text);
                    w.absorb(end.deltas, &mut reasoning);
                    w.reasoning = (!reasoning.is_empty()).then_some(reasoning);
                    w.finish = end.finish;
                    w.stop = end.stop;
                    w.usage = end.usage;
                    return Ok(w);
                }
                Piece::Error(e) => return Err(ApiError::internal(e)),
            }
        }
        Err(ApiError::internal("the backend dropped the request"))
    }
}

/// One generated token of a whole reply.
#[derive(Debug, Clone)]
pub struct TokenOut {
    /// Token id.
    pub id: u32,
    /// The text released with it.
    pub text: String,
    /// Its log-probabilities, when asked for.
    pub logprob: Option<TokenLogprob>,
}

/// A whole reply.
#[derive(Debug, Clone)]
pub struct Whole {
    /// Answer text.
    pub content: String,
    /// Reasoning text, when there was some.
    pub reasoning: Option<String>,
    /// Tool calls in order.
    pub tool_calls: Vec<ParsedToolCall>,
    /// The generated text before parsing (stop strings excluded).
    pub text: String,
    /// The tokens in order.
    pub tokens: Vec<TokenOut>,
    /// Why it ended.
    pub finish: FinishReason,
    /// The stop string that ended it.
    pub stop: Option<String>,
    /// Token counts and timings.
    pub usage: Usage,
}

impl Default for Whole {
    fn default() -> Whole {
        Whole {
            content: String::new(),
            reasoning: None,
            tool_calls: Vec::new(),
            text: String::new(),
            tokens: Vec::new(),
            finish: FinishReason::Stop,
            stop: None,
            usage: Usage::default(),
        }
    }
}

impl Whole {
    fn absorb(&mut self, deltas: Vec<Delta>, reasoning: &mut String) {
        for d in deltas {
            match d {
                Delta::Content(s) => self.content.push_str(&s),
                Delta::Reasoning(s) => reasoning.push_str(&s),
                Delta::ToolCallStart { id, name, .. } => self.tool_calls.push(ParsedToolCall {
                    id,
                    name,
                    arguments: String::new(),
                }),
                Delta::ToolCallArgs { fragment, .. } => {
                    if let Some(c) = self.tool_calls.last_mut() {
                        c.arguments.push_str(&fragment);
                    }
                }
                Delta::ToolCallEnd { .. } => {}
            }
        }
    }

    /// Folds every choice.
    pub async fn all(replies: Vec<Reply>) -> Result<Vec<Whole>, ApiError> {
        let mut out = Vec::with_capacity(replies.len());
        for r in replies {
            out.push(r.fold().await?);
        }
        Ok(out)
    }
}
