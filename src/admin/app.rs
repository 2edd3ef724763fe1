//! The page's frame of requests: the router, and who is looking (with their CSRF token).
//! The pages are in `pages.rs`, the actions in `actions.rs`.

use std::sync::Arc;

use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::page::Frame;
use super::{Access, AdminStore, Machines, Resolver, Viewer, actions, pages};
use crate::Error;
use crate::flow::Flows;
use crate::idempotency::Records;

/// The operators' page over a store: build it, then mount [`router`](Self::router).
pub struct Admin<S: AdminStore> {
    pub(super) store: S,
    pub(super) flows: Option<Flows<S>>,
    pub(super) records: Option<Records<S>>,
    pub(super) machines: Machines<S>,
    pub(super) resolver: Resolver,
    /// The key of the viewers' CSRF tokens: random for each page built, unless given.
    secret: Vec<u8>,
}

impl<S: AdminStore> std::fmt::Debug for Admin<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("machines", &self.machines.keys().collect::<Vec<_>>())
            .field("flows", &self.flows.is_some())
            .field("records", &self.records.is_some())
            .finish_non_exhaustive()
    }
}

pub(super) type App<S> = Arc<Admin<S>>;

/// How many rows a list shows.
pub(super) const PAGE: u32 = super::ops::LIST_MAX;

impl<S: AdminStore> Admin<S> {
    /// The page over `store`, showing its outbox, timers and audit trail; add the flows
    /// ([`flows`](Self::flows)), the machines ([`machine`](Self::machine)) and who may
    /// look ([`access`](Self::access): until then every request is refused).
    pub fn new(store: S) -> Self {
        let mut secret = [0u8; 32];
        secret[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        secret[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Admin {
            store,
            flows: None,
            records: None,
            machines: Machines::new(),
            resolver: Arc::new(|_: &Parts| Viewer::none()),
            secret: secret.to_vec(),
        }
    }

    /// The router to nest under a path of the application's choice.
    pub fn router(self) -> axum::Router {
        axum::Router::new()
            .route("/", get(pages::overview::<S>))
            .route("/outbox", get(pages::dead_events::<S>))
            .route("/flows", get(pages::parked_flows::<S>))
            .route("/timers", get(pages::dead_timers::<S>))
            .route("/entity", get(pages::entity::<S>))
            .route("/search", get(pages::search::<S>))
            .route("/records", get(pages::stuck_records::<S>))
            .route("/graph", get(pages::graph::<S>))
            .route("/audit", get(pages::audit::<S>))
            .route("/requeue", post(actions::requeue::<S>))
            .route("/requeue-matching", post(actions::requeue_matching::<S>))
            .route("/resume", post(actions::resume::<S>))
            .route("/rearm", post(actions::rearm::<S>))
            .route("/cancel-timer", post(actions::cancel_timer::<S>))
            .route("/release", post(actions::release::<S>))
            .with_state(Arc::new(self))
    }

    /// The CSRF token of `who`: an HMAC of their name under this page's key.
    pub(super) fn csrf(&self, who: &str) -> String {
        hex::encode(self.mac(who).finalize().into_bytes())
    }

    fn mac(&self, who: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes any key");
        mac.update(who.as_bytes());
        mac
    }

    /// The signature of a notice this page shows after an action.
    pub(super) fn sign(&self, notice: &str) -> String {
        self.csrf(&format!("notice\u{0}{notice}"))
    }

    /// Whether `sig` is this page's signature of `notice`.
    pub(super) fn signed(&self, notice: &str, sig: &str) -> bool {
        self.csrf_holds(&format!("notice\u{0}{notice}"), sig)
    }

    /// The same page with the key of its CSRF tokens (and notices) set, so that every
    /// replica of the service accepts the forms any of them drew. At least 32 bytes,
    /// kept secret; [`Error::InvalidInput`] otherwise. By default a random key is drawn
    /// for each page built.
    pub fn csrf_key(mut self, key: &[u8]) -> crate::Result<Self> {
        if key.len() < 32 {
            return Err(Error::InvalidInput(
                "a CSRF key is at least 32 bytes".into(),
            ));
        }
        self.secret = key.to_vec();
        Ok(self)
    }

    /// Whether `token` is `who`'s CSRF token (compared in constant time).
    pub(super) fn csrf_holds(&self, who: &str, token: &str) -> bool {
        hex::decode(token).is_ok_and(|bytes| self.mac(who).verify_slice(&bytes).is_ok())
    }
}

/// Who is looking at this request, and how to answer: the frame of the page, and
/// whether JSON was asked for (`?format=json`).
pub(super) struct Seen {
    pub(super) frame: Frame,
    pub(super) json: bool,
}

impl<S: AdminStore> FromRequestParts<App<S>> for Seen {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App<S>) -> Result<Self, Response> {
        let viewer = (app.resolver)(parts);
        if viewer.access == Access::None {
            return Err(refused("this page is not yours to see"));
        }
        let path = parts.uri.path();
        let original = parts
            .extensions
            .get::<OriginalUri>()
            .map_or(path, |o| o.0.path());
        // The mount point: the original path less the router's own.
        let mount = original
            .strip_suffix(path)
            .unwrap_or_else(|| original.trim_end_matches('/'));
        let mount = mount.trim_end_matches('/');
        let base = format!("{mount}/");
        let home = if mount.is_empty() {
            "/".to_string()
        } else {
            mount.to_string()
        };
        let json = parts
            .uri
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "format=json"));
        Ok(Seen {
            frame: Frame {
                base,
                home,
                csrf: app.csrf(&viewer.who),
                who: viewer.who,
                access: viewer.access,
            },
            json,
        })
    }
}

/// 403, with why.
pub(super) fn refused(why: &str) -> Response {
    (StatusCode::FORBIDDEN, why.to_string()).into_response()
}

/// The answer to a failed read: 503 for what may pass, 500 otherwise; the error as text.
pub(super) fn failed(e: &Error) -> Response {
    let status = if e.is_retryable() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    (status, e.to_string()).into_response()
}
