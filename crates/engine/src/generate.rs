//! The generation loop of `hearth run` and `hearth chat`: one [`Sequence`] over one [`Session`].

use hearth_model::ModelError;
use hearth_tokenizer::Tokenizer;

use crate::sampler::SamplerConfig;
use crate::sequence::{Outcome, Sequence};
use crate::service::{Event, Request};
use crate::session::Session;

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
    /// The sequence failed (the grammar could not be followed: an engine error, or every allowed
    /// token was banned).
    #[error("{0}")]
    Sequence(String),
}

/// Generates a continuation of `prompt`, handing each piece of text to `on_text` as soon as it is
/// final; `on_text` returns `false` to stop. The rules (stop strings, limits, the grammar) are the
/// [`Sequence`]'s, as in the server: with a constraint, only tokens that keep the output valid are
/// sampled, end of generation comes only where it is complete, and generation ends with `Stop` as
/// soon as nothing may follow.
pub fn generate(
    session: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenParams,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Generation, GenerateError> {
    let n_prefilled = session.set_prompt(prompt)?;
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut end: Option<Result<FinishReason, String>> = None;
    let sink = |ev: Event| match ev {
        Event::Token { id, text: t, .. } => {
            tokens.push(id);
            text.push_str(&t);
            t.is_empty() || on_text(&t)
        }
        Event::Done {
            finish, text: t, ..
        } => {
            text.push_str(&t);
            if !t.is_empty() {
                on_text(&t);
            }
            end = Some(Ok(finish));
            true
        }
        Event::Error(e) => {
            end = Some(Err(e));
            true
        }
    };
    let request = Request {
        prompt: prompt.to_vec(),
        max_tokens: params.max_tokens,
        n_ctx: None,
        sampler: params.sampler.clone(),
        stop: params.stop.clone(),
        logprobs: None,
        constraint: params.constraint.clone(),
    };
    let mut seq = Sequence::new(request, sink, session.n_ctx());
    // The session has the whole prompt in its cache now (`n_prefilled` of it computed).
    seq.set_cached(prompt.len() - n_prefilled);
    seq.advance(prompt.len());
    let mut logits = session.logits().to_vec();
    let outcome = loop {
        if params.max_tokens == Some(0) {
            break seq.finish(FinishReason::Length);
        }
        let outcome = seq.sample(&mut logits, session.tokens(), tok);
        let Some(next) = seq.pending() else {
            break outcome;
        };
        seq.fed();
        match session.extend(&[next]) {
            Ok(l) => logits.copy_from_slice(l),
            Err(e) => {
                seq.fail(e.to_string());
                drop(seq);
                return Err(e.into());
            }
        }
    };
    drop(seq);
    match (outcome, end) {
        (_, Some(Err(e))) => Err(GenerateError::Sequence(e)),
        (_, Some(Ok(finish))) | (Outcome::Finished(finish), None) => Ok(Generation {
            text,
            tokens,
            n_prefilled,
            finish,
        }),
        _ => Err(GenerateError::Sequence(
            "generation ended without a result".into(),
        )),
    }
}
