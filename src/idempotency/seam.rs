//! What the idempotency layer needs from a backend: a handful of statements, each one
//! round trip, over the backend's own connection, and a way to begin a transaction.
//! Each backend implements [`RecordStore`] in `src/backend/<backend>/idempotency.rs`.

use std::future::Future;

use crate::store::{Store, Txn};

/// A backend of the idempotency layer. Every time is the database's clock, in
/// milliseconds since the epoch.
pub trait RecordStore: Store<Conn: sqlx::Connection> {
    /// The sqlx database whose connection is [`Store::Conn`].
    type Db: sqlx::Database<Connection = Self::Conn>;

    /// Begins a transaction on `conn` the way writes on this backend begin (`BEGIN
    /// IMMEDIATE` on SQLite), for [`Records::run`](crate::Records::run).
    fn begin(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = Result<sqlx::Transaction<'_, Self::Db>, sqlx::Error>> + Send;

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

    /// Whether [`claim_new`](Self::claim_new) writes several claims in one statement:
    /// [`Records`](crate::Records) then coalesces concurrent claims.
    const BATCHES_CLAIMS: bool = false;

    /// Several claims, in one statement and one commit where the store can: each
    /// inserted as PROCESSING under its token, unless a record with its key exists
    /// (then nothing is written for it, whatever its state, and the caller claims it
    /// alone). The tokens of the claims that hold their records now, with their attempt
    /// numbers (a store that cannot tell which of its rows went in may leave out some
    /// that did: their claims read their records, and find them under their own tokens);
    /// two claims of one key in one call hold it at most once. By default, each claim's
    /// own [`claim`](Self::claim) in turn.
    fn claim_new(
        &self,
        conn: &mut Self::Conn,
        claims: &[NewClaim<'_>],
    ) -> impl Future<Output = Result<Vec<(String, i32)>, sqlx::Error>> + Send {
        async move {
            let mut held = Vec::new();
            for claim in claims {
                if let Some(attempt) = self.claim(conn, claim).await? {
                    held.push((claim.token.to_string(), attempt));
                }
            }
            Ok(held)
        }
    }

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

    /// Several holders' finishes (none an extension: each to SUCCEEDED or FAILED), in one
    /// transaction and one commit, one statement where the store can: the tokens of
    /// those that wrote (each fenced as [`finish`](Self::finish) is). By default, each
    /// finish's own statement in turn, inside one transaction.
    fn finish_many(
        &self,
        conn: &mut Self::Conn,
        finishes: &[Finish<'_>],
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send {
        async move {
            let mut tx = Self::begin(conn).await?;
            let mut wrote = Vec::new();
            for f in finishes {
                if self.finish(&mut tx, f, Txn::Own).await? {
                    wrote.push(f.token.to_string());
                }
            }
            tx.commit().await?;
            Ok(wrote)
        }
    }

    /// Up to `limit` records of `scope` in PROCESSING whose lease ran out (and which are
    /// not past their retention), oldest lease first.
    fn stuck(
        &self,
        conn: &mut Self::Conn,
        scope: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<StuckRow>, sqlx::Error>> + Send;

    /// Takes a stuck record over from the token it was found with, in one conditional
    /// update (still PROCESSING under `from`, its lease still run out): the attempt
    /// number if this takeover holds it now, `None` if someone else got there first.
    fn take_over(
        &self,
        conn: &mut Self::Conn,
        take: &TakeOver<'_>,
    ) -> impl Future<Output = Result<Option<i32>, sqlx::Error>> + Send;

    /// How many records of `scope` are held (PROCESSING, inside their retention), and
    /// the oldest one's age in milliseconds (0 if none).
    fn held(
        &self,
        conn: &mut Self::Conn,
        scope: &str,
    ) -> impl Future<Output = Result<(i64, i64), sqlx::Error>> + Send;

    /// Deletes up to `limit` records past their retention (none under a live lease) and
    /// up to `limit` expired one-time tokens; how many rows went.
    fn purge(
        &self,
        conn: &mut Self::Conn,
        limit: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Stores a new one-time token of `scope`, valid for `ttl_ms`.
    fn issue_token(
        &self,
        conn: &mut Self::Conn,
        scope: &str,
        token: &str,
        ttl_ms: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Marks the token used if it is unused and unexpired, in one conditional update;
    /// whether it did.
    fn consume_token(
        &self,
        conn: &mut Self::Conn,
        scope: &str,
        token: &str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// The token as it is now, judged on the database's clock.
    fn read_token(
        &self,
        conn: &mut Self::Conn,
        scope: &str,
        token: &str,
    ) -> impl Future<Output = Result<Option<TokenRow>, sqlx::Error>> + Send;
}

/// A record found stuck in PROCESSING.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StuckRow {
    /// The idempotency key.
    pub idem_key: String,
    /// The token of the holder whose lease ran out.
    pub owner_token: Option<String>,
    /// The payload fingerprint it was claimed with.
    pub payload_hash: Option<String>,
    /// How many times it was claimed.
    pub attempt: i32,
}

/// A takeover of a stuck record by the recovery job.
#[derive(Debug, Clone, Copy)]
pub struct TakeOver<'a> {
    /// The operation.
    pub scope: &'a str,
    /// The idempotency key.
    pub key: &'a str,
    /// The token the record was found under.
    pub from: &'a str,
    /// The token this takeover mints.
    pub token: &'a str,
    /// How long the new lease lasts, in milliseconds.
    pub lease_ms: i64,
    /// How long the record is kept from now.
    pub retention_ms: i64,
}

/// A one-time token as read.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TokenRow {
    /// Whether it was consumed.
    pub used: bool,
    /// 1 if past its time to live.
    pub expired: i64,
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
    /// How long the record is kept from now (longer than any lease).
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
