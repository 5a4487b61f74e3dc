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

use crate::error::{Api, ApiError};
use crate::gen;
use crate::state::AppState;

const API: Api = Api::OpenAi;

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
    let req: TokenizeRequest = gen::parse_body(API, body)?;
    let l = state.loaded(API)?;
    let tok = l.tok();
    let ids = tok.encode_with_specials(
        &req.content,
        req.add_special.unwrap_or(false),
        req.parse_special.unwrap_or(true),
    );
    let tokens: Vec<Value> = if req.with_pieces.unwrap_or(false) {
        ids.iter()
            .map(|&id| {
                let piece = tok.token_to_piece(id, true);
                match std::str::from_utf8(piece) {
                    Ok(s) => json!({"id": id, "piece": s}),
                    Err(_) => json!({"id": id, "piece": piece}),
                }
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({"tokens": tokens})).into_response())
}

/// `POST /detokenize`: ids outside the vocabulary are refused.
pub async fn detokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = gen::parse_body(API, body)?;
    let l = state.loaded(API)?;
    let n_vocab = l.tok().vocab_size();
    let ids = req
        .tokens
        .iter()
        .map(|&id| {
            u32::try_from(id)
                .ok()
                .filter(|&i| (i as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        API,
                        "tokens",
                        format!("token id {id} is outside the vocabulary (size {n_vocab})"),
                    )
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(Json(json!({"content": l.tok().decode(&ids, true)})).into_response())
}

/// `GET /health`: 503 `{"status": "loading"}` until the model is loaded, then 200 `{"status": "ok"}`.
pub async fn health(State(state): State<AppState>) -> Response {
    if state.is_ready() {
        (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "loading"})),
        )
            .into_response()
    }
}

/// `GET /metrics` in the Prometheus text format.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let stats = state.loaded(API).ok().map(|l| l.backend.stats());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics().render(stats.as_ref()),
    )
        .into_response()
}

/// Unknown paths: 404 in the shape of the API the path looks like.
pub async fn not_found(uri: Uri) -> Response {
    let path = uri.path();
    ApiError::not_found(crate::api_of(path), format!("no endpoint {path}")).into_response()
}
