//! The HTTP error type: one variant per stable error code, each with its status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tensor_wasm_runtime::RuntimeError;

/// An error answered to a client as `{"error": {"code", "message"}}`.
///
/// `code` is stable API (listed in the OpenAPI document); `message` is for
/// humans and may change. Host-side details (paths, OS errors) go to the log,
/// never to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds after which a retry may succeed (sent as `Retry-After`).
    pub retry_after_s: Option<u32>,
}

/// Every error code the API can answer, with its status.
pub const ERROR_CODES: &[(&str, u16)] = &[
    ("bad_request", 400),
    ("invalid_module", 400),
    ("invalid_config", 400),
    ("invalid_arguments", 400),
    ("unknown_export", 400),
    ("wrong_style", 400),
    ("unauthorized", 401),
    ("forbidden", 403),
    ("quota_size_exceeded", 403),
    ("not_found", 404),
    ("route_not_found", 404),
    ("method_not_allowed", 405),
    ("conflict", 409),
    ("quota_count_exceeded", 409),
    ("payload_too_large", 413),
    ("snapshot_unsupported", 422),
    ("unsupported_media_type", 415),
    ("busy", 429),
    ("rate_limited", 429),
    ("quota_exhausted", 429),
    ("client_gone", 499),
    ("guest_trap", 500),
    ("memory_limit_exceeded", 500),
    ("fuel_exhausted", 500),
    ("output_too_large", 500),
    ("snapshot_corrupt", 500),
    ("internal", 500),
    ("not_ready", 503),
    ("shutting_down", 503),
    ("invocation_timeout", 504),
];

impl ApiError {
    /// An error with `code`, whose status comes from [`ERROR_CODES`].
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        let status = ERROR_CODES
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, s)| StatusCode::from_u16(*s).expect("valid status"))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        debug_assert!(
            ERROR_CODES.iter().any(|(c, _)| *c == code),
            "unlisted code {code}"
        );
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// `400 bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new("bad_request", message)
    }

    /// `429 busy` with `Retry-After`: instance slots or the kernel dispatcher are saturated.
    pub fn busy(message: impl Into<String>) -> Self {
        ApiError {
            retry_after_s: Some(1),
            ..ApiError::new("busy", message)
        }
    }

    /// `500 internal`; the detail is logged, the client sees a generic message.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        ApiError::new("internal", "internal server error (see the server log)")
    }
}

impl From<RuntimeError> for ApiError {
    fn from(err: RuntimeError) -> Self {
        let message = err.to_string();
        match err {
            RuntimeError::InvalidModule(_) => ApiError::new("invalid_module", message),
            RuntimeError::InvalidConfig(_) => ApiError::new("invalid_config", message),
            RuntimeError::FunctionNotFound(_) => ApiError::new("not_found", message),
            RuntimeError::UnknownExport(_) => ApiError::new("unknown_export", message),
            RuntimeError::InvalidArguments(_) => ApiError::new("invalid_arguments", message),
            RuntimeError::WrongStyle(_) => ApiError::new("wrong_style", message),
            RuntimeError::Trap(_) => ApiError::new("guest_trap", message),
            RuntimeError::Timeout { .. } => ApiError::new("invocation_timeout", message),
            RuntimeError::MemoryLimit(_) => ApiError::new("memory_limit_exceeded", message),
            RuntimeError::FuelExhausted(_) => ApiError::new("fuel_exhausted", message),
            RuntimeError::OutputTooLarge(_) => ApiError::new("output_too_large", message),
            RuntimeError::Busy(_) => ApiError::busy(message),
            RuntimeError::ClientGone => ApiError::new("client_gone", message),
            RuntimeError::SnapshotNotFound(_) => ApiError::new("not_found", message),
            RuntimeError::SnapshotUnsupported(_) => ApiError::new("snapshot_unsupported", message),
            RuntimeError::SnapshotCorrupt { .. } => {
                tracing::error!(error = %message, "snapshot failed validation");
                ApiError::new("snapshot_corrupt", message)
            }
            RuntimeError::Conflict(_) => ApiError::new("conflict", message),
            RuntimeError::Storage { .. }
            | RuntimeError::CorruptRecord { .. }
            | RuntimeError::Engine(_) => ApiError::internal(err),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": { "code": self.code, "message": self.message }
        });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_statuses_are_errors() {
        let mut seen = std::collections::HashSet::new();
        for (code, status) in ERROR_CODES {
            assert!(seen.insert(code), "duplicate code {code}");
            assert!((400..600).contains(status));
        }
    }

    #[test]
    fn busy_carries_retry_after() {
        let response = ApiError::busy("full").into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }
}
