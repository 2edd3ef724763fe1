//! The runner: [`Flows`]' registration, reads and starts (the lock and the judgement of
//! a flow record); a held flow goes to the engine in `drive.rs`. The type itself, with
//! what the engine and the recovery job share, is in `flows.rs`.

use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::flows::{Drive, FlowConfig, Flows, Held, millis};
use super::outcome::{FlowOutcome, Started, is_live, recorded};
use super::steps::Definition;
use super::{Flow, FlowRow, FlowStore, StepRow, StepSpec};
use crate::coalesce::claims::{Batched, CoalescedClaims};
use crate::coalesce::queue::Entered;
use crate::engine::ReadFirst;
use crate::error::Error;
use crate::error::Result;
use crate::store::{ErrorClass, Lease, db_error};
use crate::support::input::{fingerprint_of, validate_reference};
use crate::support::read_first::FirstRound;

/// How many times a start reads and tries again when the flow changes under it.
const START_ROUNDS: u32 = 8;

/// A batch of coalesced starts that takes longer than this is dropped, and its starts go
/// the ordinary way.
const START_LIMIT: Duration = Duration::from_secs(5);

impl<S: FlowStore> Flows<S> {
    /// Flows on `store`, none registered yet. A lease under a millisecond or over 100
    /// years, no attempts, or a backoff of zero or over its maximum is
    /// [`Error::InvalidInput`].
    pub fn new(store: S, config: FlowConfig) -> Result<Self> {
        let span = crate::idempotency::MAX_SPAN;
        if config.lease < Duration::from_millis(1)
            || config.lease > span
            || config.attempts == 0
            || config.backoff.is_zero()
            || config.backoff > config.max_backoff
            || config.max_backoff > span
            || config.deadline.is_zero()
            || config.deadline > span
        {
            return Err(Error::InvalidInput(format!(
                "flow config {config:?}: the lease must be from 1 ms to 100 years, attempts \
                 positive, and the backoff positive and at most max_backoff (at most 100 years)"
            )));
        }
        Ok(Flows {
            config,
            defs: Arc::default(),
            rounds: Arc::default(),
            first: FirstRound::new(ReadFirst::Adaptive, S::READ_FIRST_FROM),
            starts: S::BATCHES_STARTS.then(|| Batched::new(store.clone(), START_LIMIT)),
            store,
            hook: crate::support::hook::Slot::default(),
        })
    }

    /// Whether concurrent starts are coalesced: while one start statement is in flight,
    /// the new flows that arrive are inserted together by the next, one statement and
    /// one commit (every backend's store can). A lone start goes at
    /// once, as without. Every start is answered as if it had gone alone. Default on.
    pub fn coalesce_starts(mut self, on: bool) -> Self {
        self.starts =
            (on && S::BATCHES_STARTS).then(|| Batched::new(self.store.clone(), START_LIMIT));
        self
    }

    /// How many starts went in statements of two or more.
    pub fn coalesced_starts(&self) -> CoalescedClaims {
        self.starts
            .as_ref()
            .map(|s| s.coalesced())
            .unwrap_or_default()
    }

