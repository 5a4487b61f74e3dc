//! One sequence's life, from prompt to finish: the one definition of every rule a generation follows.
//!
//! A [`Sequence`] holds a request's prompt and prefill progress, its sampler and grammar state, the
//! detokenizer that releases whole UTF-8 characters, the stop-string matcher, the length limits
//! and the sink its events go to. Whoever runs the model (the continuous-batching scheduler, the
//! CLI's `run` / `chat` loop, the scripted test backend) only feeds it:
//!
//! - prefill: [`Sequence::remaining_prompt`] / [`Sequence::advance`], after the caller reused a
//!   cached prefix ([`Sequence::set_cached`]);
//! - decode: [`Sequence::sample`] with the logits after the last token (or [`Sequence::accept`]
//!   with a token chosen elsewhere); the sampled token comes back as [`Sequence::pending`] until the
//!   caller has fed it to the model;
//! - the end: every sequence ends with exactly one [`Event::Done`] (finish reason, the stop string
//!   that fired, usage and timings) or [`Event::Error`], or with nothing when the client left
//!   ([`FinishReason::Cancelled`]). A sequence dropped before it finished (a failed engine step)
//!   sends an error, so no request is left waiting.
//!
//! Limits: at most `max_tokens` tokens are generated, and prompt plus generated tokens never exceed
//! `n_ctx` (the last token sampled need not be fed back, so a sequence may sample exactly
//! `n_ctx - prompt` tokens). End of generation ends with `Stop` and is not emitted; a stop string
//! ends with `Stop` and is never emitted; a grammar that admits nothing more ends with `Stop`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hearth_constrain::Constraint;
use hearth_tokenizer::Tokenizer;

use crate::generate::FinishReason;
use crate::sampler::{logprob, top_logprobs, Sampler};
use crate::service::{Event, Request, TokenLogprob, Usage};
use crate::stop::{StopMatcher, StopResult};
use crate::utf8::Utf8Buffer;

/// Counts a request as in flight while it lives: the count drops when the sequence finishes
/// (before its last event is sent, so a client that has seen the end never finds it still
/// counted) or when it is dropped, whatever the reason.
pub struct Ticket(Arc<AtomicUsize>);

