//! The HTTP error type and the stable error codes: [`ErrorCode`] lists every
//! code with its status and a one-line description (the OpenAPI document's
//! `Error.code` enum and README's table are checked against it), [`ApiError`]
//! is what a handler returns, and the mappings from the runtime's and the
//! tenant crate's errors live here.

use std::fmt;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tensor_wasm_runtime::RuntimeError;
use tensor_wasm_tenant::{QuotaError, QuotaKind, Tenant};

/// Defines [`ErrorCode`] from one table, so that its variants, [`ErrorCode::ALL`]
/// and the per-code facts cannot drift apart.
macro_rules! error_codes {
    ($($variant:ident => $code:literal, $status:literal, $when:literal;)+) => {
        /// Every error code the API can answer: `code` in
        /// `{"error": {"code", "message"}}`. Codes are stable API; each has one status.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $(#[doc = $when] $variant,)+
        }

        impl ErrorCode {
            /// Every code, ordered by status: the order of the OpenAPI
            /// document's enum and of README's table.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),+];

            /// The code on the wire, e.g. `"bad_request"`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)+
                }
            }

            /// One line saying when the API answers this code.
            pub const fn description(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $when,)+
                }
            }

            const fn status_u16(self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)+
                }
            }
        }
    };
}

error_codes! {
    BadRequest => "bad_request", 400,
        "The request is malformed: invalid JSON, an unknown field, a bad query parameter or body.";
    InvalidModule => "invalid_module", 400,
        "The module is not valid WebAssembly (binary or WAT) or does not compile.";
    InvalidOnnx => "invalid_onnx", 400,
        "The uploaded model is not an ONNX model this server runs: malformed, an invalid graph, or an operator, attribute or data type the executor does not support (the message has the executor's code and names it).";
    UnsupportedFeature => "unsupported_feature", 400,
        "The module is valid WebAssembly but uses a feature the server refuses (more than one linear memory).";
    InvalidConfig => "invalid_config", 400,
        "A deploy option is well-formed but not allowed (e.g. a limit above the server's maximum).";
    InvalidArguments => "invalid_arguments", 400,
        "The arguments do not match the export's signature.";
    UnknownExport => "unknown_export", 400,
        "The module has no export of that name.";
    WrongStyle => "wrong_style", 400,
        "The route does not serve the function's invocation style (export call, WASI command or HTTP handler).";
    Unauthorized => "unauthorized", 401,
        "The bearer token is missing, malformed, unknown or revoked (sent with `WWW-Authenticate: Bearer`).";
    Forbidden => "forbidden", 403,
        "The token may not use this route: a tenant token on an admin route, or the admin token on a function route.";
    QuotaSizeExceeded => "quota_size_exceeded", 403,
        "A size quota refuses the request (e.g. a module larger than the tenant's `max_module_bytes`).";
    RawPtxNotGranted => "raw_ptx_not_granted", 403,
        "The tenant does not hold the raw-kernel capability (`raw_ptx`), which only the admin grants: deploys asking for it and invocations of its raw-kernel functions are refused.";
    NotFound => "not_found", 404,
        "No such function, snapshot, job, tenant or token (another tenant's ids included).";
    RouteNotFound => "route_not_found", 404,
        "No route has this path (see `/openapi.json`).";
    MethodNotAllowed => "method_not_allowed", 405,
        "The route does not accept this method.";
    RequestTimeout => "request_timeout", 408,
        "The request body did not arrive within the body-read timeout (`--body-read-timeout-ms`, default 60 s); the connection is closed.";
    Conflict => "conflict", 409,
        "The request conflicts with the current state (a tenant name taken, the snapshot a function starts from).";
    QuotaCountExceeded => "quota_count_exceeded", 409,
        "A count quota is reached (e.g. the tenant already has `max_functions` functions).";
    QuotaStorageExceeded => "quota_storage_exceeded", 409,
        "The tenant's modules and snapshots would take more than its stored-bytes quota (`max_stored_bytes`, server default 4 GiB); delete functions or snapshots first.";
    TenantDeleted => "tenant_deleted", 410,
        "The tenant was deleted while the request was in flight; nothing was created for it.";
    PayloadTooLarge => "payload_too_large", 413,
        "The request body is larger than the server's limit (default 64 MiB).";
    UnsupportedMediaType => "unsupported_media_type", 415,
        "The deploy body's `Content-Type` is neither a module (`application/wasm`) nor `application/json`.";
    SnapshotUnsupported => "snapshot_unsupported", 422,
        "The function cannot be snapshotted (e.g. a WASI command).";
    Busy => "busy", 429,
        "Every instance slot, or the kernel dispatcher, stayed saturated; retry after `Retry-After`.";
    RateLimited => "rate_limited", 429,
        "The tenant's request-rate quota is used up; retry after `Retry-After`.";
    QuotaExhausted => "quota_exhausted", 429,
        "A concurrency quota of the tenant (invocations, instances, memory, async jobs) is full; retry after `Retry-After`.";
    ClientGone => "client_gone", 499,
        "The client of a streaming invocation went away and the invocation was cancelled (seen in logs and metrics).";
    GuestTrap => "guest_trap", 500,
        "The guest trapped (unreachable, out-of-bounds access, stack overflow, ...).";
    MemoryLimitExceeded => "memory_limit_exceeded", 500,
        "The guest tried to grow its memory past the function's limit (for a component: its linear memories, GPU buffers and the bytes it handed the host together).";
    ResourceLimitExceeded => "resource_limit_exceeded", 500,
        "A component held more host resources at once than `--component-max-resources` allows (default 10000), or a `wasi:http` fields resource past `--component-max-field-bytes` (default 64 KiB).";
    FuelExhausted => "fuel_exhausted", 500,
        "The guest used up its fuel budget (servers started with `--fuel`).";
    OutputTooLarge => "output_too_large", 500,
        "A WASI command wrote more to stdout than the server's output cap.";
    SnapshotCorrupt => "snapshot_corrupt", 500,
        "A stored snapshot failed validation.";
    Internal => "internal", 500,
        "The server failed; the details are in its log, not in the response.";
    NotImplemented => "not_implemented", 501,
        "A capability this server does not have yet (the message says which).";
    HandlerFailed => "handler_failed", 502,
        "An HTTP-handler component returned, or failed, without giving a response, or answered with a `wasi:http` error code instead of one.";
    NotReady => "not_ready", 503,
        "The server is still loading its functions, or is closing its instance slots.";
    ShuttingDown => "shutting_down", 503,
        "The server is shutting down: open streams end and unfinished async jobs fail with this code.";
    StoreUnavailable => "store_unavailable", 503,
        "The shared store (PostgreSQL or object storage, `serve --store`) cannot be reached: the write was not made; retry after `Retry-After`. Invocations of functions the replica has loaded keep answering.";
    TooManyConnections => "too_many_connections", 503,
        "The server holds `--max-connections` connections; this one is answered and closed (retry after `Retry-After`).";
    InvocationTimeout => "invocation_timeout", 504,
        "The invocation ran past its deadline (`timeout_ms`, default 30 s).";
}