    /// Registers a flow's actions. A definition with a step lacking its action, a
    /// `+ undo` step lacking its compensation, an action of the wrong class or attached
    /// twice, a step of another flow (told by its type, whatever its name and position),
    /// or a `(kind, version)` registered before is [`Error::InvalidInput`], naming every
    /// problem.
    pub fn register<I: DeserializeOwned + Send + Sync + 'static>(
        mut self,
        def: Definition<S, I>,
    ) -> Result<Self> {
        def.check()?;
        let id = (def.kind, def.version);
        if self.defs.contains_key(&id) {
            return Err(Error::InvalidInput(format!(
                "flow {} v{} is registered twice",
                id.0, id.1
            )));
        }
        Arc::make_mut(&mut self.defs).insert(id, Arc::new(def));
        Ok(self)
    }

    /// Which round trip a start begins with, as for a transition ([`ReadFirst`]): the
    /// start's write (a new flow costs one statement; a repeat the write that takes
    /// nothing, then a read) or a read of the flow (a repeat is answered by that read; a
    /// new flow pays it on top). The default, `Adaptive`, reads first while repeats make
    /// up enough of the recent starts through these flows. The answers are the same.
    pub fn read_first(mut self, policy: ReadFirst) -> Self {
        self.first = FirstRound::new(policy, S::READ_FIRST_FROM);
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// These flows, their runner asking `hook` at every recorded point.
    #[cfg(feature = "testing")]
    pub(crate) fn with_hook(mut self, hook: Arc<dyn crate::support::hook::Hook>) -> Self {
        self.hook = crate::support::hook::Slot(Some(hook));
        self
    }

    /// The steps and pivot of the definition registered for `(kind, version)`.
    #[cfg(feature = "testing")]
    pub(crate) fn declared(
        &self,
        kind: &str,
        version: i32,
    ) -> Option<(&'static [StepSpec], Option<usize>)> {
        self.def(kind, version).map(|d| (d.specs(), d.pivot()))
    }

    /// The configuration.
    pub fn config(&self) -> &FlowConfig {
        &self.config
    }

    pub(super) fn def(&self, kind: &str, version: i32) -> Option<&Arc<dyn Drive<S>>> {
        let version = u32::try_from(version).ok()?;
        self.defs
            .iter()
            .find(|((k, v), _)| *k == kind && *v == version)
            .map(|(_, d)| d)
    }

    /// Starts flow `D` under `key` with `input` (the outcome table is in
    /// `docs/flows.md`): a new flow runs its steps in order until it completes, is
    /// compensated, waits for a retry, or parks; a completed (or compensated, or parked)
    /// one with the same input answers its recorded outcome (`replayed`); the same key
    /// with another input is [`Error::PayloadMismatch`]; one running elsewhere under a
    /// live lease is [`Error::InFlight`]; one recorded under another version of `D` is
    /// [`Error::FlowVersion`]. A flow whose runner died (its lease ran out) is taken
    /// over and resumed.
    ///
    /// The flow runs on a task of its own: if this future is dropped part way, or
    /// [`FlowConfig::deadline`] passes ([`Error::DeadlineExceeded`]), the flow goes on to
    /// its end; a re-send meanwhile is [`Error::InFlight`]. If a step panics (or the
    /// runtime shuts down under it), the flow stays held until its lease runs out; then
    /// the recovery job (or the next start) resumes it.
    pub async fn start<D: Flow, P: Serialize + ?Sized>(
        &self,
        flow: D,
        key: &str,
        input: &P,
    ) -> Result<Started> {
        let span = tracing::info_span!(
            "orderly.flow",
            flow.kind = D::KIND,
            outcome = tracing::field::Empty,
            replayed = tracing::field::Empty,
        );
        let out = match serde_json::to_string(input) {
            Err(e) => Err(Error::InvalidInput(format!(
                "the input does not serialize: {e}"
            ))),
            Ok(json) => match fingerprint_of(input) {
                Err(e) => Err(e),
                Ok(hash) => {
                    let (flows, key) = (self.clone(), key.to_string());
                    let work = async move { flows.start_now(flow, &key, json, hash).await }
                        .instrument(span.clone());
                    off_task(self.config.deadline, work).await
                }
            },
        };
        let (outcome, replayed) = match &out {
            Ok(started) => (started.outcome.label(), started.replayed),
            Err(e) => (crate::observe::error_label(e), false),
        };
        span.record("outcome", outcome);
        span.record("replayed", replayed);
        crate::observe::flow(D::KIND, outcome, replayed);
        if let Ok(Started {
            outcome: FlowOutcome::Parked { reason, .. },
            replayed: false,
        }) = &out
        {
            crate::observe::flow_parked(D::KIND, (*reason).into());
        }
        out
    }

    async fn start_now<D: Flow>(
        &self,
        _flow: D,
        key: &str,
        json: String,
        hash: String,
    ) -> Result<Started> {
        let version = i32::try_from(D::VERSION)
            .map_err(|_| Error::InvalidInput(format!("flow {} version too large", D::KIND)))?;
        let def = self.def(D::KIND, version).cloned().ok_or_else(|| {
            Error::InvalidInput(format!(
                "flow {} v{} is not registered",
                D::KIND,
                D::VERSION
            ))
        })?;
        validate_reference("a flow key", key)?;
        def.check_input(&json)?;
        let lease_ms = millis(self.config.lease);
        if self.first.reads_first() {
            // A read that fails leaves the start's write to settle it.
            let row = self.read_flow(D::KIND, key).await.unwrap_or_else(|e| {
                tracing::debug!(error = %e, kind = D::KIND, key, "read before the start failed");
                None
            });
            if let Some(answer) = row.and_then(|r| judge(&r, &hash, version, def.specs())) {
                self.first.note(true);
                return answer;
            }
        }
        // One token for every round of this start: a round's write that committed after
        // its read (a batch that timed out, an acknowledgement lost) is recognised by a
        // later round's read as this start's own.
        let token = uuid::Uuid::new_v4().simple().to_string();
        for round in 0..START_ROUNDS {
            let new = super::NewFlow {
                kind: D::KIND,
                key,
                version,
                input_hash: &hash,
                input: &json,
                token: &token,
                lease_ms,
            };
            let alone = async {
                let mut lease = Lease::acquire_for_write(&self.store).await?;
                let out = self.store.start_flow(lease.conn(), &new).await;
                lease.release_after(&out);
                out
            };
            let started = async {
                match (round, &self.starts) {
                    (0, Some(starts)) => match starts.turn(|| super::starts::Owned::new(&new)) {
                        Entered::Alone(slot) => {
                            let out = alone.await;
                            slot.hand_on();
                            out
                        }
                        // Held by the batch's statement; or nothing written for it, or
                        // the batch failed (the sender dropped): the read below tells.
                        Entered::Queued(answer) => Ok(answer.await.ok().flatten()),
                    },
                    _ => alone.await,
                }
            };
            let held = |attempt| Held {
                kind: D::KIND.to_string(),
                key: key.to_string(),
                token: token.clone(),
                attempt,
                input: Some(json.clone()),
            };
            match started.await {
                // Attempt 1 is a new flow (a takeover counts on from the attempts before):
                // nothing is recorded yet, nothing to read.
                Ok(Some(attempt)) => {
                    self.first.note(false);
                    let outcome = def.drive(self, held(attempt), attempt == 1).await?;
                    return Ok(Started {
                        outcome,
                        replayed: false,
                    });
                }
                Ok(None) => {}
                // The start may have committed with its acknowledgement lost: the read
                // below recognises the flow as this start's own by its token.
                Err(e) if S::classify(&e) != ErrorClass::Fatal => {
                    tracing::debug!(error = %e, kind = D::KIND, key, "flow start failed; reading it");
                }
                Err(e) => return Err(db_error::<S>(e)),
            }
            let Some(row) = self.read_flow(D::KIND, key).await? else {
                continue;
            };
            if row.owner_token == token && row.park_reason.is_none() && is_live(&row.status) {
                let outcome = def.drive(self, held(row.attempt), false).await?;
                return Ok(Started {
                    outcome,
                    replayed: false,
                });
            }
            if let Some(answer) = judge(&row, &hash, version, def.specs()) {
                self.first.note(true);
                return answer;
            }
            // Its lease ran out between the start and the read: try again.
        }
        Err(Error::Contention {
            attempts: START_ROUNDS,
        })
    }

    pub(super) async fn read_flow(&self, kind: &str, key: &str) -> Result<Option<FlowRow>> {
        let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
        let out = self.store.read_flow(lease.conn(), kind, key).await;
        lease.release_after(&out);
        out.map_err(db_error::<S>)
    }

    pub(super) async fn read_steps(&self, kind: &str, key: &str) -> Result<Vec<StepRow>> {
        let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
        let out = self.store.read_steps(lease.conn(), kind, key).await;
        lease.release_after(&out);
        out.map_err(db_error::<S>)
    }
}

