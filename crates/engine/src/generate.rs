//! The generation loop of `hearth run` and `hearth chat`: sample, detokenize as whole characters,
//! match stop strings across tokens, end on end-of-generation tokens, the token budget or the context.

use hearth_model::ModelError;
use hearth_tokenizer::Tokenizer;

use crate::sampler::{Sampler, SamplerConfig};
use crate::session::Session;
use crate::stop::{StopMatcher, StopResult};

/// What to generate.
#[derive(Clone, Debug, Default)]
pub struct GenParams {
    /// Most tokens to generate (`None`: until end of generation or the context is full).
    pub max_tokens: Option<usize>,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Strings that end generation; never emitted.
    pub stop: Vec<String>,
    /// The grammar the output must follow (`None`: free text).
    pub constraint: Option<hearth_constrain::Grammar>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The token budget or the context ran out.
    Length,
    /// The caller asked to stop.
    Cancelled,
}

/// The result of [`generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// The emitted text (stop strings excluded).
    pub text: String,
    /// The generated tokens (the end-of-generation token excluded).
    pub tokens: Vec<u32>,
    /// Prompt tokens computed (those not reused from the cache).
    pub n_prefilled: usize,
    /// Why it ended.
    pub finish: FinishReason,
}

/// Why [`generate`] failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The grammar could not be followed (an engine error, or every allowed token was banned).
    #[error(transparent)]
    Constraint(#[from] hearth_constrain::ConstrainError),
}

/// Generates a continuation of `prompt`, handing each piece of text to `on_text` as soon as it is
/// final; `on_text` returns `false` to stop. With a constraint, only tokens that keep the output
/// valid are sampled, end of generation comes only where it is complete, and generation ends with
/// `Stop` as soon as nothing may follow.
pub fn generate(
    session: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenParams,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Generation, GenerateError> {
    let n_prefilled = session.set_prompt(prompt)?;
    let mut sampler = Sampler::new(params.sampler.clone());
    let mut constraint = params.constraint.as_ref().map(|g| g.start());
    let mut stop = StopMatcher::new(&params.stop);
    let mut detok = tok.stream_decoder(false);
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut logits = session.logits().to_vec();
    let mut emit = |s: &str, text: &mut String| {
        text.push_str(s);
        s.is_empty() || on_text(s)
    };
    let finish = loop {
        if params.max_tokens == Some(0) {
            break FinishReason::Length;
        }
        if let Some(c) = constraint.as_mut() {
            c.apply(&mut logits)?;
        }
        let next = sampler.sample(&mut logits, session.tokens());
        if tok.is_eog(next) {
            break FinishReason::Stop;
        }
        if let Some(c) = constraint.as_mut() {
            c.commit(next)?;
        }
        tokens.push(next);
        let piece = detok.push(next);
        match stop.push(&piece) {
            StopResult::Stop(s) => {
                emit(&s, &mut text);
                return Ok(Generation {
                    text,
                    tokens,
                    n_prefilled,
                    finish: FinishReason::Stop,
                });
            }
            StopResult::Continue(s) => {
                if !emit(&s, &mut text) {
                    break FinishReason::Cancelled;
                }
            }
        }
        if constraint.as_ref().is_some_and(|c| c.is_finished()) {
            break FinishReason::Stop;
        }
        if params.max_tokens.is_some_and(|m| tokens.len() >= m)
            || session.tokens().len() + 1 > session.n_ctx()
        {
            break FinishReason::Length;
        }
        logits.copy_from_slice(session.extend(&[next])?);
    };
    let rest = detok.finish();
    let tail = match stop.push(&rest) {
        StopResult::Stop(s) => s,
        StopResult::Continue(s) => s + &stop.finish(),
    };
    emit(&tail, &mut text);
    Ok(Generation {
        text,
        tokens,
        n_prefilled,
        finish,
    })
}