impl ErrorCode {
    /// The HTTP status this code is answered with.
    pub fn status(self) -> StatusCode {
        StatusCode::from_u16(self.status_u16()).expect("every status in the table is in 100..=999")
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The line before README's error-code table.
pub const README_TABLE_BEGIN: &str = "<!-- error-codes:begin -->";
/// The line after README's error-code table.
pub const README_TABLE_END: &str = "<!-- error-codes:end -->";

/// README's error-code table (`code | status | when`), one row per code of
/// [`ErrorCode::ALL`]: what sits between README's [`README_TABLE_BEGIN`] and
/// [`README_TABLE_END`] lines (a test keeps them equal).
pub fn markdown_table() -> String {
    let mut table = String::from("| code | status | when |\n| --- | --- | --- |\n");
    for code in ErrorCode::ALL {
        table.push_str(&format!(
            "| `{}` | {} | {} |\n",
            code.as_str(),
            code.status_u16(),
            code.description()
        ));
    }
    table
}

/// An error answered to a client as `{"error": {"code", "message"}}`.
///
/// `code` is stable API (listed in the OpenAPI document); `message` is for
/// humans and may change. Host-side details (paths, OS errors) go to the log,
/// never to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The stable code; it decides the status ([`ErrorCode::status`]).
    pub code: ErrorCode,
    pub message: String,
    /// Seconds after which a retry may succeed (sent as `Retry-After`).
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    /// An error with `code`, answered with the code's status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// `400 bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::BadRequest, message)
    }

    /// `503 store_unavailable` with `Retry-After`: the shared store cannot be reached.
    pub fn store_unavailable(message: impl Into<String>) -> Self {
        tracing::warn!("shared store unavailable");
        ApiError {
            retry_after_s: Some(1),
            ..ApiError::new(ErrorCode::StoreUnavailable, message)
        }
    }

