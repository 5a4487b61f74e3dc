//! The interface between the HTTP server and whatever produces tokens: the real continuous-batching
//! scheduler, or a scripted stand-in for tests. The server only ever talks to a [`Backend`].

use std::sync::Arc;

use hearth_tokenizer::Tokenizer;

use crate::generate::FinishReason;
use crate::sampler::SamplerConfig;

/// Static facts about the loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The name clients see (`--alias`, else `general.name`, else the file stem).
    pub alias: String,
    /// `general.architecture`.
    pub arch: String,
    /// Context per sequence, in tokens.
    pub n_ctx: usize,
    /// Context the model was trained with.
    pub n_ctx_train: usize,
    /// Sequences decoded together.
    pub parallel: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Parameter count (for `/api/show`).
    pub n_params: u64,
    /// Bytes of the model file.
    pub file_size: u64,
    /// The chat template source (the file's or `--chat-template`), `None` when falling back to ChatML.
    pub chat_template: Option<String>,
    /// The file's `general.file_type` spelled as a quantization name (e.g. `Q4_K_M`), when known.
    pub quantization: Option<String>,
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct Request {
    /// Prompt token ids (already templated and tokenized).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (`None`: until end of generation or the context end).
    pub max_tokens: Option<usize>,
    /// A smaller context than the backend's for this request (`None`: the backend's): prompt
    /// plus generated tokens stay within it.
    pub n_ctx: Option<usize>,
    /// Sampling settings (seeded).
    pub sampler: SamplerConfig,
    /// Stop strings (never emitted).
    pub stop: Vec<String>,
    /// How many top alternatives to report with each token's log-probability (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// The grammar the output must follow (`None`: free text). End of generation is allowed only
    /// where the output is complete; the reply ends with `Stop` as soon as nothing may follow.
    pub constraint: Option<hearth_constrain::Grammar>,
}

/// Log-probability information of one generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token's log-probability.
    pub logprob: f32,
    /// The most likely alternatives `(id, text, logprob)`, best first.
    pub top: Vec<(u32, String, f32)>,
}

/// What a running request produces, in order: any number of `Token`s, then exactly one `Done` or
/// `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// One generated token. `text` is the newly final text (possibly empty: text that may still turn
    /// out to be the start of a stop string, or an incomplete UTF-8 character, is held back).
    Token {
        /// Token id.
        id: u32,
        /// Text released by this token.
        text: String,
        /// Log-probabilities, when requested.
        logprob: Option<TokenLogprob>,
    },
    /// The end. `text` is any held-back text released at the end.
    Done {
        /// Why it ended.
        finish: FinishReason,
        /// The stop string that ended it, when one did (it is not part of the text).
        stop: Option<String>,
        /// Final text released at the end.
        text: String,
        /// Token counts and timings.
        usage: Usage,
    },
    /// The request failed after it was accepted.
    Error(String),
}

/// What a finished request used.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Prompt tokens served from the prefix cache (not recomputed).
    pub n_cached: usize,
    /// Tokens generated.
    pub n_gen: usize,
    /// From admission to the first generated token (prefill).
    pub prompt_time: std::time::Duration,
    /// From the first generated token to the end (decode).
    pub gen_time: std::time::Duration,
}

/// Why a request was not accepted.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// The queue is full; retry later.
    #[error("the server is busy: {queued} requests are waiting")]
    QueueFull {
        /// Requests waiting.
        queued: usize,
    },
    /// The prompt does not fit the context.
    #[error("the prompt has {prompt} tokens but the context per sequence is {n_ctx}")]
    PromptTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Context per sequence.
        n_ctx: usize,
    },
    /// The request is invalid (empty prompt, token id outside the vocabulary...).
    #[error("{0}")]
    Invalid(String),
    /// The backend is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The backend cannot serve any more (its engine failed); a restart is needed.
    #[error("the server cannot serve requests: {0}")]
    Unavailable(String),
}

