//! The layer's service: the claim, the handler on its own task, the keeping of its
//! response, and the replay.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, LengthLimitError, Limited};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tower_service::Service;
use tracing::Instrument;

use super::key::{self, KeyProblem};
use super::problem::Problem;
use super::stored::StoredResponse;
use super::{Config, IDEMPOTENT_REPLAYED, InFlight, KeyRule, LayerBody, RoutePolicy};
use crate::error::Error;
use crate::error::Result;
use crate::idempotency::{Claim, Claimed, RecordStore, Records, Stored};
use crate::support::trace::{TRACEPARENT, TRACESTATE, TraceContext};

/// The layer's service around `Inner`.
#[derive(Clone)]
pub struct Idempotent<Inner, S> {
    pub(super) inner: Inner,
    pub(super) config: Arc<Config<S>>,
}

/// What a handler of a checked request finds in its extensions: the key, and a way to
/// keep its response in the handler's own transaction, so that a replay can never
/// disagree with what committed.
#[derive(Clone)]
pub struct IdempotentRequest<S: RecordStore> {
    records: Records<S>,
    held: Claimed,
    client_key: String,
    completed: Arc<AtomicBool>,
}

impl<S: RecordStore> IdempotentRequest<S> {
    /// The client's key.
    pub fn key(&self) -> &str {
        &self.client_key
    }

    /// How many times this key has been claimed, this request included.
    pub fn attempt(&self) -> i32 {
        self.held.attempt()
    }

    /// Keeps `status`, `headers` and `body` as the key's response inside the caller's
    /// transaction on `conn`: it commits or rolls back with the handler's writes. The
    /// handler then returns that same response; the layer leaves the record alone (if
    /// the transaction rolled back, it releases the record, and a repeat runs again).
    pub async fn complete_in(
        &self,
        conn: &mut S::Conn,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<()> {
        let stored = StoredResponse::new(status, headers, Some(body));
        self.records.complete_in(conn, &self.held, &stored).await?;
        self.completed.store(true, Ordering::SeqCst);
        Ok(())
    }
}

impl<Inner, S, ReqB, ResB> Service<Request<ReqB>> for Idempotent<Inner, S>
where
    Inner: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    S: RecordStore,
    ReqB: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<LayerBody<ResB>>;
    type Error = Inner::Error;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The clone that was polled ready serves this request.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        Box::pin(handle(self.config.clone(), ready, request))
    }
}

/// What the claim is judged on besides the key: a different request under the same key
/// (another method, path, query or body) is a mismatch.
#[derive(Serialize)]
struct Fingerprint {
    method: String,
    target: String,
    body_sha256: String,
}