    /// `429 busy` with `Retry-After`: instance slots or the kernel dispatcher are saturated.
    pub fn busy(message: impl Into<String>) -> Self {
        ApiError {
            retry_after_s: Some(1),
            ..ApiError::new(ErrorCode::Busy, message)
        }
    }

    /// `500 internal`; the detail is logged, the client sees a generic message.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        ApiError::new(
            ErrorCode::Internal,
            "internal server error (see the server log)",
        )
    }
}

impl From<RuntimeError> for ApiError {
    fn from(err: RuntimeError) -> Self {
        let message = err.to_string();
        match err {
            RuntimeError::InvalidModule(_) => ApiError::new(ErrorCode::InvalidModule, message),
            RuntimeError::InvalidConfig(_) => ApiError::new(ErrorCode::InvalidConfig, message),
            RuntimeError::UnsupportedFeature(_) => {
                ApiError::new(ErrorCode::UnsupportedFeature, message)
            }
            RuntimeError::FunctionNotFound(_) | RuntimeError::ModelNotFound(_) => {
                ApiError::new(ErrorCode::NotFound, message)
            }
            RuntimeError::InvalidOnnx(_) => ApiError::new(ErrorCode::InvalidOnnx, message),
            RuntimeError::NotImplemented(_) => ApiError::new(ErrorCode::NotImplemented, message),
            RuntimeError::UnknownExport(_) => ApiError::new(ErrorCode::UnknownExport, message),
            RuntimeError::InvalidArguments(_) => {
                ApiError::new(ErrorCode::InvalidArguments, message)
            }
            RuntimeError::WrongStyle(_) => ApiError::new(ErrorCode::WrongStyle, message),
            RuntimeError::Trap(_) => ApiError::new(ErrorCode::GuestTrap, message),
            RuntimeError::Timeout { .. } => ApiError::new(ErrorCode::InvocationTimeout, message),
            RuntimeError::MemoryLimit(_) => ApiError::new(ErrorCode::MemoryLimitExceeded, message),
            RuntimeError::ResourceLimit(_) => {
                ApiError::new(ErrorCode::ResourceLimitExceeded, message)
            }
            RuntimeError::FuelExhausted(_) => ApiError::new(ErrorCode::FuelExhausted, message),
            RuntimeError::OutputTooLarge(_) => ApiError::new(ErrorCode::OutputTooLarge, message),
            RuntimeError::Busy(_) => ApiError::busy(message),
            RuntimeError::ClientGone => ApiError::new(ErrorCode::ClientGone, message),
            RuntimeError::SnapshotNotFound(_) => ApiError::new(ErrorCode::NotFound, message),
            RuntimeError::SnapshotUnsupported(_) => {
                ApiError::new(ErrorCode::SnapshotUnsupported, message)
            }
            RuntimeError::SnapshotCorrupt { .. } => {
                tracing::error!(error = %message, "snapshot failed validation");
                ApiError::new(ErrorCode::SnapshotCorrupt, message)
            }
            RuntimeError::Conflict(_) => ApiError::new(ErrorCode::Conflict, message),
            RuntimeError::TenantRetired(_) => ApiError::new(ErrorCode::TenantDeleted, message),
            RuntimeError::RawPtxNotGranted(_) => {
                ApiError::new(ErrorCode::RawPtxNotGranted, message)
            }
            RuntimeError::StorageQuotaExceeded { .. } => {
                ApiError::new(ErrorCode::QuotaStorageExceeded, message)
            }
            RuntimeError::StoreUnavailable(_) => ApiError::store_unavailable(message),
            RuntimeError::FunctionQuotaExceeded { .. } => {
                ApiError::new(ErrorCode::QuotaCountExceeded, message)
            }
            RuntimeError::Storage { .. }
            | RuntimeError::CorruptRecord { .. }
            | RuntimeError::Engine(_) => ApiError::internal(err),
        }
    }
}