/// Receives a request's events; returns `false` when the client is gone, which cancels the request
/// (its sequence is freed within one step).
pub type Sink = Box<dyn FnMut(Event) -> bool + Send>;

/// Counters and gauges for `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Prompt tokens processed (computed, not cached).
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache (the prefix cache's hits, in tokens).
    pub cached_tokens: u64,
    /// Of those, tokens read back from the disk tier.
    pub disk_cached_tokens: u64,
    /// Requests that looked their prompt up in the prefix cache.
    pub prefix_queries: u64,
    /// The prompt tokens of those lookups (what a perfect cache would have served, but the last).
    pub prefix_query_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Seconds spent in prefill steps.
    pub prefill_seconds: f64,
    /// Seconds spent in decode steps.
    pub decode_seconds: f64,
    /// Requests waiting for a sequence slot.
    pub queued: usize,
    /// Sequences generating now.
    pub active: usize,
    /// KV cache cells in use (tokens held across all slots).
    pub kv_used: usize,
    /// KV cache capacity in cells.
    pub kv_capacity: usize,
    /// KV pool blocks held by running sequences.
    pub kv_held_blocks: usize,
    /// KV pool blocks held by no sequence and kept as prefix cache.
    pub kv_cached_blocks: usize,
    /// Per expert, how many (token, layer) routings chose it (MoE models; empty otherwise).
    pub expert_load: Vec<u64>,
}

/// Something that turns requests into token streams.
pub trait Backend: Send + Sync + 'static {
    /// Facts about the model.
    fn info(&self) -> &ModelInfo;
    /// The model's tokenizer.
    fn tokenizer(&self) -> &Arc<Tokenizer>;
    /// Queues a request; its events go to `sink` from the backend's own thread.
    fn submit(&self, request: Request, sink: Sink) -> Result<(), SubmitError>;
    /// A snapshot of the counters.
    fn stats(&self) -> Stats;
    /// Stops accepting requests; running ones finish.
    fn shutdown(&self);
    /// After [`Backend::shutdown`]: waits until the backend has finished its work (the last
    /// request, and what it saves on the way out, such as the disk cache).
    fn join(&self) {}
    /// Requests running or waiting.
    fn in_flight(&self) -> usize;
    /// `Err` with the reason once the backend can no longer serve (`/health` answers 503).
    fn health(&self) -> Result<(), String> {
        Ok(())
    }
}

impl ModelInfo {
    /// Describes a loaded model. `alias` defaults to `general.name`, else the file stem; the chat
    /// template is `chat_template` (e.g. from `--chat-template`), else the file's.
    pub fn describe(
        model: &hearth_model::Model,
        path: &std::path::Path,
        n_ctx: usize,
        parallel: usize,
        alias: Option<String>,
        chat_template: Option<String>,
    ) -> ModelInfo {
        let g = model.gguf();
        let meta = g.metadata();
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        ModelInfo {
            alias: alias
                .or_else(|| meta.get_str("general.name").map(str::to_string))
                .unwrap_or(stem),
            arch: model.config.arch.name.to_string(),
            n_ctx,
            n_ctx_train: model.config.n_ctx_train,
            parallel,
            n_vocab: model.config.n_vocab,
            n_params: g.tensors().iter().map(|t| t.n_elements).sum(),
            file_size: g.bytes().len() as u64,
            chat_template: chat_template
                .or_else(|| meta.get_str("tokenizer.chat_template").map(str::to_string)),
            quantization: meta
                .get_u32("general.file_type")
                .and_then(file_type_name)
                .map(str::to_string),
        }
    }
}

/// llama.cpp's `llama_ftype` names.
fn file_type_name(ft: u32) -> Option<&'static str> {
    Some(match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        25 => "IQ4_NL",
        30 => "IQ4_XS",
        32 => "BF16",
        _ => return None,
    })
}
