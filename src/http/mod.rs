//! The `Idempotency-Key` header as a tower layer (feature `http`), over
//! [`Records`]: a request with a key is claimed once, its response kept
//! and replayed to every repeat, marked `Idempotent-Replayed: true`. It serves any
//! tower service over the `http` and `http-body` types whose request body can be
//! rebuilt from bytes (axum's `Body`, `http_body_util::Full<Bytes>`).
//!
//! | the request | the answer |
//! |---|---|
//! | method and route not checked | passed through |
//! | no key where the route requires one | 400, problem+json |
//! | a malformed key (empty, over 200 characters, not printable ASCII, sent twice) | 400 |
//! | a body over [`IdempotencyLayer::max_request_body`] | 413 |
//! | a new key | the handler runs; its response kept (see [`RoutePolicy`]) |
//! | the key of a finished request, the same request | its response again, `Idempotent-Replayed: true` |
//! | the key of another request (method, path, query or body differ) | 422 |
//! | the key of a request still running | 409 with `Retry-After`, or wait for it ([`InFlight::Wait`]) |
//! | a finished request whose response was too large or streamed to keep | 409, `response-not-replayable` |
//! | a response that broke off while it was read (or carried trailers) | 502, `response-broken` |
//! | the records unreachable | 503 with `Retry-After`; the handler did not run |
//!
//! A key lives as long as the scope's retention ([`ScopeConfig`](crate::ScopeConfig)),
//! counted from the request's last write; after it the key is new again. The lease must
//! outlast the slowest handler: a request still running when its lease runs out can be
//! claimed by a repeat. See `docs/http.md`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HeaderValue};
use http::request::Parts;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, LengthLimitError, Limited};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tower_layer::Layer;
use tower_service::Service;

use crate::idempotency::{Claim, Claimed, RecordStore, Records, Stored};
use crate::{Error, Result};

mod key;
mod problem;
mod stored;

use key::KeyProblem;
pub use key::{IDEMPOTENCY_KEY, MAX_CLIENT_KEY};
use problem::Problem;
use stored::StoredResponse;

/// The header a replayed response carries.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The body of the layer's responses: the handler's own, or one the layer built (a
/// replay, a problem, a buffered response).
pub type LayerBody<B> = Either<B, Full<Bytes>>;

/// A closure over a request's head.
type OfParts = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// Whether a checked route requires a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRule {
    /// A request without a key is refused with 400.
    Required,
    /// A request without a key is passed through unchecked.
    Optional,
}

/// How a checked route treats keys and which responses it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutePolicy {
    /// Whether the key is required.
    pub key: KeyRule,
    /// Keep 4xx responses (replayed to repeats). Default `true`: a refused request stays
    /// refused.
    pub store_client_errors: bool,
    /// Keep 5xx responses. Default `false`: the record is released and a repeat runs
    /// the request again.
    pub store_server_errors: bool,
}

impl RoutePolicy {
    /// A key required; 2xx, 3xx and 4xx kept, 5xx retried.
    pub fn required() -> Self {
        RoutePolicy {
            key: KeyRule::Required,
            store_client_errors: true,
            store_server_errors: false,
        }
    }

    /// As [`required`](Self::required), but a request without a key passes unchecked.
    pub fn optional() -> Self {
        RoutePolicy {
            key: KeyRule::Optional,
            ..Self::required()
        }
    }

    fn keeps(&self, status: StatusCode) -> bool {
        if status.is_server_error() {
            self.store_server_errors
        } else if status.is_client_error() {
            self.store_client_errors
        } else {
            true
        }
    }
}

impl Default for RoutePolicy {
    fn default() -> Self {
        Self::required()
    }
}

/// What a request whose key is in flight gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// 409 at once, with `Retry-After`.
    Conflict,
    /// Waits up to this long for the first request to finish: then its kept response
    /// (if it was released instead, as a 5xx is, this request runs), or 409 if it still
    /// runs.
    Wait(Duration),
}

/// The longest wait [`InFlight::Wait`] accepts.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// The layer. Cheap to clone.
#[derive(Clone)]
pub struct IdempotencyLayer<S> {
    config: Arc<Config<S>>,
}

#[derive(Clone)]
struct Config<S> {
    records: Records<S>,
    scope: String,
    methods: HashMap<Method, RoutePolicy>,
    routes: HashMap<(Method, String), Option<RoutePolicy>>,
    route_of: OfParts,
    principal: OfParts,
    scope_by_route: bool,
    max_request_body: usize,
    max_response_body: usize,
    in_flight: InFlight,
}

impl<S: RecordStore> IdempotencyLayer<S> {
    /// A layer keeping its records in `scope` of `records` (added there with
    /// [`Records::scope`]; an unknown scope is [`Error::InvalidInput`]). By default POST
    /// and PATCH require a key on every route; the route is the request's path; every
    /// request has the same principal; request and response bodies are kept up to
    /// 1 MiB; a key in flight is answered 409.
    pub fn new(records: Records<S>, scope: &str) -> Result<Self> {
        if records.scope_config(scope).is_none() {
            return Err(Error::InvalidInput(format!(
                "unknown scope {scope:?}: add it with Records::scope"
            )));
        }
        let required = RoutePolicy::required();
        Ok(IdempotencyLayer {
            config: Arc::new(Config {
                records,
                scope: scope.to_string(),
                methods: HashMap::from([(Method::POST, required), (Method::PATCH, required)]),
                routes: HashMap::new(),
                route_of: Arc::new(|parts: &Parts| Some(parts.uri.path().to_string())),
                principal: Arc::new(|_: &Parts| None),
                scope_by_route: false,
                max_request_body: 1 << 20,
                max_response_body: 1 << 20,
                in_flight: InFlight::Conflict,
            }),
        })
    }