/// Maps a quota refusal to its status: rate and concurrency 429 with
/// `Retry-After`, size 403, count 409; the message names quota and limit.
pub(crate) fn quota_error(tenant: &Tenant, err: QuotaError) -> ApiError {
    let share = tenant.replica_share();
    let shared = matches!(err.kind, QuotaKind::Rate | QuotaKind::Concurrency) && share > 1;
    let message = format!(
        "tenant {}: {} (quota `{}` = {}{})",
        tenant.id(),
        err,
        err.quota,
        err.limit,
        if shared {
            format!(" on this replica: its share of the tenant's limit across {share} replicas")
        } else {
            String::new()
        }
    );
    let mut e = match err.kind {
        QuotaKind::Rate => ApiError::new(ErrorCode::RateLimited, message),
        QuotaKind::Concurrency => ApiError::new(ErrorCode::QuotaExhausted, message),
        QuotaKind::Size => ApiError::new(ErrorCode::QuotaSizeExceeded, message),
        QuotaKind::Count => ApiError::new(ErrorCode::QuotaCountExceeded, message),
    };
    if matches!(err.kind, QuotaKind::Rate | QuotaKind::Concurrency) {
        e.retry_after_s = Some(err.retry_after_s.unwrap_or(1).max(1));
    }
    e
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": { "code": self.code, "message": self.message }
        });
        let mut response = (self.code.status(), Json(body)).into_response();
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
    fn codes_are_unique_and_statuses_are_errors_in_order() {
        let mut seen = std::collections::HashSet::new();
        let mut last = 0;
        for code in ErrorCode::ALL {
            let text = code.as_str();
            assert!(seen.insert(text), "duplicate code {text}");
            assert!(
                !text.is_empty() && text.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{text:?} is not snake_case"
            );
            let status = code.status().as_u16();
            assert!((400..600).contains(&status), "{text}: {status}");
            assert!(status >= last, "{text} is out of status order");
            last = status;
            let when = code.description();
            assert!(
                when.ends_with('.') && !when.contains('\n') && !when.contains('|'),
                "{text}: the description must be one table-safe sentence"
            );
        }
    }

    #[tokio::test]
    async fn errors_keep_the_wire_format() {
        let response = ApiError::new(ErrorCode::Conflict, "taken").into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(
            &body[..],
            br#"{"error":{"code":"conflict","message":"taken"}}"#
        );
        assert_eq!(ErrorCode::ClientGone.status().as_u16(), 499);
        assert_eq!(ErrorCode::ClientGone.to_string(), "client_gone");
    }

    #[test]
    fn busy_carries_retry_after() {
        let response = ApiError::busy("full").into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }

    /// Where README's error-code block is, and whether it is [`markdown_table`]:
    /// `Err` says what is wrong and how to fix it.
    fn check_readme(readme: &str) -> Result<(), String> {
        let regenerate = "regenerate it with `UPDATE_README=1 cargo test -p tensor-wasm-api \
                          readme` (it renders tensor_wasm_api::error::markdown_table())";
        let (_, after_begin) = readme
            .split_once(&format!("{README_TABLE_BEGIN}\n"))
            .ok_or_else(|| format!("README.md has no `{README_TABLE_BEGIN}` line"))?;
        let (block, _) = after_begin
            .split_once(README_TABLE_END)
            .ok_or_else(|| format!("README.md has no `{README_TABLE_END}` after the table"))?;
        if block == markdown_table() {
            Ok(())
        } else {
            Err(format!(
                "README.md's error-code table differs from ErrorCode (src/error.rs): \
                 {regenerate}; expected:\n{}",
                markdown_table()
            ))
        }
    }

    /// README's text with its error-code block replaced by [`markdown_table`].
    fn regenerated(readme: &str) -> Option<String> {
        let begin = readme.find(README_TABLE_BEGIN)? + README_TABLE_BEGIN.len() + 1;
        let end = begin + readme[begin..].find(README_TABLE_END)?;
        Some(format!(
            "{}{}{}",
            &readme[..begin],
            markdown_table(),
            &readme[end..]
        ))
    }

    #[test]
    fn readme_error_table_is_rendered_from_the_enum() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
        let readme = std::fs::read_to_string(&path).expect("README.md");
        if std::env::var_os("UPDATE_README").is_some() {
            let updated = regenerated(&readme).expect("README.md has both markers");
            std::fs::write(&path, updated).expect("writing README.md");
            return;
        }
        if let Err(why) = check_readme(&readme) {
            panic!("{why}");
        }
    }

    #[test]
    fn the_readme_check_catches_stale_and_missing_tables() {
        let good = format!(
            "intro\n{README_TABLE_BEGIN}\n{}{README_TABLE_END}\nmore\n",
            markdown_table()
        );
        assert_eq!(check_readme(&good), Ok(()));
        assert_eq!(regenerated(&good).as_deref(), Some(good.as_str()));
        let stale = good.replace("| `busy` | 429 |", "| `busy` | 503 |");
        assert_ne!(stale, good);
        let why = check_readme(&stale).unwrap_err();
        assert!(why.contains("UPDATE_README=1"), "{why}");
        assert_eq!(regenerated(&stale).as_deref(), Some(good.as_str()));
        assert!(check_readme("no markers at all").is_err());
        assert!(check_readme(&good.replace(README_TABLE_END, "")).is_err());
    }
}