async fn handle<Inner, S, ReqB, ResB>(
    config: Arc<Config<S>>,
    mut inner: Inner,
    request: Request<ReqB>,
) -> std::result::Result<Response<LayerBody<ResB>>, Inner::Error>
where
    Inner: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    S: RecordStore,
    ReqB: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut parts, body) = request.into_parts();
    if let Some(trace) = trace_context(&parts.headers) {
        parts.extensions.insert(trace);
    }
    let route = (config.route_of)(&parts).unwrap_or_else(|| parts.uri.path().to_string());
    let Some(policy) = config.policy(&parts.method, &route) else {
        let response = inner.call(Request::from_parts(parts, body)).await?;
        return Ok(response.map(Either::Left));
    };
    let client_key = match key::client_key(&parts.headers) {
        Ok(k) => k,
        Err(KeyProblem::Missing) if policy.key == KeyRule::Optional => {
            let response = inner.call(Request::from_parts(parts, body)).await?;
            return Ok(response.map(Either::Left));
        }
        Err(KeyProblem::Missing) => return Ok(problem(Problem::KeyMissing)),
        Err(KeyProblem::Malformed(why)) => return Ok(problem(Problem::KeyMalformed(why))),
    };
    let bytes = match read_body(&parts.headers, body, config.max_request_body).await {
        Ok(bytes) => bytes,
        Err(p) => return Ok(problem(p)),
    };
    let principal = (config.principal)(&parts).unwrap_or_default();
    let method = parts.method.clone();
    let record_key = key::record_key(
        &principal,
        config
            .scope_by_route
            .then_some((method.as_str(), route.as_str())),
        &client_key,
    );
    let target = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |t| t.as_str())
        .to_string();
    let fingerprint = Fingerprint {
        method: method.as_str().to_string(),
        target,
        body_sha256: hex::encode(Sha256::digest(&bytes)),
    };
    // From the claim on, the request runs on a task of its own: a request dropped part
    // way (its client gone, even before the claim's answer came back) still ends with
    // its record completed or released, never held until its lease runs out. The task
    // runs in the caller's span, so the handler's spans (and a trace context taken from
    // the current span) stay in the request's trace.
    let work = config
        .tasks
        .clone()
        .spawn(Instrument::in_current_span(async move {
            let held = match claim(&config, &record_key, &fingerprint).await {
                Ok(Claim::Claimed(held)) => held,
                Ok(Claim::Replayed(stored)) => return Ok(replay(&stored)),
                Err(e) => return Ok(problem(problem_of(&e, &config, &method, &route))),
            };
            let handle = IdempotentRequest {
                records: config.records.clone(),
                held: held.clone(),
                client_key,
                completed: Arc::new(AtomicBool::new(false)),
            };
            parts.extensions.insert(handle.clone());
            let request = Request::from_parts(parts, ReqB::from(bytes));
            let records = config.records.clone();
            let released = held.clone();
            let started = Instant::now();
            let run = std::panic::AssertUnwindSafe(async {
                let response = inner.call(request).await;
                keep(&config, &held, &handle, policy, response).await
            });
            match futures_util::FutureExt::catch_unwind(run).await {
                Ok(answer) => {
                    config.timings.record(&method, &route, started.elapsed());
                    answer
                }
                Err(panic) => {
                    release(&records, &released).await;
                    std::panic::resume_unwind(panic)
                }
            }
        }));
    match work.await {
        Ok(answer) => answer,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Ok(problem(Problem::Unavailable)),
    }
}

/// The request's W3C trace context (its `traceparent` header, and its `tracestate`
/// headers joined as one list, left out if one of them does not read), for the handler to pass to the transitions whose events
/// carry it; none when `traceparent` is missing or does not read.
fn trace_context(headers: &HeaderMap) -> Option<TraceContext> {
    let traceparent = headers.get(TRACEPARENT)?.to_str().ok()?;
    // One header that is not text spoils the list: none of it is passed on.
    let states: Option<Vec<&str>> = headers
        .get_all(TRACESTATE)
        .iter()
        .map(|v| v.to_str().ok())
        .collect();
    let tracestate = states.filter(|s| !s.is_empty()).map(|s| s.join(","));
    TraceContext::from_values(Some(traceparent), tracestate.as_deref())
}

/// Keeps the handler's `response` as the route's policy says (or releases the record),
/// and answers with it.
async fn keep<S, ResB, E>(
    config: &Config<S>,
    held: &Claimed,
    handle: &IdempotentRequest<S>,
    policy: RoutePolicy,
    response: std::result::Result<Response<ResB>, E>,
) -> std::result::Result<Response<LayerBody<ResB>>, E>
where
    S: RecordStore,
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let response = match response {
        Ok(response) => response,
        Err(e) => {
            release(&config.records, held).await;
            return Err(e);
        }
    };
    if handle.completed.load(Ordering::SeqCst) {
        // Kept in the handler's transaction; if that rolled back, the record is still
        // held, and released here (if it committed, the release changes nothing).
        if let Err(e) = config.records.release(held).await
            && !matches!(e, Error::LeaseLost { .. })
        {
            tracing::warn!(error = %e, "releasing a record its handler completed failed");
        }
        return Ok(response.map(Either::Left));
    }
    let status = response.status();
    // An answer that says when to come back ("busy, retry after") is not the request's
    // answer: a repeat runs the request again.
    if !policy.keeps(status) || response.headers().contains_key(RETRY_AFTER) {
        release(&config.records, held).await;
        return Ok(response.map(Either::Left));
    }
    let (head, body) = response.into_parts();
    let fits = body
        .size_hint()
        .upper()
        .is_some_and(|n| n <= config.max_response_body as u64);
    let not_replayable = StoredResponse::new(status, &head.headers, None);
    if !fits {
        // Too large or streamed: delivered as it is, and recorded as not replayable.
        complete(&config.records, held, not_replayable).await;
        return Ok(Response::from_parts(head, Either::Left(body)));
    }
    // Bounded even if the body's size hint was wrong. (Its error is not kept: it need
    // not be `Send`.)
    let collected = Limited::new(body, config.max_response_body)
        .collect()
        .await
        .ok()
        .filter(|c| c.trailers().is_none());
    match collected {
        Some(collected) => {
            let bytes = collected.to_bytes();
            let stored = StoredResponse::new(status, &head.headers, Some(&bytes));
            complete(&config.records, held, stored).await;
            Ok(Response::from_parts(head, Either::Right(Full::new(bytes))))
        }
        None => {
            // The handler ran, but its response broke off, outgrew its size hint or
            // carried trailers: the record keeps the status as not replayable, and the
            // client is told.
            complete(&config.records, held, not_replayable).await;
            Ok(problem(Problem::ResponseBroken(status.as_u16())))
        }
    }
}

