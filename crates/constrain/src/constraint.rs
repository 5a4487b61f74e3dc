//! Compiling specs against a vocabulary once, and following one sequence token by token.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use hearth_tokenizer::Tokenizer;
use llguidance::{Matcher, ParserFactory};
use toktrie::{SimpleVob, TokEnv};

use crate::spec::{to_llg, Spec};
use crate::vocab::HearthTokEnv;
use crate::ConstrainError;

/// Compiled grammars kept for reuse (a client sends the same schema again and again).
const CACHE_SIZE: usize = 32;

/// Compiles [`Spec`]s against one model's vocabulary; cheap to share between threads.
pub struct Constrainer {
    factory: ParserFactory,
    eog: Arc<[u32]>,
    cache: Mutex<VecDeque<(String, Grammar)>>,
}

impl std::fmt::Debug for Constrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constrainer")
            .field("n_vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl Constrainer {
    /// Builds the token trie of `tokenizer` for a model with `n_vocab` logit rows (this takes a
    /// moment on a large vocabulary; build it once per model).
    pub fn new(tokenizer: Arc<Tokenizer>, n_vocab: usize) -> Result<Constrainer, ConstrainError> {
        let eog: Arc<[u32]> = tokenizer
            .eog_ids()
            .filter(|&t| (t as usize) < n_vocab)
            .collect();
        let env: TokEnv = HearthTokEnv::build(tokenizer, n_vocab)?;
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstrainError::Vocab(e.to_string()))?;
        factory.quiet();
        Ok(Constrainer {
            factory,
            eog,
            cache: Mutex::new(VecDeque::new()),
        })
    }

    /// Compiles `spec`, or takes it from the cache. An error names what the spec gets wrong or what
    /// the engine does not support.
    pub fn compile(&self, spec: &Spec) -> Result<Grammar, ConstrainError> {
        let key = format!("{spec:?}");
        {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            // Most recently used first; a hit moves to the front.
            if let Some((k, g)) = cache
                .iter()
                .position(|(k, _)| *k == key)
                .and_then(|i| cache.remove(i))
            {
                cache.push_front((k, g.clone()));
                return Ok(g);
            }
        }
        let llg = to_llg(spec)?;
        let is_schema = matches!(spec, Spec::JsonSchema(_) | Spec::ToolCall { .. });
        let wrap = |msg: String| {
            let msg = tidy_message(&msg);
            if is_schema {
                ConstrainError::Schema(msg)
            } else {
                ConstrainError::Grammar(msg)
            }
        };
        let parser = self
            .factory
            .create_parser(llg)
            .map_err(|e| wrap(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        // Computing the first mask now surfaces grammars that compile but cannot start, and warms
        // the lexer every clone starts from.
        let first = matcher.compute_mask().map_err(|e| wrap(e.to_string()))?;
        if first.is_zero() && !matcher.is_accepting().unwrap_or(false) {
            return Err(wrap(
                "no token can start the output (is the grammar satisfiable?)".into(),
            ));
        }
        let g = Grammar {
            proto: Arc::new(Mutex::new(matcher)),
            eog: self.eog.clone(),
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.push_front((key, g.clone()));
        cache.truncate(CACHE_SIZE);
        Ok(g)
    }
}

/// Longest engine message passed on to a client.
const MAX_MESSAGE: usize = 600;

/// An llguidance error as a client should see it: llguidance turns its own panics into errors that
/// carry a backtrace, and some messages quote whole grammars.
fn tidy_message(msg: &str) -> String {
    let msg = msg.split("\n<backtrace>").next().unwrap_or("").trim_end();
    if msg.len() <= MAX_MESSAGE {
        return msg.to_string();
    }
    let mut end = MAX_MESSAGE;
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &msg[..end])
}

/// A compiled constraint; [`Grammar::start`] gives each sequence its own state.
#[derive(Clone)]
pub struct Grammar {
    proto: Arc<Mutex<Matcher>>,
    eog: Arc<[u32]>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

impl Grammar {
    /// A fresh state at the start of the output.
    pub fn start(&self) -> Constraint {
        // A deep clone shares no lexer cache, so sequences compute their masks independently (in
        // parallel); it starts from the prototype's already-built lexer states.
        let matcher = self
            .proto
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deep_clone();
        Constraint {
            matcher,
            mask: None,
            eog: self.eog.clone(),
        }
    }
}

/// One sequence's position in a grammar: which tokens may come next.
pub struct Constraint {
    matcher: Matcher,
    mask: Option<SimpleVob>, // [n_vocab] bits, for the current position
    eog: Arc<[u32]>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl Constraint {
    /// Computes the set of tokens allowed next (kept until [`Constraint::commit`]). End-of-generation
    /// tokens are allowed exactly when the output so far is complete.
    pub fn compute_mask(&mut self) -> Result<(), ConstrainError> {
        if self.mask.is_some() {
            return Ok(());
        }
        let mut m = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstrainError::Violated(tidy_message(&e.to_string())))?;
        let accepting = self.matcher.is_accepting().unwrap_or(false);
        for &t in self.eog.iter() {
            m.set(t as usize, accepting);
        }
        if m.is_zero() {
            return Err(ConstrainError::Violated(
                "no token can continue the output".into(),
            ));
        }
        self.mask = Some(m);
        Ok(())
    }

    /// Whether `token` is allowed next (computes the mask if needed; `false` on an engine error).
    pub fn allows(&mut self, token: u32) -> bool {
        self.compute_mask().is_ok() && self.mask.as_ref().is_some_and(|m| m.is_allowed(token))
    }

    /// Sets the logits of disallowed tokens to `-inf` (computes the mask if needed).
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), ConstrainError> {
        self.compute_mask()?;
        let Some(m) = &self.mask else {
            return Ok(());
        };
        for (w, chunk) in m.as_slice().iter().zip(logits.chunks_mut(32)) {
            match *w {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                w => {
                    for (b, l) in chunk.iter_mut().enumerate() {
                        if w & (1 << b) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        // Logit rows past the mask's words (none when the sizes agree) are not allowed either.
        if let Some(rest) = logits.get_mut(m.as_slice().len() * 32..) {
            rest.fill(f32::NEG_INFINITY);
        }
        Ok(())
    }

    /// Advances past a generated token (not an end-of-generation one).
    pub fn commit(&mut self, token: u32) -> Result<(), ConstrainError> {
        self.mask = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstrainError::Violated(tidy_message(&e.to_string())))
    }

    /// Whether the output so far is complete (end of generation is allowed now).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether the output is complete and nothing may follow it: generation ends here, with no need
    /// to sample an end-of-generation token.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn messages_lose_backtraces_and_stay_short() {
        assert_eq!(
            super::tidy_message("panic: x\n<backtrace>\n 0: f"),
            "panic: x"
        );
        let long = "é".repeat(1000);
        let t = super::tidy_message(&long);
        assert!(t.len() <= super::MAX_MESSAGE + 3 && t.ends_with('…'));
    }
}
