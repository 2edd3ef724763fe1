//! A flow's start as it waits in the queue of coalesced claims (`crate::coalesce::claims`).

use super::{FlowStore, NewFlow};
use crate::coalesce::claims::Queued;

/// A [`NewFlow`] that owns its strings.
pub(crate) struct Owned {
    kind: String,
    key: String,
    version: i32,
    input_hash: String,
    input: String,
    token: String,
    lease_ms: i64,
}

impl Owned {
    pub(crate) fn new(s: &NewFlow<'_>) -> Self {
        Owned {
            kind: s.kind.to_string(),
            key: s.key.to_string(),
            version: s.version,
            input_hash: s.input_hash.to_string(),
            input: s.input.to_string(),
            token: s.token.to_string(),
            lease_ms: s.lease_ms,
        }
    }

    fn as_start(&self) -> NewFlow<'_> {
        NewFlow {
            kind: &self.kind,
            key: &self.key,
            version: self.version,
            input_hash: &self.input_hash,
            input: &self.input,
            token: &self.token,
            lease_ms: self.lease_ms,
        }
    }
}

impl<S: FlowStore> Queued<S> for Owned {
    /// The attempt number of the start the batch granted.
    type Answer = i32;

    async fn write(
        store: &S,
        conn: &mut S::Conn,
        batch: &[Self],
    ) -> Result<Vec<Option<i32>>, sqlx::Error> {
        // In the order of their keys, as every batch: two batches of the same keys never
        // wait on each other's rows in opposite orders.
        let mut starts: Vec<NewFlow<'_>> = batch.iter().map(Owned::as_start).collect();
        starts.sort_unstable_by(|a, b| (a.kind, a.key).cmp(&(b.kind, b.key)));
        let held = store.start_flows(conn, &starts).await?;
        Ok(crate::coalesce::claims::by_token(
            batch,
            |s| &s.token,
            &held,
        ))
    }
}
