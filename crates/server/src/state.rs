//! What every handler shares: the backend (once loaded), the compiled chat template, the server's
//! configuration and its metrics.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use hearth_constrain::Constrainer;
use hearth_engine::{Backend, ChatEncoder, ModelInfo};
use hearth_tokenizer::template::ChatTemplate;
use hearth_tokenizer::Tokenizer;

use crate::error::{Api, ApiError};
use crate::metrics::Metrics;
use crate::parse::ToolFormat;

/// Server settings that do not depend on the model.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Required API key (`None`: no authentication).
    pub api_key: Option<String>,
    /// Largest request body in bytes (larger → 413).
    pub max_body: usize,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            api_key: None,
            max_body: 16 << 20,
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
            constrainer: OnceLock::new(),
        }));
    }

    /// The loaded model, or 503 while loading.
    pub fn loaded(&self, api: Api) -> Result<Arc<Loaded>, ApiError> {
        self.inner
            .loaded
            .get()
            .cloned()
            .ok_or_else(|| ApiError::loading(api))
    }

    /// Whether the model is loaded.
    pub fn is_ready(&self) -> bool {
        self.inner.loaded.get().is_some()
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// Request counters.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Unix time the server started (the `created` of `/v1/models`).
    pub fn started(&self) -> u64 {
        self.inner.started
    }
}
