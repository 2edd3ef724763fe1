//! The service's error answers: every one `application/problem+json` (RFC 9457), one
//! `type` per cause, with `Retry-After` wherever a retry is the answer. A cause the
//! Idempotency-Key layer also answers (a key missing, a request in flight) has the
//! layer's type, so a client that follows problem types meets one type per cause,
//! whoever answered.
//!
//! | status | type | cause | `Retry-After` |
//! |---|---|---|---|
//! | 400 | `urn:orderly:problem:idempotency-key-missing` | no `Idempotency-Key` | |
//! | 400 | `urn:shop:problem:invalid-request` | a field out of range, a bad reference, a body or path that does not read | |
//! | 402 | `urn:shop:problem:payment-declined` | the capture was declined; the authorization voided | |
//! | 404 | `urn:shop:problem:not-found` | no such order, no such route | |
//! | 405 | `urn:shop:problem:method-not-allowed` | a route that takes other methods | |
//! | 409 | `urn:orderly:problem:idempotency-key-in-flight` | the same order or payment is being processed | when it is likely done |
//! | 409 | `urn:shop:problem:invalid-transition` | the order is not in a state that allows it (`state`, `event`) | |
//! | 409 | `urn:shop:problem:paid-by-another-payment` | a second payment for a paid order (`paid_by`: refund this one) | |
//! | 409 | `urn:shop:problem:order-not-created` | the order's creation was undone (`error`) | |
//! | 413, 415, 422 | `urn:shop:problem:request-too-large`, `unsupported-media-type`, `unprocessable-request` | a body the framework refuses | |
//! | 422 | `urn:shop:problem:refused` | a guard refused (`code`) | |
//! | 422 | `urn:shop:problem:request-mismatch` | the same flow key with another input | |
//! | 500 | `urn:shop:problem:internal-error` | an error no retry cures | |
//! | 503 | `urn:shop:problem:service-unavailable` | the database could not be reached, a deadline, contention | 1 s |

use std::time::Duration;

use axum::Json;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use orderly::Error;
use serde_json::{Map, Value, json};

/// The media type of every error answer.
const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer being built.
pub(crate) struct Problem {
    status: StatusCode,
    kind: String,
    title: &'static str,
    detail: String,
    extra: Map<String, Value>,
    retry_after: Option<u64>,
}

/// A problem of the shop's own: `kind` names its type, `urn:shop:problem:{kind}`.
pub(crate) fn problem(
    status: StatusCode,
    kind: &str,
    title: &'static str,
    detail: impl Into<String>,
) -> Problem {
    Problem {
        status,
        kind: format!("urn:shop:problem:{kind}"),
        title,
        detail: detail.into(),
        extra: Map::new(),
        retry_after: None,
    }
}

impl Problem {
    /// A member beside the standard ones (RFC 9457's extension members).
    pub(crate) fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(name.into(), value.into());
        self
    }

    /// Retry after `seconds`.
    fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// The same cause as the layer's answer of `kind`, under the layer's type.
    fn layers(mut self, kind: &str) -> Self {
        self.kind = format!("urn:orderly:problem:{kind}");
        self
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut body = json!({
            "type": self.kind,
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let Value::Object(members) = &mut body {
            members.extend(self.extra);
        }
        let mut response = (self.status, Json(body)).into_response();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// The request has no `Idempotency-Key` (served without the layer, which answers this
/// itself).
pub(crate) fn no_key() -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "",
        "Idempotency-Key required",
        "this request must carry an Idempotency-Key header",
    )
    .layers("idempotency-key-missing")
    .into_response()
}

/// A field of the request out of its range.
pub(crate) fn invalid(detail: impl Into<String>) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "invalid-request",
        "Invalid request",
        detail,
    )
    .into_response()
}

/// An error's answer: a client's mistake as 4xx (kept by the layer), a retryable error
/// as 503 with `Retry-After`, the rest as 500 (neither kept: a repeat runs again). A flow
/// another runner holds is 409 with `Retry-After` under the layer's in-flight type: the
/// client sent the same order or payment again (under another key) while the first
/// still runs; the layer does not keep an answer that carries `Retry-After`, so the
/// client's retry runs again and gets the first one's answer.
pub(crate) fn failed(e: Error) -> Response {
    let detail = e.to_string();
    let answer = match e {
        Error::NotFound { .. } => problem(StatusCode::NOT_FOUND, "not-found", "Not found", detail),
        Error::InvalidTransition { state, event, .. } => problem(
            StatusCode::CONFLICT,
            "invalid-transition",
            "Not allowed in the order's state",
            detail,
        )
        .with("state", state)
        .with("event", event),
        Error::RefConflict { existing_ref, .. } => paid_by_another(existing_ref),
        Error::InvalidInput(_) => problem(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "Invalid request",
            detail,
        ),
        Error::PayloadMismatch { .. } => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "request-mismatch",
            "Another request under the same identity",
            detail,
        ),
        Error::Refused { code, message, .. } => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "refused",
            "Refused",
            message,
        )
        .with("code", code),
        Error::InFlight { retry_after, .. } => {
            // The flow's lease is the latest it can still run; an order or a payment is
            // done in about a second.
            let after = retry_after.min(Duration::from_secs(1)).as_secs().max(1);
            problem(
                StatusCode::CONFLICT,
                "",
                "Request in progress",
                "the same request is already being processed; retry after the delay in \
                 Retry-After",
            )
            .layers("idempotency-key-in-flight")
            .retry_after(after)
        }
        e if e.is_retryable() => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "service-unavailable",
            "Service unavailable",
            e.to_string(),
        )
        .retry_after(1),
        _ => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal-error",
            "Internal error",
            detail,
        ),
    };
    answer.into_response()
}

/// A second payment for an order another payment paid: refund this one.
pub(crate) fn paid_by_another(existing_ref: String) -> Problem {
    problem(
        StatusCode::CONFLICT,
        "paid-by-another-payment",
        "Paid by another payment",
        "the order is paid by another payment: refund this one",
    )
    .with("paid_by", existing_ref)
}

/// Middleware: an error answer that is not problem+json yet (the framework's own: a body
/// or path that does not read, a method a route does not take) becomes one, its text the
/// detail, its other headers (`Allow`) kept.
pub(crate) async fn as_problem(response: Response) -> Response {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes() == PROBLEM_JSON.as_bytes());
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let (kind, title) = match status {
        StatusCode::NOT_FOUND => ("not-found", "Not found"),
        StatusCode::METHOD_NOT_ALLOWED => ("method-not-allowed", "Method not allowed"),
        StatusCode::PAYLOAD_TOO_LARGE => ("request-too-large", "Request body too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ("unsupported-media-type", "Unsupported media type"),
        StatusCode::UNPROCESSABLE_ENTITY => ("unprocessable-request", "Unprocessable request"),
        s if s.is_client_error() => ("invalid-request", "Invalid request"),
        _ => ("internal-error", "Internal error"),
    };
    let detail = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let mut answer = problem(status, kind, title, detail).into_response();
    for (name, value) in &parts.headers {
        if name != CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            answer.headers_mut().insert(name.clone(), value.clone());
        }
    }
    answer
}

/// The answer to a route that does not exist.
pub(crate) async fn no_route() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "not-found",
        "Not found",
        "no such route",
    )
    .into_response()
}
