//! What the outbox needs from a backend: a handful of statements over the backend's own
//! connection. Each backend implements [`OutboxStore`] in `src/backend/<backend>/outbox.rs`.
//! Every time is the database's clock, in milliseconds since the epoch.

use std::future::Future;

use crate::store::Store;
use crate::support::trace::TraceContext;

/// A backend of the outbox: the relay's claim and its fenced outcomes, the operator's
/// calls, and the consumer's inbox.
pub trait OutboxStore: Store {
    /// Claims up to `claim.limit` events under `claim.token` for `claim.lease_ms`, in one
    /// atomic unit, and returns them. An event is claimable when it is `PENDING`, due
    /// (`next_at` passed), not under another relay's live lease, and the earliest
    /// unpublished event of its entity (no event of the entity at a lower version is
    /// `PENDING` or `DEAD`), so one entity's events are published one after another in
    /// version order, and never two of them at once. Each claim counts an attempt.
    /// Rows another relay is claiming at this moment are skipped, never waited for
    /// (`SKIP LOCKED` where the backend has it).
    ///
    /// Each row is decoded on its own: a row that cannot be read as an [`EventRow`] (a
    /// column of the wrong type) is claimed all the same and answered as a
    /// [`CorruptEvent`], so that the relay sets it aside and publishes the others.
    fn claim_events(
        &self,
        conn: &mut Self::Conn,
        claim: &ClaimEvents<'_>,
    ) -> impl Future<Output = Result<Vec<ClaimedEvent>, sqlx::Error>> + Send;

    /// Locks up to `limit` claimable events, chosen as [`claim_events`](Self::claim_events)
    /// chooses them, in a transaction it opens on `conn` (the relay's own connection, no
    /// transaction open), and returns them with that transaction still open: the row
    /// locks are the claim, held across the publish until
    /// [`settle_locked`](Self::settle_locked) records the outcomes and commits. Nothing is
    /// written for the claim (no token, no lease, no attempt). Other relays skip the
    /// locked rows, and a relay that dies holding them (its connection closed) leaves
    /// them claimable at once, with nothing to expire.
    ///
    /// `None`, with no transaction opened, where a claim cannot be held by lock: a store
    /// of several writable nodes whose row locks are local (a Galera node), or one whose
    /// write transaction would hold the whole database across the publish (SQLite). The
    /// relay then claims with [`claim_events`](Self::claim_events). The default is `None`.
    fn lock_events(
        &self,
        conn: &mut Self::Conn,
        limit: i64,
    ) -> impl Future<Output = Result<Option<Vec<ClaimedEvent>>, sqlx::Error>> + Send {
        let _ = (conn, limit);
        std::future::ready(Ok(None))
    }