/// The request body, whole, or why not.
async fn read_body<B>(headers: &HeaderMap, body: B, limit: usize) -> Result<Bytes, Problem>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Problem::BodyTooLarge(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(Problem::BodyTooLarge(limit))
        }
        Err(_) => Err(Problem::BodyUnreadable),
    }
}

/// The claim, waiting for a twin in flight where the layer is told to.
async fn claim<S: RecordStore>(
    config: &Config<S>,
    key: &str,
    fingerprint: &Fingerprint,
) -> Result<Claim> {
    let until = match config.in_flight {
        InFlight::Conflict => None,
        InFlight::Wait(d) => Some(Instant::now() + d),
    };
    let mut pause = Duration::from_millis(10);
    loop {
        match config.records.claim(&config.scope, key, fingerprint).await {
            Err(Error::InFlight { retry_after, .. })
                if until.is_some_and(|u| Instant::now() + pause.min(retry_after) < u) =>
            {
                tokio::time::sleep(pause.min(retry_after)).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

fn replay<B>(stored: &Stored) -> Response<LayerBody<B>> {
    let parts = match stored {
        Stored::Succeeded(json) => serde_json::from_str::<StoredResponse>(json)
            .ok()
            .and_then(|s| s.parts()),
        Stored::Failed(_) => None,
    };
    let mut response = match parts {
        Some((status, headers, Some(body))) => {
            let mut response = Response::new(Either::Right(Full::new(body)));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
        Some((status, _, None)) => problem(Problem::NotReplayable(status.as_u16())),
        None => return problem(Problem::CorruptRecord),
    };
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

fn problem<B>(p: Problem) -> Response<LayerBody<B>> {
    p.response().map(Either::Right)
}

fn problem_of<S: RecordStore>(
    e: &Error,
    config: &Config<S>,
    method: &Method,
    route: &str,
) -> Problem {
    match e {
        Error::InFlight { retry_after, .. } => {
            let lease = config
                .records
                .scope_config(&config.scope)
                .map_or(*retry_after, |c| c.lease);
            Problem::InFlight(
                config
                    .timings
                    .retry_after(method, route, lease, *retry_after),
            )
        }
        Error::PayloadMismatch { .. } => Problem::KeyReused,
        Error::InvalidInput(_) => Problem::Internal,
        Error::CorruptRecord { .. } => Problem::CorruptRecord,
        e if e.is_retryable() => Problem::Unavailable,
        _ => Problem::Internal,
    }
}

async fn release<S: RecordStore>(records: &Records<S>, held: &Claimed) {
    if let Err(e) = records.release(held).await {
        tracing::warn!(error = %e, key = held.key(), "releasing an idempotency record failed; it is claimable again when its lease runs out");
    }
}

async fn complete<S: RecordStore>(records: &Records<S>, held: &Claimed, stored: StoredResponse) {
    if let Err(e) = records.complete(held, &stored).await {
        tracing::warn!(error = %e, key = held.key(), "keeping a response failed; the response is delivered, and the record is claimable again when its lease runs out");
    }
}
