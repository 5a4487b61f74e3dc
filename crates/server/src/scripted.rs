//! A [`Backend`] that plays fixed text instead of running a model, so tests drive the reasoning and
//! tool-call paths (which random-weight models never take) through the real HTTP stack.
//!
//! The text is cut into pieces — at token boundaries of the real tokenizer, every `n` characters,
//! or at given byte offsets (so a test can try every cut position) — and each piece is one
//! [`Event::Token`], fed through the engine's own [`Sequence`] state machine: `max_tokens` and the
//! context cut the pieces (finish `Length`), stop strings cut the text (finish `Stop`), a sink
//! returning false stops the stream (the request is cancelled), and the prompt is checked as the
//! real scheduler checks it (empty, ids outside the vocabulary, longer than the context). A
//! request with a grammar gets the script only if the grammar accepts its text (else an [`Event::Error`] naming the token refused), so tests of structured output check
//! that the grammar the handler compiled admits the reply the parser expects.
//!
//! A backend can hold several replies, so an agent client sees a tool call on its first turn and
//! a final answer after the tool result: reply `k` answers a request whose prompt already holds
//! `k` assistant turns (the last reply repeats). Turns are counted in the prompt rather than
//! requests counted as they come because clients send side requests (titles, memory, retries)
//! concurrently with the conversation, which would shift a request counter; a retry of the same
//! turn gets the same reply. A turn is a ChatML `<|im_start|>assistant` (every Qwen template),
//! not counting the one the generation prompt opens; a tokenizer without `<|im_start|>` always
//! gets the first reply.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hearth_engine::scheduler::check_request;
use hearth_engine::{
    Backend, Event, FinishReason, ModelInfo, Request, Sequence, Sink, Stats, SubmitError, Ticket,
    TokenLogprob,
};
use hearth_tokenizer::Tokenizer;

/// Where the scripted text is cut into token events.
#[derive(Clone, Debug, PartialEq)]
pub enum Cuts {
    /// At the tokenizer's token boundaries.
    Tokens,
    /// Every `n` characters.
    Chars(usize),
    /// At these byte offsets (each must be a char boundary; others are skipped).
    At(Vec<usize>),
}

/// What the backend says to every request.
#[derive(Clone, Debug)]
pub struct Script {
    /// The full reply text.
    pub text: String,
    /// How it is cut into events.
    pub cuts: Cuts,
    /// Why it ends when neither `max_tokens` nor a stop string cut it first.
    pub finish: FinishReason,
    /// Pause between events (to keep streams open in concurrency tests).
    pub delay: Duration,
    /// Fail after this many pieces with an [`Event::Error`], as a failed engine step does
    /// (`None`: no failure).
    pub fail_after: Option<usize>,
}

impl Script {
    /// `text` cut at token boundaries, ending with `Stop`, no delay.
    pub fn new(text: &str) -> Script {
        Script {
            text: text.to_string(),
            cuts: Cuts::Tokens,
            finish: FinishReason::Stop,
            delay: Duration::ZERO,
            fail_after: None,
        }
    }
}

/// The scripted backend.
pub struct ScriptedBackend {
    info: ModelInfo,
    tok: Arc<Tokenizer>,
    /// Reply `k` for a prompt with `k` earlier assistant turns; never empty.
    replies: Mutex<Vec<Script>>,
    /// Refuse submissions as if the queue were full.
    queue_full: AtomicBool,
    shut: AtomicBool,
    in_flight: Arc<AtomicUsize>,
    prompt_tokens: Arc<AtomicU64>,
    generated: Arc<AtomicU64>,
    constrained: AtomicUsize,
    /// The prompts of the last [`PROMPT_LOG`] submissions, oldest first, so tests can check what
    /// the handlers rendered (e.g. that consecutive turns of a recorded agent session share their
    /// prefix).
    prompts: Mutex<std::collections::VecDeque<Vec<u32>>>,
    /// The settings of the last submission, so tests can check what a handler made of a wire
    /// API's fields (`num_ctx`, `temperature`, ...).
    last: Mutex<Option<Settings>>,
}

/// What a request asked of the engine besides its prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Token budget of the reply.
    pub max_tokens: Option<usize>,
    /// Context of this request, when it asked for less than the server's.
    pub n_ctx: Option<usize>,
    /// Sampling.
    pub sampler: hearth_engine::SamplerConfig,
}

/// How many submitted prompts [`ScriptedBackend::take_prompts`] keeps.
const PROMPT_LOG: usize = 256;

