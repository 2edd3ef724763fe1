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
//! | the key of a request still running | 409 with `Retry-After` (when the route's handler is likely done), or wait for it ([`InFlight::Wait`]) |
//! | a finished request whose response was too large or streamed to keep | 409, `response-not-replayable` |
//! | a response that broke off while it was read (or carried trailers) | 502, `response-broken` |
//! | the records unreachable | 503 with `Retry-After`; the handler did not run |
//!
//! A key lives as long as the scope's retention ([`ScopeConfig`](crate::ScopeConfig)),
//! counted from the request's last write; after it the key is new again. The lease must
//! outlast the slowest handler: a request still running when its lease runs out can be
//! claimed by a repeat. See `docs/http.md`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Method, StatusCode};
use http_body_util::{Either, Full};
use tower_layer::Layer;

use crate::error::Error;
use crate::error::Result;
use crate::idempotency::{RecordStore, Records};

mod key;
mod problem;
mod service;
mod stored;
mod timing;

pub use key::{IDEMPOTENCY_KEY, MAX_CLIENT_KEY};
pub use service::{Idempotent, IdempotentRequest};

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

/// How a checked route treats keys and which responses it keeps. A response that
/// carries `Retry-After` (a handler's "busy, come back later": 409, 429 or 503) is never
/// kept, whatever its status: the record is released and a repeat runs again.
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
    /// The handler tasks the layer started.
    tasks: tokio_util::task::TaskTracker,
    /// How long each route's handler takes: what a repeat in flight is told to wait.
    timings: timing::Timings,
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
                tasks: tokio_util::task::TaskTracker::new(),
                timings: timing::Timings::default(),
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

    /// Waits until every handler this layer (or a clone of it) started has ended and its
    /// record was kept or released. A handler runs on a task of its own, so a request
    /// whose client hung up goes on after its connection closed, and a server's graceful
    /// shutdown (which waits for connections) can end before it: await this after the
    /// server stopped taking requests and before the runtime ends, so that no handler is
    /// cut off half way (its record held until its lease runs out). Handlers started
    /// after the call are waited for too.
    pub async fn handlers_finished(&self) {
        self.config.tasks.close();
        self.config.tasks.wait().await;
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
