//! Generation on top of the model: the parity report of `hearth logits`, sampling, single-sequence
//! sessions with prefix reuse, stop strings, and the generation loop.

#![deny(missing_docs)]

pub mod chat;
pub mod generate;
pub mod logits;
pub mod sampler;
pub mod scheduler;
pub mod service;
pub mod session;
pub mod stop;
mod utf8;

pub use chat::ChatEncoder;
pub use generate::{generate, FinishReason, GenParams, GenerateError, Generation};
pub use logits::{logits_report, top_k, LogitsReport};
pub use sampler::{Sampler, SamplerConfig};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use service::{Backend, Event, ModelInfo, Request, Sink, Stats, SubmitError, TokenLogprob};
pub use session::Session;
pub use stop::{StopMatcher, StopResult};
