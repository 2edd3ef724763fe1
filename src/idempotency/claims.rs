//! An idempotency record's claim as it waits in the queue of coalesced claims
//! (`crate::coalesce::claims`).

use super::{NewClaim, RecordStore};
use crate::coalesce::claims::Queued;

/// A [`NewClaim`] that owns its strings.
pub(crate) struct Owned {
    scope: String,
    key: String,
    payload_hash: Option<String>,
    token: String,
    lease_ms: i64,
    retention_ms: i64,
    /// The call the claim is made for.
    caller: crate::support::detach::Caller,
}

impl Owned {
    pub(crate) fn new(c: &NewClaim<'_>) -> Self {
        Owned {
            scope: c.scope.to_string(),
            key: c.key.to_string(),
            payload_hash: c.payload_hash.map(str::to_string),
            token: c.token.to_string(),
            lease_ms: c.lease_ms,
            retention_ms: c.retention_ms,
            caller: crate::support::detach::Caller::current(),
        }
    }

    fn as_claim(&self) -> NewClaim<'_> {
        NewClaim {
            scope: &self.scope,
            key: &self.key,
            payload_hash: self.payload_hash.as_deref(),
            token: &self.token,
            lease_ms: self.lease_ms,
            retention_ms: self.retention_ms,
        }
    }
}

impl<S: RecordStore> Queued<S> for Owned {
    /// The attempt number of the claim the batch granted.
    type Answer = i32;
    const RELEASES: bool = true;

    fn left(&self) -> bool {
        self.caller.left()
    }

    /// Marks the caller's write sent: one that stops waiting now leaves its claim to go
    /// on off its task (answered held, the batch releases it; not answered, as after
    /// MySQL's short count, it reads its record, finds it its own and releases it), and
    /// is told it is in doubt, not that nothing was sent.
    fn send(&self) -> bool {
        self.caller.send()
    }

    async fn write(
        store: &S,
        conn: &mut S::Conn,
        batch: &[Self],
    ) -> Result<Vec<Option<i32>>, sqlx::Error> {
        // In the order of their keys, as every batch: two batches of the same keys never
        // wait on each other's rows in opposite orders.
        let mut claims: Vec<NewClaim<'_>> = batch.iter().map(Owned::as_claim).collect();
        claims.sort_unstable_by(|a, b| (a.scope, a.key).cmp(&(b.scope, b.key)));
        let held = store.claim_new(conn, &claims).await?;
        Ok(crate::coalesce::claims::by_token(
            batch,
            |c| &c.token,
            &held,
        ))
    }

    async fn release(store: &S, conn: &mut S::Conn, claim: &Self) -> Result<(), sqlx::Error> {
        let finish = super::Finish {
            scope: &claim.scope,
            key: &claim.key,
            token: &claim.token,
            status: "FAILED",
            result: None,
            terminal: false,
            lease_ms: claim.lease_ms,
            retention_ms: claim.retention_ms,
        };
        store
            .finish(conn, &finish, crate::store::Txn::Own)
            .await
            .map(|_| ())
    }
}