    /// Records the outcomes of the events [`lock_events`](Self::lock_events) locked on
    /// `conn`, in its transaction, and commits it: `published` marked `PUBLISHED`, each of
    /// `failed` back to `PENDING` after its delay or `DEAD`, each with one more attempt.
    /// The failures' tokens are not read: the locks fence them. How many events it marked
    /// published. On an error the transaction's fate is unknown; the relay closes the
    /// connection (the server rolls back whatever did not commit). The default writes
    /// nothing (no store that answers [`lock_events`](Self::lock_events) with `None` is
    /// asked).
    fn settle_locked(
        &self,
        conn: &mut Self::Conn,
        published: &[EventKey],
        failed: &[FailedEvent<'_>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send {
        let _ = (conn, published, failed);
        std::future::ready(Err(sqlx::Error::Configuration(
            "this store holds no claims by lock".into(),
        )))
    }

    /// Marks the events of `keys` still claimed under `token` `PUBLISHED`, in one
    /// statement: how many it marked (an event whose claim was taken over is not).
    fn mark_published(
        &self,
        conn: &mut Self::Conn,
        token: &str,
        keys: &[EventKey],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Records a failed publish of one event still claimed under `failed.token`: back to
    /// `PENDING`, due again after `failed.retry_in_ms`, or `DEAD` if `failed.dead`, with
    /// the error. Whether it wrote (false if the claim was taken over).
    fn mark_failed(
        &self,
        conn: &mut Self::Conn,
        failed: &FailedEvent<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Puts a `DEAD` event back to `PENDING`, due now, its attempts reset; whether it was
    /// dead.
    fn requeue_event(
        &self,
        conn: &mut Self::Conn,
        key: &EventKey,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Deletes a `DEAD` event, never to be published (an operator's decision); whether
    /// it was dead. The entity's later events are published without it. The default
    /// answers that this store does not discard; every backend of orderly does.
    fn discard_event(
        &self,
        conn: &mut Self::Conn,
        key: &EventKey,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send {
        let _ = (conn, key);
        async {
            Err(sqlx::Error::InvalidArgument(
                "this outbox store does not discard dead events".into(),
            ))
        }
    }

    /// Deletes up to `limit` `PUBLISHED` events published more than `retention_ms` ago;
    /// how many went.
    fn purge_published(
        &self,
        conn: &mut Self::Conn,
        retention_ms: i64,
        limit: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Counts of the outbox as it is now; the corrupt rows as
    /// [`list_corrupt`](Self::list_corrupt) finds them.
    fn outbox_stats(
        &self,
        conn: &mut Self::Conn,
        max_lease_ms: i64,
    ) -> impl Future<Output = Result<StatsRow, sqlx::Error>> + Send;

    /// Up to `limit` rows orderly never writes, by machine, entity and version: a status
    /// other than `PENDING`, `PUBLISHED` and `DEAD`; a claim whose lease runs past
    /// `now + max_lease_ms` (no relay takes one that long); on SQLite, an entity id or
    /// version that is not an integer. Each with why.
    fn list_corrupt(
        &self,
        conn: &mut Self::Conn,
        max_lease_ms: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<CorruptRow>, sqlx::Error>> + Send;

    /// Up to `limit` events in `status`, by machine, entity and version.
    fn list_events(
        &self,
        conn: &mut Self::Conn,
        status: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<EventRow>, sqlx::Error>> + Send;

    /// Records that `consumer` received `message_id`, in the caller's transaction (the
    /// connection is inside it): `true` the first time, `false` for a redelivery.
    fn inbox_insert(
        &self,
        conn: &mut Self::Conn,
        consumer: &str,
        message_id: &str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Deletes up to `limit` inbox entries received more than `retention_ms` ago.
    fn inbox_purge(
        &self,
        conn: &mut Self::Conn,
        retention_ms: i64,
        limit: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
}

/// A relay's claim.
#[derive(Debug, Clone, Copy)]
pub struct ClaimEvents<'a> {
    /// The token this claim mints.
    pub token: &'a str,
    /// How long the claim lasts, in milliseconds.
    pub lease_ms: i64,
    /// The most events to claim.
    pub limit: i64,
}

/// An event's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventKey {
    /// The machine's name.
    pub machine: String,
    /// The entity.
    pub entity_id: i64,
    /// The entity's version after the transition that emitted it.
    pub version: i64,
}

/// A failed publish, recorded.
#[derive(Debug, Clone, Copy)]
pub struct FailedEvent<'a> {
    /// The event.
    pub key: &'a EventKey,
    /// The claim's token.
    pub token: &'a str,
    /// The sink's error, bounded.
    pub error: &'a str,
    /// Due again after this many milliseconds.
    pub retry_in_ms: i64,
    /// Moved to `DEAD` instead.
    pub dead: bool,
}

/// An outbox row as read.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EventRow {
    /// The machine's name.
    pub machine: String,
    /// The entity.
    pub entity_id: i64,
    /// The entity's version after the transition.
    pub version: i64,
    /// The domain event.
    pub event: String,
    /// The transition (the machine's event) that emitted it.
    pub transition: String,
    /// The state before.
    pub from_status: String,
    /// The state after.
    pub to_status: String,
    /// The request's reference.
    pub ref_id: String,
    /// The request's own event body, JSON text.
    pub body: Option<String>,
    /// `PENDING`, `PUBLISHED` or `DEAD`.
    pub status: String,
    /// Claims so far.
    pub attempts: i32,
    /// The last publish error.
    pub last_error: Option<String>,
    /// Milliseconds since the event was written; `None` if its `created_at` is no time
    /// the database can count from (PostgreSQL's `infinity`, MariaDB's zero date).
    pub age_ms: Option<i64>,
    /// The trace context stored with the event (its `traceparent` and `tracestate`
    /// columns), if the request that wrote it had one. Read leniently: a stored value
    /// that does not read (or a column that is not there) is none, and the row is still
    /// an event.
    #[sqlx(skip)]
    pub trace: Option<TraceContext>,
}

/// A claimed row the relay cannot publish: its key if that much could be read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptEvent {
    /// The event's identity; `None` if even that could not be read.
    pub key: Option<EventKey>,
    /// What is wrong with it.
    pub reason: String,
}

/// A claimed row: an event to publish, or one to set aside.
pub type ClaimedEvent = std::result::Result<EventRow, CorruptEvent>;

/// A row orderly never writes, as text, for an operator to read.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct CorruptRow {
    /// The machine's name.
    pub machine: String,
    /// The entity, as stored.
    pub entity_id: String,
    /// The version, as stored.
    pub version: String,
    /// The status, as stored.
    pub status: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Counts of the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct StatsRow {
    /// Events waiting to be published.
    pub pending: i64,
    /// Events in the dead state.
    pub dead: i64,
    /// Milliseconds since the oldest pending event was written (0 if none).
    pub oldest_pending_ms: i64,
    /// Rows orderly never writes (see [`OutboxStore::list_corrupt`]).
    pub corrupt: i64,
}