impl Ticket {
    /// Counts one more request in `counter`.
    pub fn new(counter: &Arc<AtomicUsize>) -> Ticket {
        counter.fetch_add(1, Ordering::AcqRel);
        Ticket(counter.clone())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a call into a [`Sequence`] left it as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Still generating: the sampled token waits in [`Sequence::pending`] (or the prompt is not
    /// done yet).
    Running,
    /// Ended; its last event was sent (none when cancelled).
    Finished(FinishReason),
    /// Failed; an [`Event::Error`] was sent.
    Failed,
}

impl Outcome {
    /// Whether the sequence is over.
    pub fn is_over(self) -> bool {
        self != Outcome::Running
    }
}

/// A request being generated. `S` is where its events go (a boxed [`crate::Sink`] in the server,
/// a borrowed closure in the CLI); it returns `false` when nobody listens any more.
pub struct Sequence<S: FnMut(Event) -> bool = crate::Sink> {
    prompt: Vec<u32>,
    max_tokens: Option<usize>,
    logprobs: Option<usize>,
    n_ctx: usize,
    sampler: Sampler,
    constraint: Option<Constraint>,
    stop: StopMatcher,
    text: Utf8Buffer,
    sink: S,
    ticket: Option<Ticket>,
    /// Prompt tokens whose K/V were reused rather than computed.
    n_cached: usize,
    /// Next prompt index to prefill; `prompt.len()` once decoding.
    next_prompt: usize,
    /// The sampled token not yet fed to the model.
    pending: Option<u32>,
    n_gen: usize,
    started: Instant,
    first_token: Option<Instant>,
    over: bool,
    raw: Vec<f32>, // [n_vocab] the logits before masking, for log-probabilities (only when asked)
}

impl<S: FnMut(Event) -> bool> Sequence<S> {
    /// A sequence for `req` in a context of `n_ctx` tokens; its events go to `sink`. The prompt
    /// must be shorter than the context (the caller checks it, to refuse with a clear error).
    pub fn new(req: Request, sink: S, n_ctx: usize) -> Sequence<S> {
        Sequence {
            max_tokens: req.max_tokens,
            logprobs: req.logprobs,
            n_ctx: req.n_ctx.map_or(n_ctx, |c| c.min(n_ctx)),
            sampler: Sampler::new(req.sampler),
            constraint: req.constraint.as_ref().map(|g| g.start()),
            stop: StopMatcher::new(&req.stop),
            text: Utf8Buffer::default(),
            sink,
            ticket: None,
            n_cached: 0,
            next_prompt: 0,
            pending: None,
            n_gen: 0,
            started: Instant::now(),
            first_token: None,
            over: false,
            raw: Vec::new(),
            prompt: req.prompt,
        }
    }

    /// Counts the sequence in flight until it ends (see [`Ticket`]).
    pub fn with_ticket(mut self, ticket: Ticket) -> Sequence<S> {
        self.ticket = Some(ticket);
        self
    }

    /// Starts the clock of the prompt time (when the request leaves the queue).
    pub fn admitted(&mut self) {
        self.started = Instant::now();
    }

    /// The prompt.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Records that the first `n` prompt tokens are already in the cache (at least the last prompt
    /// token is always computed, so the logits that start generation are fresh).
    pub fn set_cached(&mut self, n: usize) {
        let n = n.min(self.prompt.len().saturating_sub(1));
        self.n_cached = n;
        self.next_prompt = n;
    }

    /// Prompt tokens served from the cache.
    pub fn n_cached(&self) -> usize {
        self.n_cached
    }

    /// Prompt tokens still to prefill.
    pub fn remaining_prompt(&self) -> &[u32] {
        &self.prompt[self.next_prompt..]
    }

    /// Index of the next prompt token to prefill.
    pub fn prefilled(&self) -> usize {
        self.next_prompt
    }

    /// Whether prompt tokens remain to prefill.
    pub fn is_prefilling(&self) -> bool {
        self.next_prompt < self.prompt.len()
    }

    /// Marks `n` more prompt tokens as computed.
    pub fn advance(&mut self, n: usize) {
        self.next_prompt = (self.next_prompt + n).min(self.prompt.len());
    }

    /// The sampled token waiting to be fed to the model.
    pub fn pending(&self) -> Option<u32> {
        self.pending
    }

    /// Marks the pending token as fed.
    pub fn fed(&mut self) {
        self.pending = None;
    }

    /// Tokens generated so far.
    pub fn n_gen(&self) -> usize {
        self.n_gen
    }

    /// The grammar state, for callers that compute masks ahead of [`Sequence::sample`].
    pub fn constraint_mut(&mut self) -> Option<&mut Constraint> {
        self.constraint.as_mut()
    }

    /// Whether the sequence has ended.
    pub fn is_over(&self) -> bool {
        self.over
    }

    /// Samples the next token from the logits after the last fed token (`logits` is modified:
    /// mask, bias and penalties are applied in place); `history` is every token in the sequence's
    /// cache, for the penalties. Emits the token and decides whether to go on.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32], tok: &Tokenizer) -> Outcome {
        if self.over || self.is_prefilling() {
            return self.state();
        }
        if self.logprobs.is_some() {
            self.raw.clear();
            self.raw.extend_from_slice(logits);
        }
        // The grammar's mask comes before every other sampling step, so bias, penalties and
        // truncation only ever choose among tokens that keep the output valid.
        if let Some(e) = self.constraint.as_mut().and_then(|c| c.apply(logits).err()) {
            return self.fail(e.to_string());
        }
        let next = self.sampler.sample(logits, history);
        if tok.is_eog(next) {
            return self.finish(FinishReason::Stop);
        }
        let logprob = self.logprobs.map(|k| TokenLogprob {
            logprob: logprob(&self.raw, next),
            top: top_logprobs(&self.raw, k)
                .into_iter()
                .map(|(id, l)| {
                    let piece = String::from_utf8_lossy(tok.token_to_piece(id, false));
                    (id, piece.into_owned(), l)
                })
                .collect(),
        });
        self.accept(next, tok.token_to_piece(next, false), logprob)
    }

    /// Takes `id` (spelled `piece`) as the next generated token, which is not end of generation:
    /// follows the grammar, emits the text that is now final, and applies the stop strings and
    /// limits.
    pub fn accept(&mut self, id: u32, piece: &[u8], logprob: Option<TokenLogprob>) -> Outcome {
        if self.over {
            return self.state();
        }
        if let Some(e) = self.constraint.as_mut().and_then(|c| c.commit(id).err()) {
            return self.fail(e.to_string());
        }
        self.first_token.get_or_insert_with(Instant::now);
        self.n_gen += 1;
        let released = self.text.push(piece);
        let (text, stop) = match self.stop.push(&released) {
            StopResult::Stop { text, stop } => (text, Some(stop)),
            StopResult::Continue(text) => (text, None),
        };
        if !(self.sink)(Event::Token { id, text, logprob }) {
            return self.cancel();
        }
        if let Some(stop) = stop {
            return self.end(FinishReason::Stop, Some(stop), String::new());
        }
        if self
            .constraint
            .as_ref()
            .is_some_and(Constraint::is_finished)
        {
            // The output is complete and nothing may follow: end as the grammar says, without a
            // step spent sampling the end-of-generation token.
            return self.finish(FinishReason::Stop);
        }
        if self.max_tokens.is_some_and(|m| self.n_gen >= m)
            || self.prompt.len() + self.n_gen >= self.n_ctx
        {
            return self.finish(FinishReason::Length);
        }
        self.pending = Some(id);
        Outcome::Running
    }

    /// Ends the sequence for `reason`, releasing held-back text (a stop string completed by it
    /// still ends the text there).
    pub fn finish(&mut self, reason: FinishReason) -> Outcome {
        if self.over {
            return self.state();
        }
        if reason == FinishReason::Cancelled {
            return self.cancel();
        }
        let tail = self.text.finish();
        let (rest, stop) = match self.stop.push(&tail) {
            StopResult::Stop { text, stop } => (text, Some(stop)),
            StopResult::Continue(text) => (text + &self.stop.finish(), None),
        };
        self.end(reason, stop, rest)
    }

    /// Ends the sequence with an error event.
    pub fn fail(&mut self, message: String) -> Outcome {
        if self.over {
            return self.state();
        }
        self.over = true;
        self.pending = None;
        self.ticket = None;
        (self.sink)(Event::Error(message));
        Outcome::Failed
    }

    /// Ends the sequence without another event: the client is gone.
    pub fn cancel(&mut self) -> Outcome {
        self.over = true;
        self.pending = None;
        self.ticket = None;
        Outcome::Finished(FinishReason::Cancelled)
    }

    /// Prompt, cache and generation counts with the time spent so far.
    pub fn usage(&self) -> Usage {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        Usage {
            n_prompt: self.prompt.len(),
            n_cached: self.n_cached,
            n_gen: self.n_gen,
            prompt_time: first.saturating_duration_since(self.started),
            gen_time: now.saturating_duration_since(first),
        }
    }

    fn end(&mut self, finish: FinishReason, stop: Option<String>, text: String) -> Outcome {
        self.over = true;
        self.pending = None;
        let usage = self.usage();
        // Counted out before the last event, so a client that sees `Done` sees the slot free.
        self.ticket = None;
        (self.sink)(Event::Done {
            finish,
            stop,
            text,
            usage,
        });
        Outcome::Finished(finish)
    }

    fn state(&self) -> Outcome {
        if self.over {
            Outcome::Failed
        } else {
            Outcome::Running
        }
    }
}

impl<S: FnMut(Event) -> bool> Drop for Sequence<S> {
    fn drop(&mut self) {
        if !self.over {
            // Dropped mid-flight (the engine step failed, the engine shut down): the client gets
            // an error instead of waiting forever.
            self.ticket = None;
            (self.sink)(Event::Error(
                "the request was aborted by an internal error; please retry".into(),
            ));
        }
    }
}
