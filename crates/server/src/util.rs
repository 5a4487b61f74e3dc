//! llama-server's utility endpoints: `/tokenize`, `/detokenize`, `/health`, `/metrics`, and the
//! answer to unknown paths.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::fields;
use crate::state::AppState;

/// `/tokenize` body.
#[derive(Deserialize, Debug)]
pub struct TokenizeRequest {
    /// Text to tokenize.
    pub content: String,
    /// Prepend BOS as the model asks (llama-server's `add_special`, default false).
    pub add_special: Option<bool>,
    /// Parse special tokens written in the text (default true, as llama-server).
    pub parse_special: Option<bool>,
    /// Return `{"id", "piece"}` objects instead of bare ids.
    pub with_pieces: Option<bool>,
}

/// `/detokenize` body.
#[derive(Deserialize, Debug)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<i64>,
}

/// `POST /tokenize`.
pub async fn tokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: TokenizeRequest = fields::parse_body(body)?;
    let l = state.loaded()?;
    // Up to a whole request body of text: tokenized on the blocking pool, not an async worker.
    let tokens = tokio::task::spawn_blocking(move || {
        let tok = l.tok();
        let ids = tok.encode_with_specials(
            &req.content,
            req.add_special.unwrap_or(false),
            req.parse_special.unwrap_or(true),
        );
        if req.with_pieces.unwrap_or(false) {
            ids.iter()
                .map(|&id| {
                    let piece = tok.token_to_piece(id, true);
                    match std::str::from_utf8(piece) {
                        Ok(s) => json!({"id": id, "piece": s}),
                        Err(_) => json!({"id": id, "piece": piece}),
                    }
                })
                .collect::<Vec<Value>>()
        } else {
            ids.iter().map(|&id| json!(id)).collect()
        }
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?;
    Ok(Json(json!({"tokens": tokens})).into_response())
}

/// `POST /detokenize`: ids outside the vocabulary are refused.
pub async fn detokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = fields::parse_body(body)?;
    let l = state.loaded()?;
    let n_vocab = l.tok().vocab_size();
    let ids = fields::token_ids("tokens", &req.tokens, n_vocab)?;
    Ok(Json(json!({"content": l.tok().decode(&ids, true)})).into_response())
}

/// `GET /health`: 503 `{"status": "loading"}` until the model is loaded, then 200 `{"status": "ok"}`;
/// 503 `{"status": "error", "error": ...}` once the engine has failed and cannot serve any more.
pub async fn health(State(state): State<AppState>) -> Response {
    let (status, body) = match state.health() {
        Ok(()) => (StatusCode::OK, json!({"status": "ok"})),
        Err(_) if !state.is_ready() => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "loading"}),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "error", "error": e.message}),
        ),
    };
    (status, Json(body)).into_response()
}

/// `GET /metrics` in the Prometheus text format.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let stats = state.loaded().ok().map(|l| l.backend.stats());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state
            .metrics()
            .render(stats.as_ref(), Some(state.connections())),
    )
        .into_response()
}

/// Unknown paths: 404 in the shape of the API the path looks like.
pub async fn not_found(uri: Uri) -> Response {
    ApiError::not_found(format!("no endpoint {}", uri.path())).into_response()
}
