//! What the page and the command line do, each through the library's own fenced calls
//! and recorded in the audit trail.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use super::{Acted, BATCH, Filter, MAX_TARGET, MAX_WHO, OnDead, OnTimer};
use crate::admin::AdminStore;
use crate::admin::panel::Admin;
use crate::error::Error;
use crate::error::Result;
use crate::flow::Resume;
use crate::outbox::{EventKey, Outbox};
use crate::store::Lease;
use crate::store::audit::AuditEntry;
use crate::timer::{TimerKey, Timers};

/// `text` cut to `max` bytes at a character boundary.
fn bounded(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

impl<S: AdminStore> Admin<S> {
    /// Records an action (what it changed, and why it stopped if it failed) in the
    /// audit trail; returns the notice that tells what it did.
    pub(crate) async fn record(
        &self,
        who: &str,
        action: &str,
        target: &str,
        acted: &Acted,
    ) -> String {
        let (n, failure) = match acted {
            Ok(n) => (*n, None),
            Err((e, n)) => (*n, Some(e)),
        };
        let recorded_target = match failure {
            None => bounded(target, MAX_TARGET),
            Some(e) => bounded(&format!("{target} (failed: {e})"), MAX_TARGET),
        };
        let who = bounded(who, MAX_WHO);
        let entry = AuditEntry {
            who: &who,
            action,
            target: &recorded_target,
            affected: n,
        };
        let store = &self.store;
        let recorded: Result<()> =
            async { Lease::run(store, async |c| store.record_audit(c, &entry).await).await }.await;
        let mut notice = match failure {
            None => format!("{action} {target}: {n} changed"),
            Some(e) => format!("{action} {target} failed after {n} changed: {e}"),
        };
        if let Err(e) = recorded {
            // The action stands; only its record failed: say so.
            notice.push_str(&format!(" (the audit record failed: {e})"));
        }
        notice
    }

    /// Requeues one dead event.
    pub(crate) async fn requeue_one(&self, key: &EventKey) -> Acted {
        Outbox::new(self.store.clone())
            .requeue(key)
            .await
            .map(i64::from)
            .map_err(|e| (e, 0))
    }

    /// Discards one dead event: deleted, never published.
    pub(crate) async fn discard_one(&self, key: &EventKey) -> Acted {
        Outbox::new(self.store.clone())
            .discard(key)
            .await
            .map(i64::from)
            .map_err(|e| (e, 0))
    }

    /// Requeues or discards every dead event `filter` matches, a batch at a time;
    /// `progress` is told the count so far after each batch.
    pub(crate) async fn on_matching(
        &self,
        filter: &Filter,
        what: OnDead,
        progress: &mut (dyn FnMut(i64) + Send),
    ) -> Acted {
        let outbox = Outbox::new(self.store.clone());
        let mut acted_on = 0i64;
        // Each round reads the next batch of matches past the last key read (in key
        // order, so each dead event is read once) and requeues or deletes them, which
        // moves them out of the dead state. It ends once a round reads the last match.
        let mut after: Option<EventKey> = None;
        loop {
            let (rows, next) = self
                .events_page("DEAD", filter, after.as_ref(), BATCH)
                .await
                .map_err(|e| (e, acted_on))?;
            for r in &rows {
                let key = EventKey {
                    machine: r.machine.clone(),
                    entity_id: r.entity_id,
                    version: r.version,
                };
                let acted = match what {
                    OnDead::Requeue => outbox.requeue(&key).await,
                    OnDead::Discard => outbox.discard(&key).await,
                };
                match acted {
                    Ok(true) => acted_on += 1,
                    Ok(false) => {}
                    Err(e) => return Err((e, acted_on)),
                }
            }
            progress(acted_on);
            match next {
                // A page that ends where the last one did made no progress: its keys
                // do not read back as stored (on SQLite, a machine whose bytes are not
                // UTF-8, read lossily), and reading on would loop.
                Some(key) if after.as_ref() == Some(&key) => {
                    let why = format!(
                        "the dead events cannot be read past {} {} v{}: a key that does not \
                         read back as stored",
                        key.machine, key.entity_id, key.version
                    );
                    return Err((Error::InvalidInput(why), acted_on));
                }
                Some(key) => after = Some(key),
                None => return Ok(acted_on),
            }
        }
    }

    /// Resumes a parked flow through the registered flows (a step that panics is this
    /// action's failure).
    pub(crate) async fn resume_flow(&self, kind: &str, key: &str, how: Resume) -> Acted {
        let Some(flows) = self.flows.as_ref() else {
            return Err((
                Error::InvalidInput("no flows are registered here".into()),
                0,
            ));
        };
        // What the flow looked like before: an error after the resume unparked it
        // (a step that failed, a deadline) is a failure after one change, not before.
        let look = || async {
            flows
                .get(kind, key)
                .await
                .ok()
                .flatten()
                .map(|v| (v.flow.status, v.flow.park_reason, v.flow.updated_at))
        };
        let before = look().await;
        let resumed = AssertUnwindSafe(flows.resume(kind, key, how))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                Err(Error::RuleFailed {
                    rule: "a flow step",
                    reason: format!("a step of flow {kind} {key} panicked"),
                })
            });
        match resumed {
            Ok(_) => Ok(1),
            Err(e) => {
                let after = look().await;
                let changed = before.is_some() && after.is_some() && before != after;
                Err((e, i64::from(changed)))
            }
        }
    }

    /// Releases a record stuck in PROCESSING past its lease, through the registered
    /// records ([`Records::release_stuck`](crate::Records::release_stuck)).
    pub(crate) async fn release_record(&self, scope: &str, key: &str) -> Acted {
        let Some(records) = self.records.as_ref() else {
            return Err((
                Error::InvalidInput("no idempotency records are registered here".into()),
                0,
            ));
        };
        records
            .release_stuck(scope, key)
            .await
            .map(i64::from)
            .map_err(|e| (e, 0))
    }

    /// Re-arms a dead timer ([`Timers::rearm`]) or cancels a pending or dead one no job
    /// is firing (the store's fenced `cancel_timer`); the action's name and what it did.
    pub(crate) async fn on_timer(
        &self,
        key: &TimerKey<'_>,
        what: OnTimer,
    ) -> (&'static str, Acted) {
        let store = &self.store;
        // A cancel looks for the timer's event in its machine's history: the store of
        // the machine's registered engine, with its own tables.
        let entities = self.entities_of(key.machine);
        let (action, changed) = match what {
            OnTimer::Rearm => ("timers.rearm", Timers::new(store.clone()).rearm(key).await),
            OnTimer::Cancel => (
                "timers.cancel",
                async { Lease::run(entities, async |c| entities.cancel_timer(c, key).await).await }
                    .await,
            ),
        };
        (action, changed.map(i64::from).map_err(|e| (e, 0)))
    }
}