/// A start's answer from the flow as read, unless the start may claim it (its lease ran
/// out): another input, another version's flow still going, a recorded outcome (replayed),
/// or one running under a live lease.
fn judge(row: &FlowRow, hash: &str, version: i32, specs: &[StepSpec]) -> Option<Result<Started>> {
    if row.input_hash != hash {
        return Some(Err(Error::PayloadMismatch {
            subject: format!("flow {}", row.kind),
            reference: row.flow_key.clone(),
        }));
    }
    // A finished flow replays under any version (its outputs are by step name); anything
    // else of another version is that version's runners' to answer.
    let finished = matches!(row.status.as_str(), "COMPLETED" | "COMPENSATED");
    if row.version != version && !finished {
        return Some(Err(Error::FlowVersion {
            kind: row.kind.clone(),
            key: row.flow_key.clone(),
            version: row.version,
        }));
    }
    match recorded(row, specs) {
        Ok(Some(outcome)) => {
            return Some(Ok(Started {
                outcome,
                replayed: true,
            }));
        }
        Ok(None) => {}
        Err(e) => return Some(Err(e)),
    }
    (row.lease_left_ms > 0).then(|| {
        Err(Error::InFlight {
            scope: row.kind.clone(),
            key: row.flow_key.clone(),
            retry_after: Duration::from_millis(row.lease_left_ms.unsigned_abs()),
        })
    })
}

/// Runs `work` on a task of its own and waits for it at most `deadline`: past it, or if
/// the caller stops waiting, the work goes on to its end. A panic in it is the caller's
/// again (the task's is caught). Without a runtime to spawn on, it runs here.
pub(super) async fn off_task<T: Send + 'static>(
    deadline: Duration,
    work: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return work.await;
    };
    match tokio::time::timeout(deadline, runtime.spawn(work)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down: the flow stays held until its lease runs out.
        Ok(Err(_)) | Err(_) => Err(Error::DeadlineExceeded {
            deadline,
            in_doubt: true,
        }),
    }
}