/// Errors building a scripted backend.
#[derive(Debug, thiserror::Error)]
pub enum ScriptedError {
    /// The GGUF file could not be opened.
    #[error(transparent)]
    Gguf(#[from] hearth_gguf::GgufError),
    /// Its tokenizer could not be built.
    #[error(transparent)]
    Tokenizer(#[from] hearth_tokenizer::TokenizerError),
}

impl ScriptedBackend {
    /// A backend with `tok` and `info` that answers `script`.
    pub fn new(tok: Arc<Tokenizer>, info: ModelInfo, script: Script) -> ScriptedBackend {
        ScriptedBackend {
            info,
            tok,
            replies: Mutex::new(vec![script]),
            queue_full: AtomicBool::new(false),
            shut: AtomicBool::new(false),
            in_flight: Arc::new(AtomicUsize::new(0)),
            prompt_tokens: Arc::new(AtomicU64::new(0)),
            generated: Arc::new(AtomicU64::new(0)),
            constrained: AtomicUsize::new(0),
            prompts: Mutex::new(std::collections::VecDeque::new()),
            last: Mutex::new(None),
        }
    }

    /// The prompts submitted since the last call (at most the last 256), oldest first.
    pub fn take_prompts(&self) -> Vec<Vec<u32>> {
        let mut p = self.prompts.lock().unwrap_or_else(|e| e.into_inner());
        p.drain(..).collect()
    }

    /// The settings of the last request submitted.
    pub fn last_settings(&self) -> Option<Settings> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many requests so far carried a grammar.
    pub fn constrained(&self) -> usize {
        self.constrained.load(Ordering::SeqCst)
    }

    /// Why the grammar refuses the script's text, if it does: the text is tokenized and followed
    /// token by token, as the engine would have sampled it.
    fn grammar_refuses(&self, grammar: &hearth_constrain::Grammar, text: &str) -> Option<String> {
        let mut c = grammar.start();
        for id in self.tok.encode(text, false) {
            if !c.allows(id) {
                let piece = String::from_utf8_lossy(self.tok.token_to_piece(id, false));
                return Some(format!(
                    "the grammar refuses token {id} ({piece:?}) of the scripted reply"
                ));
            }
            if let Err(e) = c.commit(id) {
                return Some(e.to_string());
            }
        }
        None
    }

    /// A backend with the tokenizer and metadata of a GGUF file (its chat template is returned for
    /// the caller to compile), `n_ctx` tokens per sequence and `parallel` sequences.
    pub fn from_gguf(
        path: &Path,
        n_ctx: usize,
        parallel: usize,
        script: Script,
    ) -> Result<(ScriptedBackend, Option<String>), ScriptedError> {
        let g = hearth_gguf::Gguf::open(path)?;
        let meta = g.metadata();
        let tok = Tokenizer::from_gguf(meta)?;
        let template = meta.get_str("tokenizer.chat_template").map(str::to_string);
        let arch = meta
            .get_str("general.architecture")
            .unwrap_or("unknown")
            .to_string();
        let alias = meta
            .get_str("general.name")
            .map(str::to_string)
            .unwrap_or_else(|| {
                path.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
        let info = ModelInfo {
            alias,
            arch,
            n_ctx,
            n_ctx_train: n_ctx,
            parallel,
            n_vocab: tok.vocab_size(),
            n_params: 0,
            file_size: std::fs::metadata(path).map_or(0, |m| m.len()),
            chat_template: template.clone(),
            quantization: None,
        };
        Ok((ScriptedBackend::new(Arc::new(tok), info, script), template))
    }

    /// Replaces the script for later requests: every turn gets `script`.
    pub fn set_script(&self, script: Script) {
        self.set_replies(vec![script]);
    }

    /// Replaces the replies for later requests: reply `k` answers the turn after `k` assistant
    /// turns, the last one every turn after (see the module docs). An empty list is ignored.
    pub fn set_replies(&self, replies: Vec<Script>) {
        if replies.is_empty() {
            return;
        }
        let mut r = self.replies.lock().unwrap_or_else(|e| e.into_inner());
        *r = replies;
    }

    /// Assistant turns already in `prompt`: ChatML openings `<|im_start|>assistant`, less the
    /// one the generation prompt ends with.
    pub fn assistant_turns(&self, prompt: &[u32]) -> usize {
        let Some(start) = self.tok.token_id("<|im_start|>") else {
            return 0;
        };
        let role = self.tok.encode("assistant", false);
        if role.is_empty() {
            return 0;
        }
        let opened = prompt
            .iter()
            .enumerate()
            .filter(|&(i, &id)| {
                id == start && prompt.get(i + 1..).is_some_and(|r| r.starts_with(&role))
            })
            .count();
        opened.saturating_sub(1)
    }

    /// The script that answers `prompt`.
    fn reply_for(&self, prompt: &[u32]) -> Script {
        let turn = self.assistant_turns(prompt);
        let r = self.replies.lock().unwrap_or_else(|e| e.into_inner());
        let k = turn.min(r.len().saturating_sub(1));
        // `replies` is never empty (see `set_replies`); the default is only a guard.
        r.get(k).cloned().unwrap_or_else(|| Script::new(""))
    }

    /// Makes submissions fail with `QueueFull` (or succeed again).
    pub fn set_queue_full(&self, full: bool) {
        self.queue_full.store(full, Ordering::SeqCst);
    }

    /// The pieces `text` is cut into, each with a token id: the token's own id when cut at
    /// token boundaries, else the first token of the piece.
    pub fn pieces(&self, text: &str, cuts: &Cuts) -> Vec<(u32, String)> {
        let mut bounds: Vec<usize> = match cuts {
            Cuts::Tokens => {
                return self
                    .tok
                    .encode(text, false)
                    .into_iter()
                    .map(|id| {
                        let piece = self.tok.token_to_piece(id, false);
                        (id, String::from_utf8_lossy(piece).into_owned())
                    })
                    .collect()
            }
            Cuts::Chars(n) => text
                .char_indices()
                .map(|(i, _)| i)
                .enumerate()
                .filter(|(k, _)| *k > 0 && k % (*n).max(1) == 0)
                .map(|(_, i)| i)
                .collect(),
            Cuts::At(v) => v.clone(),
        };
        bounds.push(text.len());
        bounds.sort_unstable();
        bounds.dedup();
        let mut out = Vec::new();
        let mut prev = 0;
        for b in bounds {
            if b > prev && b <= text.len() && text.is_char_boundary(b) {
                let piece = &text[prev..b];
                let id = self.tok.encode(piece, false).first().copied().unwrap_or(0);
                out.push((id, piece.to_string()));
                prev = b;
            }
        }
        out
    }
}

impl Backend for ScriptedBackend {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tok
    }

    fn submit(&self, request: Request, mut sink: Sink) -> Result<(), SubmitError> {
        if self.shut.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        if self.queue_full.load(Ordering::SeqCst) {
            return Err(SubmitError::QueueFull { queued: 64 });
        }
        check_request(&request, self.info.n_ctx, self.info.n_vocab)?;
        {
            let mut p = self.prompts.lock().unwrap_or_else(|e| e.into_inner());
            if p.len() == PROMPT_LOG {
                p.pop_front();
            }
            p.push_back(request.prompt.clone());
        }
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Settings {
            max_tokens: request.max_tokens,
            n_ctx: request.n_ctx,
            sampler: request.sampler.clone(),
        });
        let script = self.reply_for(&request.prompt);
        if let Some(g) = &request.constraint {
            self.constrained.fetch_add(1, Ordering::SeqCst);
            if let Some(why) = self.grammar_refuses(g, &script.text) {
                std::thread::spawn(move || sink(Event::Error(why)));
                return Ok(());
            }
        }
        // The pieces go through the engine's own sequence state machine, so stop strings, length
        // limits and the events sent are exactly the engine's.
        let pieces = self.pieces(&script.text, &script.cuts);
        let logprobs = request.logprobs;
        self.prompt_tokens
            .fetch_add(request.prompt.len() as u64, Ordering::Relaxed);
        let generated = self.generated.clone();
        let mut seq =
            Sequence::new(request, sink, self.info.n_ctx).with_ticket(Ticket::new(&self.in_flight));
        std::thread::spawn(move || {
            for (k, (id, p)) in pieces.iter().enumerate() {
                if script.fail_after == Some(k) {
                    seq.fail(format!("internal error: scripted failure after {k} pieces"));
                    return;
                }
                let id = *id;
                if !script.delay.is_zero() {
                    std::thread::sleep(script.delay);
                }
                let logprob = logprobs.map(|k| TokenLogprob {
                    logprob: -0.25,
                    top: (0..k)
                        .map(|j| {
                            (
                                id.wrapping_add(j as u32),
                                if j == 0 { p.clone() } else { format!("alt{j}") },
                                -0.25 - j as f32,
                            )
                        })
                        .collect(),
                });
                generated.fetch_add(1, Ordering::Relaxed);
                if seq.accept(id, p.as_bytes(), logprob).is_over() {
                    return;
                }
            }
            seq.finish(script.finish);
        });
        Ok(())
    }

    fn stats(&self) -> Stats {
        let active = self.in_flight.load(Ordering::SeqCst);
        Stats {
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: self.generated.load(Ordering::Relaxed),
            active,
            kv_capacity: self.info.n_ctx * self.info.parallel,
            ..Stats::default()
        }
    }

    fn shutdown(&self) {
        self.shut.store(true, Ordering::SeqCst);
    }

    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}
