//! What the runner, the engine of a held flow and the recovery job share: [`Flows`]
//! (the registered definitions and how flows run), [`FlowConfig`], a held flow, and the
//! erased definition the engine runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::outcome::FlowOutcome;
use super::{FlowStore, StepSpec};
use crate::coalesce::claims::Batched;
use crate::error::Result;
use crate::support::read_first::FirstRound;

/// How flows run.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowConfig {
    /// How long a runner holds a flow (renewed at every recorded point) before the
    /// recovery job may take it over. Longer than any one step takes.
    pub lease: Duration,
    /// How many times a flow is claimed without progress (a step retried, a runner that
    /// died) before it parks as [`ParkReason::AttemptsExhausted`](super::ParkReason::AttemptsExhausted); for a compensation,
    /// before that compensation is given up.
    pub attempts: u32,
    /// The wait before the first retry of a step; it doubles with each retry.
    pub backoff: Duration,
    /// The longest wait between retries.
    pub max_backoff: Duration,
    /// How long [`Flows::start`] and [`Flows::resume`] wait for the flow before they
    /// answer [`Error::DeadlineExceeded`](crate::Error::DeadlineExceeded) (`in_doubt`: the flow goes on). A flow runs on a
    /// task of its own: a caller that stops waiting (this deadline, a client timeout, a
    /// dropped future) leaves it to run to its end, and a re-send is answered
    /// [`Error::InFlight`](crate::Error::InFlight) while it runs, then its recorded outcome. Default 30 s.
    pub deadline: Duration,
}

crate::support::config::setters!(FlowConfig {
    lease: Duration,
    attempts: u32,
    backoff: Duration,
    max_backoff: Duration,
    deadline: Duration,
});

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            lease: Duration::from_secs(30),
            attempts: 5,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            deadline: Duration::from_secs(30),
        }
    }
}

/// A registered definition, its input type erased.
pub(super) trait Drive<S: FlowStore>: Send + Sync {
    fn specs(&self) -> &'static [StepSpec];
    fn pivot(&self) -> Option<usize>;
    /// Whether the input (JSON) is one this definition's actions take.
    fn check_input(&self, input: &str) -> Result<()>;
    /// Runs the held flow as far as it goes.
    fn drive<'a>(
        &'a self,
        flows: &'a Flows<S>,
        held: Held,
        fresh: bool,
    ) -> BoxFuture<'a, Result<FlowOutcome>>;
}

/// The registered definitions, by kind and version.
pub(super) type Registry<S> = HashMap<(&'static str, u32), Arc<dyn Drive<S>>>;

/// The flows of one store: definitions registered by `(kind, version)`. Cheap to clone.
#[derive(Clone)]
pub struct Flows<S: FlowStore> {
    pub(super) store: S,
    pub(super) config: FlowConfig,
    pub(super) defs: Arc<Registry<S>>,
    /// Recovery rounds begun (by every clone): where the next round starts.
    pub(super) rounds: Arc<AtomicUsize>,
    /// Whether a start reads the flow before its write (shared by clones).
    pub(super) first: FirstRound,
    /// The queue of concurrent starts, on a store that batches them (shared by clones).
    pub(super) starts: Option<Arc<Batched<S, super::starts::Owned, i32>>>,
    /// What the runner asks at each recorded point (the testing kit's faults).
    pub(super) hook: crate::support::hook::Slot,
}

impl<S: FlowStore> std::fmt::Debug for Flows<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flows")
            .field("config", &self.config)
            .field("defs", &self.defs.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A flow this runner holds: its claim minted `token`.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) kind: String,
    pub(crate) key: String,
    pub(crate) token: String,
    /// Claims since the flow last made progress, this one included.
    pub(crate) attempt: i32,
    /// The input (JSON), when the claim knows it; otherwise read with the record.
    pub(crate) input: Option<String>,
}

/// A duration in milliseconds, saturating.
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
