//! The one error type of the server. It knows which API the request came through and renders
//! itself in that API's error shape, with the status code the failure calls for.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_engine::SubmitError;
use serde_json::{json, Value};

/// The API family a request belongs to; decides the shape of its error bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// OpenAI (`/v1/chat/completions`, `/v1/completions`, `/v1/models`) and the utility endpoints:
    /// `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// Anthropic (`/v1/messages`): `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
    /// Ollama (`/api/*`): `{"error": "message"}`.
    Ollama,
}

/// A failed request: status, message and the API whose shape the body takes.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// Whose error shape to use.
    pub api: Api,
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
    pub fn new(api: Api, status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            api,
            status,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or a value is out of range.
    pub fn bad_request(api: Api, message: impl Into<String>) -> ApiError {
        ApiError::new(api, StatusCode::BAD_REQUEST, message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(api: Api, param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::bad_request(api, message)
        }
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized(api: Api, message: impl Into<String>) -> ApiError {
        ApiError::new(api, StatusCode::UNAUTHORIZED, message)
    }

    /// 404: no such endpoint.
    pub fn not_found(api: Api, message: impl Into<String>) -> ApiError {
        ApiError::new(api, StatusCode::NOT_FOUND, message)
    }

    /// 503 while the model loads.
    pub fn loading(api: Api) -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(api, StatusCode::SERVICE_UNAVAILABLE, "the model is loading")
        }
    }

    /// 500: the backend failed after accepting the request.
    pub fn internal(api: Api, message: impl Into<String>) -> ApiError {
        ApiError::new(api, StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The HTTP answer to a refused submission.
    pub fn from_submit(api: Api, e: SubmitError) -> ApiError {
        let msg = e.to_string();
        match e {
            SubmitError::QueueFull { .. } => ApiError {
                retry_after: Some(1),
                ..ApiError::new(api, StatusCode::SERVICE_UNAVAILABLE, msg)
            },
            SubmitError::ShuttingDown => ApiError::new(api, StatusCode::SERVICE_UNAVAILABLE, msg),
            SubmitError::PromptTooLong { .. } | SubmitError::Invalid(_) => {
                ApiError::bad_request(api, msg)
            }
        }
    }

    /// A JSON body that did not parse or has a wrong type.
    pub fn from_json(api: Api, e: &serde_json::Error) -> ApiError {
        ApiError::bad_request(api, format!("invalid request body: {e}"))
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

    /// The body of this error in its API's shape.
    pub fn body(&self) -> Value {
        match self.api {
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
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}
