//! The page's router: each path to its page (`pages.rs`) or action (`actions.rs`).

use std::sync::Arc;

use axum::routing::{get, post};

use super::panel::Admin;
use super::{AdminStore, actions, pages};

impl<S: AdminStore> Admin<S> {
    /// The router to nest under a path of the application's choice.
    pub fn router(self) -> axum::Router {
        axum::Router::new()
            .route("/", get(pages::overview::<S>))
            .route("/outbox", get(pages::events::<S>))
            .route("/flows", get(pages::flows::<S>))
            .route("/timers", get(pages::timers::<S>))
            .route("/entity", get(pages::entity::<S>))
            .route("/event", get(pages::event::<S>))
            .route("/flow", get(pages::flow::<S>))
            .route("/timer", get(pages::timer::<S>))
            .route("/search", get(pages::search::<S>))
            .route("/records", get(pages::stuck_records::<S>))
            .route("/graph", get(pages::graph::<S>))
            .route("/audit", get(pages::audit::<S>))
            .route("/requeue", post(actions::requeue::<S>))
            .route("/discard", post(actions::discard::<S>))
            .route("/requeue-matching", post(actions::requeue_matching::<S>))
            .route("/discard-matching", post(actions::discard_matching::<S>))
            .route("/resume", post(actions::resume::<S>))
            .route("/rearm", post(actions::rearm::<S>))
            .route("/cancel-timer", post(actions::cancel_timer::<S>))
            .route("/release", post(actions::release::<S>))
            .with_state(Arc::new(self))
            .layer(axum::middleware::map_response(hardened))
    }

    /// [`router`](Self::router) nested at `path` (such as `/admin`), in a router to merge
    /// into the application's: `path` and `path/` (which a nest alone answers 404) both
    /// open the overview, the second by a permanent redirect to the first (`/` is the
    /// router itself).
    pub fn router_at(self, path: &str) -> axum::Router {
        let path = format!("/{}", path.trim_matches('/'));
        if path == "/" {
            return self.router();
        }
        let to = path.clone();
        let slash = axum::Router::new()
            .route(
                &format!("{path}/"),
                get(move || async move { axum::response::Redirect::permanent(&to) }),
            )
            .layer(axum::middleware::map_response(hardened));
        slash.nest(&path, self.router())
    }
}

/// Every answer with the page's hardening headers (`page::hardening`).
async fn hardened(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    for (name, value) in super::page::hardening() {
        headers.insert(name, axum::http::HeaderValue::from_static(value));
    }
    response
}
