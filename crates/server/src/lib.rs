//! Hearth's HTTP server: the OpenAI, Anthropic and Ollama APIs (plus llama-server's utility
//! endpoints) over any [`hearth_engine::Backend`].
//!
//! Layout:
//! - [`app`] builds the [`axum::Router`] from an [`AppState`]; `main` only binds a socket, so tests
//!   drive the whole HTTP stack in memory with `app(state).oneshot(request)`.
//! - [`error::ApiError`] is the one error type; the router writes it in the error shape of the API
//!   the path belongs to (OpenAI `{"error": {..}}`, Anthropic `{"type": "error", ..}`, Ollama
//!   `{"error": ".."}`), so handlers never carry "which API" around.
//! - [`pipeline`] is the one path every generating endpoint takes: the wire request becomes a
//!   [`pipeline::GenRequest`]; `prepare` (validation, constraint compilation, the thinking switch,
//!   template and tokenization, on the blocking pool) turns it into engine requests; each choice
//!   comes back as a neutral [`pipeline::Reply`] stream (text, reasoning and tool-call deltas from
//!   [`parse::StreamParser`], log-probabilities, the finish).
//! - [`openai`], [`responses`], [`anthropic`], [`ollama`] are thin renderers of that stream: [`stream`] drives the
//!   streamed form (with write timeouts), and a whole reply is the same stream folded.
//!   [`fields`] holds the request fields they share; [`util`] the utility endpoints.
//! - [`structured`] turns `response_format`, `grammar`, Ollama's `format` and forced tool choices
//!   into one compiled grammar that the engine's sampler follows.
//! - [`metrics`] counts requests for `/metrics`; [`scripted`] is a backend that plays fixed text,
//!   for tests of the reasoning and tool-call paths that a random-weight model never takes.

#![deny(missing_docs)]

pub mod anthropic;
pub mod error;
pub mod fields;
pub mod listen;
pub mod metrics;
pub mod ollama;
pub mod openai;
pub mod parse;
pub mod pipeline;
pub mod responses;
pub mod scripted;
pub mod state;
pub mod stream;
pub mod structured;
pub mod util;

pub use error::{Api, ApiError};
pub use state::{AppState, ServerConfig};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

/// Builds the router with every endpoint, authentication, the body limit and request metrics.
pub fn app(state: AppState) -> Router {
    let max_body = state.config().max_body;
    Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route("/models", get(openai::models))
        .route("/v1/models/{model}", get(openai::model))
        .route("/v1/responses", post(responses::create))
        .route("/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/version", get(ollama::version))
        .route("/api/ps", get(ollama::ps))
        .route("/", get(ollama::root).head(ollama::root_head))
        .route("/tokenize", post(util::tokenize))
        .route("/detokenize", post(util::detokenize))
        .route("/health", get(util::health))
        .route("/metrics", get(util::metrics))
        .fallback(util::not_found)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn(shape_errors))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// Which API's error shape a path answers in.
pub fn api_of(path: &str) -> Api {
    if path.starts_with("/v1/messages") {
        Api::Anthropic
    } else if path.starts_with("/api/") || path == "/" {
        Api::Ollama
    } else {
        Api::OpenAi
    }
}

/// Writes every error answer in the error shape of the API its path belongs to: a handler's
/// [`ApiError`] travels in the response's extensions, and axum's own answers (405) get one.
async fn shape_errors(req: Request, next: Next) -> Response {
    let api = api_of(req.uri().path());
    let resp = next.run(req).await;
    if let Some(err) = resp.extensions().get::<ApiError>() {
        return err.response(api);
    }
    if resp.status() == axum::http::StatusCode::METHOD_NOT_ALLOWED {
        return ApiError::new(resp.status(), "method not allowed on this endpoint").response(api);
    }
    resp
}

/// The credentials of a request: `Authorization: Bearer KEY` (the scheme name in any case, as RFC
/// 9110 says) or `x-api-key: KEY`.
fn given_key(headers: &axum::http::HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim_start().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(rest)
        });
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
}

/// Checks the API key (Bearer or `x-api-key`) on every path but `/health`.
async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = state.config().api_key.as_deref() {
        if req.uri().path() != "/health" {
            let given = given_key(req.headers());
            let ok = given.is_some_and(|g| keys_equal(g.trim().as_bytes(), key.as_bytes()));
            if !ok {
                let msg = if given.is_some() {
                    "invalid API key"
                } else {
                    "missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`"
                };
                return ApiError::unauthorized(msg).into_response();
            }
        }
    }
    next.run(req).await
}

/// Constant-time comparison: the time taken does not depend on where the first difference is.
/// (The length of the key is not secret.)
fn keys_equal(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Counts each answered request by endpoint (the route, not the raw path) and status.
async fn count(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "other".to_string());
    let method = req.method().clone();
    let t0 = std::time::Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    state.metrics().request(&endpoint, status);
    // Streamed replies are logged when their headers go out; the body may still be running.
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if resp.status().is_server_error() {
        tracing::warn!(%method, endpoint, status, ms, "request failed");
    } else {
        tracing::debug!(%method, endpoint, status, ms, "request");
    }
    resp
}
