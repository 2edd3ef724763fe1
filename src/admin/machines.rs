//! A machine as the page shows it, its type erased: its graph and an entity's history.

use futures_util::future::BoxFuture;
use serde::Serialize;

use crate::Result;
use crate::engine::Engine;
use crate::machine::{StateMachine, mermaid};
use crate::store::Store;

/// One history row, as text.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Line {
    pub(super) seq: i64,
    pub(super) from: String,
    pub(super) to: String,
    pub(super) event: String,
    pub(super) ref_id: String,
    pub(super) payload_hash: Option<String>,
    pub(super) actor: Option<String>,
    pub(super) reason: Option<String>,
    pub(super) at: String,
}

/// An entity's state and version (if it exists), and its history.
pub(super) type Timeline = (Option<(String, i64)>, Vec<Line>);

pub(super) trait MachineView<S>: Send + Sync {
    /// The graph, as Mermaid text.
    fn graph(&self) -> String;
    /// The entity's state and version, if it exists, and its history.
    fn timeline(&self, id: i64) -> BoxFuture<'_, Result<Timeline>>;
}

impl<M: StateMachine, S: Store> MachineView<S> for Engine<M, S> {
    fn graph(&self) -> String {
        mermaid::<M>()
    }

    fn timeline(&self, id: i64) -> BoxFuture<'_, Result<Timeline>> {
        Box::pin(async move {
            let now = match self.get(id).await {
                Ok(order) => Some((order.state.to_string(), order.version)),
                Err(crate::Error::NotFound { .. }) => None,
                Err(e) => return Err(e),
            };
            let lines = self
                .history(id)
                .await?
                .into_iter()
                .map(|r| Line {
                    seq: r.seq,
                    from: r.from.to_string(),
                    to: r.to.to_string(),
                    event: r.event.to_string(),
                    ref_id: r.ref_id,
                    payload_hash: r.payload_hash,
                    actor: r.actor,
                    reason: r.reason,
                    at: r.created_at.to_rfc3339(),
                })
                .collect();
            Ok((now, lines))
        })
    }
}
