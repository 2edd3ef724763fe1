//! The layer's own answers, as `application/problem+json` (RFC 9457).

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body_util::Full;

/// What the layer answers without running the handler (or after it, where its response
/// cannot be replayed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// 400: the route requires a key and the request has none.
    KeyMissing,
    /// 400: the key is not one.
    KeyMalformed(&'static str),
    /// 413: the request body is over the layer's bound.
    BodyTooLarge(usize),
    /// 400: the request body could not be read.
    BodyUnreadable,
    /// 422: the key was used for another request.
    KeyReused,
    /// 409: the key's first request is still running.
    InFlight(Duration),
    /// 409: the key's request ran, but its response was too large or streamed to keep.
    NotReplayable(u16),
    /// 502: the handler ran, but its response broke off (or carried trailers).
    ResponseBroken(u16),
    /// 503: the records could not be reached; nothing ran.
    Unavailable,
    /// 500: the record holds what this layer never stores.
    CorruptRecord,
    /// 500: the records refused the claim for good (a database error no retry cures).
    Internal,
}

impl Problem {
    fn status(&self) -> StatusCode {
        match self {
            Problem::KeyMissing | Problem::KeyMalformed(_) | Problem::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Problem::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InFlight(_) | Problem::NotReplayable(_) => StatusCode::CONFLICT,
            Problem::ResponseBroken(_) => StatusCode::BAD_GATEWAY,
            Problem::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::CorruptRecord | Problem::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// `(type, title, detail)`.
    fn text(&self) -> (&'static str, &'static str, String) {
        match self {
            Problem::KeyMissing => (
                "idempotency-key-missing",
                "Idempotency-Key required",
                "this request must carry an Idempotency-Key header".into(),
            ),
            Problem::KeyMalformed(why) => (
                "idempotency-key-malformed",
                "Idempotency-Key malformed",
                (*why).into(),
            ),
            Problem::BodyTooLarge(limit) => (
                "request-too-large",
                "Request body too large",
                format!("an idempotent request's body is at most {limit} bytes"),
            ),
            Problem::BodyUnreadable => (
                "request-unreadable",
                "Request body unreadable",
                "the request body could not be read to its end".into(),
            ),
            Problem::KeyReused => (
                "idempotency-key-reused",
                "Idempotency-Key reused",
                "this key was used for a different request (method, path, query or body)".into(),
            ),
            Problem::InFlight(_) => (
                "idempotency-key-in-flight",
                "Request in progress",
                "a request with this key is still being processed; retry after the delay \
                 given in Retry-After"
                    .into(),
            ),
            Problem::NotReplayable(status) => (
                "response-not-replayable",
                "Response not replayable",
                format!(
                    "the request with this key was processed (status {status}), but its \
                     response was too large or streamed to be kept"
                ),
            ),
            Problem::ResponseBroken(status) => (
                "response-broken",
                "Response broken off",
                format!(
                    "the request was processed (status {status}), but its response could \
                     not be read to its end; a repeat of it is answered \
                     response-not-replayable"
                ),
            ),
            Problem::Unavailable => (
                "idempotency-unavailable",
                "Service unavailable",
                "the idempotency records could not be reached; nothing was done".into(),
            ),
            Problem::CorruptRecord => (
                "idempotency-record-corrupt",
                "Stored response unreadable",
                "the record of this key holds no response this service stored".into(),
            ),
            Problem::Internal => (
                "idempotency-failed",
                "Idempotency check failed",
                "the idempotency records refused the request; nothing was done".into(),
            ),
        }
    }

    /// The response: problem+json, with `Retry-After` where a retry will be answered.
    pub fn response(&self) -> Response<Full<Bytes>> {
        let status = self.status();
        let (kind, title, detail) = self.text();
        let body = serde_json::json!({
            "type": format!("urn:orderly:problem:{kind}"),
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
        });
        let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
        *response.status_mut() = status;
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let retry = match self {
            Problem::InFlight(after) => Some(after.as_secs_f64().ceil().max(1.0) as u64),
            Problem::Unavailable => Some(1),
            _ => None,
        };
        if let Some(seconds) = retry {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