    fn with(mut self, change: impl FnOnce(&mut Config<S>)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// How requests of `method` are checked on every route not named by
    /// [`route`](Self::route); `None`: not at all.
    pub fn method(self, method: Method, policy: Option<RoutePolicy>) -> Self {
        self.with(|c| match policy {
            Some(p) => {
                c.methods.insert(method, p);
            }
            None => {
                c.methods.remove(&method);
            }
        })
    }

    /// How requests of `method` on `route` (as [`route_of`](Self::route_of) names it)
    /// are checked; `None`: not at all.
    pub fn route(self, method: Method, route: &str, policy: Option<RoutePolicy>) -> Self {
        self.with(|c| {
            c.routes.insert((method, route.to_string()), policy);
        })
    }

    /// Names a request's route: its template rather than its path, so that one policy
    /// covers `/orders/{id}/pay` (under axum, read `axum::extract::MatchedPath` from the
    /// extensions, with the layer added by `route_layer`). `None`: the path.
    pub fn route_of(
        self,
        route_of: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.with(|c| c.route_of = Arc::new(route_of))
    }

    /// Names a request's principal (what an authentication layer put in the extensions,
    /// say): keys of different principals never meet. `None`: the anonymous principal.
    pub fn principal(
        self,
        principal: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.with(|c| c.principal = Arc::new(principal))
    }

    /// Scopes keys by method and route too: the same key on another route is another
    /// request. Off by default: a key used again on another route (or path) is refused
    /// with 422.
    pub fn scope_by_route(self, yes: bool) -> Self {
        self.with(|c| c.scope_by_route = yes)
    }

    /// The largest request body a checked request may have (it is read whole, to
    /// fingerprint it); larger is refused with 413. Default 1 MiB.
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.with(|c| c.max_request_body = bytes)
    }

    /// The largest response body kept for replay. A larger (or streamed) response is
    /// delivered as it is, and its repeats are answered 409 `response-not-replayable`.
    /// Default 1 MiB.
    pub fn max_response_body(self, bytes: usize) -> Self {
        self.with(|c| c.max_response_body = bytes)
    }

    /// What a request whose key is in flight gets; a wait over a minute is
    /// [`Error::InvalidInput`].
    pub fn in_flight(self, in_flight: InFlight) -> Result<Self> {
        if let InFlight::Wait(d) = in_flight
            && d > MAX_WAIT
        {
            return Err(Error::InvalidInput("in_flight wait over a minute".into()));
        }
        Ok(self.with(|c| c.in_flight = in_flight))
    }
}

impl<S> Config<S> {
    fn policy(&self, method: &Method, route: &str) -> Option<RoutePolicy> {
        match self.routes.get(&(method.clone(), route.to_string())) {
            Some(policy) => *policy,
            None => self.methods.get(method).copied(),
        }
    }
}

impl<S: RecordStore, Inner> Layer<Inner> for IdempotencyLayer<S> {
    type Service = Idempotent<Inner, S>;

    fn layer(&self, inner: Inner) -> Self::Service {
        Idempotent {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The layer's service around `Inner`.
#[derive(Clone)]
pub struct Idempotent<Inner, S> {
    inner: Inner,
    config: Arc<Config<S>>,
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
struct Fingerprint<'a> {
    method: &'a str,
    target: &'a str,
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
    let method = parts.method.as_str().to_string();
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
        method: &method,
        target: &target,
        body_sha256: hex::encode(Sha256::digest(&bytes)),
    };
    let held = match claim(&config, &record_key, &fingerprint).await {
        Ok(Claim::Claimed(held)) => held,
        Ok(Claim::Replayed(stored)) => return Ok(replay(&stored)),
        Err(e) => return Ok(problem(problem_of(&e))),
    };
    let handle = IdempotentRequest {
        records: config.records.clone(),
        held: held.clone(),
        client_key,
        completed: Arc::new(AtomicBool::new(false)),
    };
    parts.extensions.insert(handle.clone());
    let request = Request::from_parts(parts, ReqB::from(bytes));
    // The handler and the keeping of its response run on their own task: a request
    // dropped part way (its client gone) still ends with its record completed or
    // released, never held until its lease runs out.
    let work = tokio::spawn(async move {
        let records = config.records.clone();
        let released = held.clone();
        let run = std::panic::AssertUnwindSafe(async move {
            let response = inner.call(request).await;
            keep(&config, &held, &handle, policy, response).await
        });
        match futures_util::FutureExt::catch_unwind(run).await {
            Ok(answer) => answer,
            Err(panic) => {
                release(&records, &released).await;
                std::panic::resume_unwind(panic)
            }
        }
    });
    match work.await {
        Ok(answer) => answer,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Ok(problem(Problem::Unavailable)),
    }
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
    if !policy.keeps(status) {
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
    fingerprint: &Fingerprint<'_>,
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

fn problem_of(e: &Error) -> Problem {
    match e {
        Error::InFlight { retry_after, .. } => Problem::InFlight(*retry_after),
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
