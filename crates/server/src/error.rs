//! The one error type of the server: a status and a message, written in the error shape of the API
//! a request came through (the path decides, once, in the router).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_engine::SubmitError;
use serde_json::{json, Value};

/// The API family a request belongs to; decides the shape of its error bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// OpenAI (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/v1/models`) and the
    /// utility endpoints: `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// Anthropic (`/v1/messages`): `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
    /// Ollama (`/api/*`): `{"error": "message"}`.
    Ollama,
}

/// A failed request: status and message. It does not know its API: a handler returns it, and the
/// router's `shape_errors` layer writes it in the error shape of the API the
/// request's path belongs to; inside a stream, the renderer asks for [`ApiError::body`] in its own
/// API's shape.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// The request field at fault, when known (OpenAI's `param`).
    pub param: Option<String>,
    /// Seconds to put in `Retry-After` (busy server).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with the given status.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or a value is out of range.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::bad_request(message)
        }
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, message)
    }

    /// 404: no such endpoint or object.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// 503 while the model loads.
    pub fn loading() -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the model is loading")
        }
    }

    /// 503: the server cannot take the request now.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 500: the backend failed after accepting the request.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The HTTP answer to a refused submission.
    pub fn from_submit(e: SubmitError) -> ApiError {
        let msg = e.to_string();
        match e {
            SubmitError::QueueFull { .. } => ApiError {
                retry_after: Some(1),
                ..ApiError::unavailable(msg)
            },
            SubmitError::ShuttingDown | SubmitError::Unavailable(_) => ApiError::unavailable(msg),
            SubmitError::PromptTooLong { .. } | SubmitError::Invalid(_) => {
                ApiError::bad_request(msg)
            }
        }
    }

    /// A JSON body that did not parse or has a wrong type.
    pub fn from_json(e: &serde_json::Error) -> ApiError {
        ApiError::bad_request(format!("invalid request body: {e}"))
    }

    /// The `type` of an OpenAI error.
    fn openai_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The `type` of an Anthropic error.
    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            500..=599 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The body of this error in `api`'s shape.
    pub fn body(&self, api: Api) -> Value {
        match api {
            Api::OpenAi => {
                let code = match self.status.as_u16() {
                    401 => Value::from("invalid_api_key"),
                    413 => Value::from("request_too_large"),
                    503 => Value::from("unavailable"),
                    _ => Value::Null,
                };
                json!({"error": {
                    "message": self.message,
                    "type": self.openai_type(),
                    "param": self.param,
                    "code": code,
                }})
            }
            Api::Anthropic => json!({"type": "error", "error": {
                "type": self.anthropic_type(),
                "message": self.message,
            }}),
            Api::Ollama => json!({"error": self.message}),
        }
    }

    /// The whole response in `api`'s shape.
    pub fn response(&self, api: Api) -> Response {
        let mut resp = (self.status, axum::Json(self.body(api))).into_response();
        let headers = resp.headers_mut();
        if let Some(s) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            // RFC 9110 §11.6.1: a 401 names the scheme the client should use.
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"hearth\""),
            );
        }
        resp
    }
}

impl IntoResponse for ApiError {
    /// The OpenAI shape, with the error attached so that `shape_errors` can write it in
    /// the shape of the API the path belongs to.
    fn into_response(self) -> Response {
        let mut resp = self.response(Api::OpenAi);
        resp.extensions_mut().insert(self);
        resp
    }
}
