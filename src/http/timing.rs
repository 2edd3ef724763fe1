//! How long a route's handler takes, as this process has seen it: what `Retry-After`
//! tells a repeat that finds its key in flight.
//!
//! The rest of the lease is the latest a request can still be running, not when it is
//! likely done: a handler of 0.8 s under a 30 s lease would send its repeats away for
//! half a minute. So each route keeps a running mean and mean deviation of its handler
//! times (the handler, and the keeping of its response), and a repeat is told the
//! expected end of the request in flight: mean plus two deviations, less the time the
//! request has run, bounded by the rest of the lease. A route not seen yet says one
//! second (bounded the same way).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;

/// At most this many routes are timed: with the default route (the path) every order
/// id is a route of its own, and the map must not grow with them. Routes past it are
/// told the default.
const MAX_ROUTES: usize = 1024;

/// What an unknown route's repeat is told.
const UNSEEN: Duration = Duration::from_secs(1);

/// The weight of a new handler time in the running figures.
const WEIGHT: f64 = 0.2;

/// The handler times of every route, shared by the layer's clones.
#[derive(Clone, Default)]
pub(super) struct Timings(Arc<Mutex<HashMap<(Method, String), Timing>>>);

#[derive(Clone, Copy)]
struct Timing {
    mean: f64,
    deviation: f64,
}

impl Timings {
    /// Counts one handler time of `route`.
    pub(super) fn record(&self, method: &Method, route: &str, took: Duration) {
        let took = took.as_secs_f64();
        let Ok(mut routes) = self.0.lock() else {
            return;
        };
        let key = (method.clone(), route.to_string());
        if let Some(t) = routes.get_mut(&key) {
            let error = took - t.mean;
            t.mean += WEIGHT * error;
            t.deviation += WEIGHT * (error.abs() - t.deviation);
        } else if routes.len() < MAX_ROUTES {
            routes.insert(
                key,
                Timing {
                    mean: took,
                    deviation: took / 2.0,
                },
            );
        }
    }

    /// How long a repeat should wait for the request in flight on `route`, which holds
    /// its record for `remaining` of a `lease`: the route's expected handler time less
    /// what the request has run, within the rest of the lease.
    pub(super) fn retry_after(
        &self,
        method: &Method,
        route: &str,
        lease: Duration,
        remaining: Duration,
    ) -> Duration {
        let expected = self
            .0
            .lock()
            .ok()
            .and_then(|routes| routes.get(&(method.clone(), route.to_string())).copied())
            .map_or(UNSEEN, |t| {
                Duration::from_secs_f64((t.mean + 2.0 * t.deviation).max(0.0))
            });
        let ran = lease.saturating_sub(remaining);
        expected.saturating_sub(ran).min(remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    #[test]
    fn an_unseen_route_says_a_second() {
        let t = Timings::default();
        let after = t.retry_after(&Method::POST, "/a", LEASE, LEASE);
        assert_eq!(after, UNSEEN);
    }

    #[test]
    fn a_quick_route_is_told_its_handler_time_not_the_lease() {
        let t = Timings::default();
        for _ in 0..20 {
            t.record(&Method::POST, "/a", Duration::from_millis(800));
        }
        // Just claimed: about the handler's time.
        let after = t.retry_after(&Method::POST, "/a", LEASE, LEASE);
        assert!(after >= Duration::from_millis(790) && after < Duration::from_secs(2));
        // Half a second in: the rest of it.
        let after = t.retry_after(
            &Method::POST,
            "/a",
            LEASE,
            LEASE - Duration::from_millis(500),
        );
        assert!(after < Duration::from_millis(400), "{after:?}");
        // Another route is not this one.
        assert_eq!(t.retry_after(&Method::POST, "/b", LEASE, LEASE), UNSEEN);
    }

    #[test]
    fn never_past_the_lease() {
        let t = Timings::default();
        t.record(&Method::POST, "/slow", Duration::from_secs(120));
        let remaining = Duration::from_secs(3);
        assert_eq!(
            t.retry_after(&Method::POST, "/slow", LEASE, remaining),
            remaining
        );
    }

    #[test]
    fn routes_are_bounded() {
        let t = Timings::default();
        for i in 0..MAX_ROUTES + 10 {
            t.record(
                &Method::POST,
                &format!("/orders/{i}"),
                Duration::from_secs(5),
            );
        }
        assert_eq!(t.0.lock().unwrap().len(), MAX_ROUTES);
        let last = format!("/orders/{}", MAX_ROUTES + 5);
        assert_eq!(t.retry_after(&Method::POST, &last, LEASE, LEASE), UNSEEN);
    }
}
