//! The API's errors: the command line's error envelope (`{"v", "error":
//! {"code", "message", "details"}}`, docs/json-output.md) with an HTTP
//! status. Errors of the library (a run that is not there, a verb that does
//! not fit the run) are classified by the embedder's [`Classify`], the same
//! function the command line reports its own errors with (like its
//! `CliError`s), so a code means one thing everywhere; the server's own
//! refusals are [`ApiError::new`]s.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A failure as reported: stable code, one-line message, evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorReport {
    /// The stable code.
    pub code: &'static str,
    /// The one-line message.
    pub message: String,
    /// The evidence.
    pub details: Value,
}

/// How the server reports an error of the library: the command line's
/// classifier, so the API's codes are the command line's.
pub type Classify = Arc<dyn Fn(&(dyn std::error::Error + 'static)) -> ErrorReport + Send + Sync>;

/// The library's own classifier (`warden::errors`, the mapping the
/// command line builds on), for embedders with no errors of their own:
/// the first typed error along the chain gives the code, anything else is
/// `invalid`.
pub fn library_classify() -> Classify {
    Arc::new(|error| {
        let mut cause = Some(error);
        while let Some(e) = cause {
            if let Some((code, details)) = warden::errors::classify(e) {
                return ErrorReport {
                    code,
                    message: chain(error),
                    details,
                };
            }
            cause = e.source();
        }
        ErrorReport {
            code: "invalid",
            message: chain(error),
            details: json!({}),
        }
    })
}

/// `error` and its sources on one line, as `anyhow` prints `{:#}`.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// A failed request: its report and the HTTP status it is sent with.
#[derive(Clone, Debug)]
pub struct ApiError {
    /// What is reported.
    pub report: ErrorReport,
    /// The status.
    pub status: StatusCode,
}

impl ApiError {
    /// An error of the server's own with `code` and `message`.
    pub fn new(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::from(ErrorReport {
            code,
            message: message.into(),
            details: json!({}),
        })
    }

    /// The same error carrying `details`.
    pub fn with_details(mut self, details: Value) -> ApiError {
        self.report.details = details;
        self
    }
}

impl From<ErrorReport> for ApiError {
    fn from(report: ErrorReport) -> ApiError {
        ApiError {
            status: status_of(report.code),
            report,
        }
    }
}

/// The HTTP status of a code: who is asking (401, 403, 429), what does not
/// exist (404), what was asked badly (400), a store or log that failed
/// (500), and otherwise a verb that does not fit the run as it is (409).
pub fn status_of(code: &str) -> StatusCode {
    match code {
        "unauthenticated" | "token_expired" => StatusCode::UNAUTHORIZED,
        "forbidden" | "host_refused" | "origin_refused" | "csrf_refused" => StatusCode::FORBIDDEN,
        "rate_limited" => StatusCode::TOO_MANY_REQUESTS,
        "method_not_allowed" => StatusCode::METHOD_NOT_ALLOWED,
        "not_found" | "unknown_run" | "unknown_session" | "unknown_key" | "unknown_rule"
        | "pruned" | "agent_not_served" => StatusCode::NOT_FOUND,
        "usage" | "invalid" | "invalid_run_id" | "invalid_session_id" | "input_rejected"
        | "input_too_large" | "input_required" | "input_not_expected" | "external_mismatch"
        | "output_rejected" | "value_too_deep" | "rule_invalid" | "invalid_labels" => {
            StatusCode::BAD_REQUEST
        }
        "store_failed" | "store_damaged" | "log_unreadable" | "log_invalid" | "tampered"
        | "io_failed" | "agent_unusable" | "agent_unknown" | "agent_invalid" | "plan_invalid"
        | "agent_unreadable" | "rule_unreadable" => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::CONFLICT,
    }
}

impl ApiError {
    /// The response to a request refused before its body was read. It
    /// says `Connection: close`: the server cannot tell where an unread
    /// body ends, so it closes the connection after answering, and a client
    /// that was not told would reuse the closed socket for its next request.
    pub fn into_refusal(self) -> Response {
        let mut response = self.into_response();
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "v": crate::contract::VERSION,
            "error": {
                "code": self.report.code,
                "message": self.report.message,
                "details": self.report.details,
            }
        });
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        ApiError::new(
            "usage",
            format!("the request's body: {}", rejection.body_text()),
        )
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> ApiError {
        ApiError::new(
            "usage",
            format!("the request's query: {}", rejection.body_text()),
        )
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> ApiError {
        ApiError::new(
            "usage",
            format!("the request's path: {}", rejection.body_text()),
        )
    }
}
