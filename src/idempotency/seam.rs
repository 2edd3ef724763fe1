//! What the idempotency layer needs from a backend: three statements, each one round
//! trip, over the backend's own connection. Each backend implements [`RecordStore`] in
//! `src/store/<backend>/idempotency.rs`.

use std::future::Future;

use crate::store::{Store, Txn};

/// A backend of the idempotency layer. Every time is the database's clock, in
/// milliseconds since the epoch.
pub trait RecordStore: Store {
    /// The claim, in one statement: inserts the record as PROCESSING under
    /// `claim.token`, or takes over one that is past its retention, or (with the same
    /// payload fingerprint) one whose lease expired or whose failure was not terminal.
    /// The attempt number if this claim holds the record now; `None` if the record is
    /// held by another, done, or another payload's (then [`read`](Self::read) tells which).
    fn claim(
        &self,
        conn: &mut Self::Conn,
        claim: &NewClaim<'_>,
    ) -> impl Future<Output = Result<Option<i32>, sqlx::Error>> + Send;

    /// The record as it is now, judged on the database's clock.
    fn read(
        &self,
        conn: &mut Self::Conn,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<RecordRow>, sqlx::Error>> + Send;

    /// A holder's write, fenced: `UPDATE … WHERE scope AND key AND owner_token AND status
    /// = 'PROCESSING'`. `true` if it wrote (one row), `false` if the record is no longer
    /// this holder's.
    fn finish(
        &self,
        conn: &mut Self::Conn,
        finish: &Finish<'_>,
        txn: Txn,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

/// A claim about to be made.
#[derive(Debug, Clone, Copy)]
pub struct NewClaim<'a> {
    /// The operation.
    pub scope: &'a str,
    /// The caller's idempotency key.
    pub key: &'a str,
    /// The payload's fingerprint, if the request has one.
    pub payload_hash: Option<&'a str>,
    /// The owner token this claim mints.
    pub token: &'a str,
    /// How long the lease lasts, in milliseconds.
    pub lease_ms: i64,
    /// How long the record is kept, in milliseconds.
    pub retention_ms: i64,
}

/// A holder's write to its record.
#[derive(Debug, Clone, Copy)]
pub struct Finish<'a> {
    /// The operation.
    pub scope: &'a str,
    /// The idempotency key.
    pub key: &'a str,
    /// The holder's token.
    pub token: &'a str,
    /// The status after the write: `SUCCEEDED`, `FAILED`, or `PROCESSING` (a lease
    /// extended).
    pub status: &'static str,
    /// The stored result or failure, JSON text.
    pub result: Option<&'a str>,
    /// For `FAILED`: replayed rather than claimed again.
    pub terminal: bool,
    /// For `PROCESSING`: the new lease from now, in milliseconds.
    pub lease_ms: i64,
    /// For `SUCCEEDED` and `FAILED`: how long the record is kept from now.
    pub retention_ms: i64,
}

/// A record as read, with the database's clock applied.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RecordRow {
    /// The payload fingerprint it was claimed with.
    pub payload_hash: Option<String>,
    /// `PROCESSING`, `SUCCEEDED` or `FAILED`.
    pub status: String,
    /// The holder's token.
    pub owner_token: Option<String>,
    /// How many times it was claimed.
    pub attempt: i32,
    /// Milliseconds left on the lease (negative once expired).
    pub lease_left_ms: i64,
    /// 1 if past its retention, which makes it absent.
    pub expired: i64,
    /// The stored result or failure.
    pub result: Option<String>,
    /// A failure that is replayed rather than claimed again.
    pub terminal: bool,
}
