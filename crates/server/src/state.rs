//! What every handler shares: the backend (once loaded), the compiled chat template, the server's
//! configuration and its metrics.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use hearth_constrain::Constrainer;
use hearth_engine::{Backend, ChatEncoder, ModelInfo};
use hearth_tokenizer::template::{ChatInput, ChatTemplate, TemplateError};
use hearth_tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::listen::ConnStats;
use crate::metrics::Metrics;
use crate::parse::ToolFormat;
use crate::responses::store::ResponseStore;
use crate::stream::StreamConfig;

/// Server settings that do not depend on the model.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Required API key (`None`: no authentication).
    pub api_key: Option<String>,
    /// Largest request body in bytes (larger → 413).
    pub max_body: usize,
    /// Most tokens a reply may generate, whatever the request asks (`None`: no cap).
    pub max_tokens: Option<usize>,
    /// How streamed replies are written (the write timeout).
    pub stream: StreamConfig,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            api_key: None,
            max_body: 16 << 20,
            max_tokens: None,
            stream: StreamConfig::default(),
        }
    }
}

/// The model side, present once loading has finished.
pub struct Loaded {
    /// The token producer.
    pub backend: Arc<dyn Backend>,
    /// The compiled chat template.
    pub template: ChatTemplate,
    /// Renders and tokenizes chats so message content never becomes control tokens.
    pub encoder: ChatEncoder,
    /// The tool-call syntax the template teaches.
    pub tool_format: ToolFormat,
    /// The server's cap on generated tokens per reply ([`ServerConfig::max_tokens`]).
    pub max_tokens: Option<usize>,
    /// Compiles structured-output grammars; built on first use (its token trie takes a moment on a
    /// large vocabulary, and most servers never need it).
    constrainer: OnceLock<Result<Arc<Constrainer>, String>>,
}

impl Loaded {
    /// The model's facts.
    pub fn info(&self) -> &ModelInfo {
        self.backend.info()
    }

    /// The tokenizer.
    pub fn tok(&self) -> &Arc<Tokenizer> {
        self.backend.tokenizer()
    }

    /// Renders a conversation through the chat template (message strings escaped so their text
    /// never becomes control tokens). A template that refuses the conversation is a 400 naming
    /// why; one that ran out of memory or time (the template's fault, whatever the request) a 500;
    /// one that found every render worker busy for a render's time limit a 503.
    pub fn render_chat(&self, input: &ChatInput) -> Result<String, ApiError> {
        self.encoder.render(&self.template, input).map_err(|e| {
            if matches!(e, TemplateError::Busy { .. }) {
                ApiError::unavailable(e.to_string())
            } else if e.is_resource() {
                tracing::error!("chat template failed: {e}");
                ApiError::internal(e.to_string())
            } else {
                ApiError::bad_request(e.to_string())
            }
        })
    }

    /// The grammar compiler for this model (built on the first call).
    pub fn constrainer(&self) -> Result<Arc<Constrainer>, String> {
        self.constrainer
            .get_or_init(|| {
                Constrainer::new(self.tok().clone(), self.info().n_vocab)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }
}

struct Inner {
    config: ServerConfig,
    loaded: OnceLock<Arc<Loaded>>,
    metrics: Metrics,
    connections: ConnStats,
    responses: Arc<ResponseStore>,
    started: u64,
}

/// Shared state of the router; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

impl AppState {
    /// A server that is still loading its model: `/health` answers 503 until [`AppState::set_backend`].
    pub fn loading(config: ServerConfig) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                config,
                loaded: OnceLock::new(),
                metrics: Metrics::default(),
                connections: ConnStats::default(),
                responses: Arc::default(),
                started: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            }),
        }
    }

    /// A ready server over `backend`.
    pub fn new(
        config: ServerConfig,
        backend: Arc<dyn Backend>,
        template: ChatTemplate,
    ) -> AppState {
        let s = AppState::loading(config);
        s.set_backend(backend, template);
        s
    }

    /// Finishes loading; later calls are ignored.
    pub fn set_backend(&self, backend: Arc<dyn Backend>, template: ChatTemplate) {
        let encoder = ChatEncoder::new(backend.tokenizer());
        let tool_format = ToolFormat::detect(template.source());
        let _ = self.inner.loaded.set(Arc::new(Loaded {
            backend,
            template,
            encoder,
            tool_format,
            max_tokens: self.inner.config.max_tokens,
            constrainer: OnceLock::new(),
        }));
    }

    /// The loaded model, or 503 while loading.
    pub fn loaded(&self) -> Result<Arc<Loaded>, ApiError> {
        self.inner
            .loaded
            .get()
            .cloned()
            .ok_or_else(ApiError::loading)
    }

    /// Whether the model is loaded.
    pub fn is_ready(&self) -> bool {
        self.inner.loaded.get().is_some()
    }

    /// `Err` with the reason while the server cannot serve: loading, or its engine failed.
    pub fn health(&self) -> Result<(), ApiError> {
        let l = self.loaded()?;
        l.backend.health().map_err(ApiError::unavailable)
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// Request counters.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The connection layer's counters (filled by [`crate::listen::serve`]).
    pub fn connections(&self) -> &ConnStats {
        &self.inner.connections
    }

    /// Stored Responses-API responses (`store: true`, `previous_response_id`).
    pub fn responses(&self) -> &Arc<ResponseStore> {
        &self.inner.responses
    }

    /// Unix time the server started (the `created` of `/v1/models`).
    pub fn started(&self) -> u64 {
        self.inner.started
    }
}
