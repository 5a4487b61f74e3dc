//! Generation on top of the model: the parity report of `hearth logits`, sampling, stop strings,
//! the one sequence state machine ([`Sequence`]: prompt, sampling, stops, limits, finish) that the
//! continuous-batching [`Scheduler`], the CLI's generation loop and test doubles all run,
//! single-sequence sessions with prefix reuse, and the disk tier of the KV prefix cache
//! ([`DiskCache`]).

#![deny(missing_docs)]

pub mod chat;
pub mod disk_cache;
pub mod generate;
pub mod kv_pool;
pub mod logits;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod service;
pub mod session;
pub mod stop;
mod utf8;

pub use chat::ChatEncoder;
pub use disk_cache::{
    cache_namespace, model_identity, BlockHash, DiskCache, DiskCacheConfig, DiskCacheError,
    DiskStats,
};
pub use generate::{generate, FinishReason, GenParams, GenerateError, Generation};
pub use logits::{logits_report, top_k, LogitsReport};
pub use sampler::{Sampler, SamplerConfig};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use sequence::{Outcome, Sequence, Ticket};
pub use service::{
    Backend, Event, ModelInfo, Request, Sink, Stats, SubmitError, TokenLogprob, Usage,
};
pub use session::Session;
pub use stop::{StopMatcher, StopResult};
