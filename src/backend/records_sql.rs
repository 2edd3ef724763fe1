//! The idempotency layer's statements whose values every backend binds alike: each
//! backend writes them once in its dialect ([`RecordStatements`], numbered parameters as
//! [`Statement`] reads them), and its methods of
//! [`RecordStore`](crate::idempotency::RecordStore) call the functions here, which bind
//! the values and run them. A backend whose claim and takeover are one statement each
//! (PostgreSQL, SQLite) writes those in [`OneStatementClaims`] too; the others (MySQL)
//! write those two methods themselves, and every backend its own `begin`.
//!
//! Every function is generic over the backend's database (`DB`), and each statement's
//! values are listed once, here, in the order its numbered parameters name them.

use sqlx::{Connection, Executor};

use crate::backend::sql::{Arg, Binds, Statement};
use crate::idempotency::{Finish, RecordRow, StuckRow, TokenRow};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::idempotency::{NewClaim, TakeOver};
use crate::store::Txn;

/// A backend's idempotency statements, each with the numbered parameters its comment
/// lists.
#[derive(Debug)]
pub(crate) struct RecordStatements {
    /// A record as it is now (a [`RecordRow`]): 1 scope, 2 key.
    pub(crate) read: Statement,
    /// The holder's fenced write ([`Finish`]): 1 scope, 2 key, 3 token, 4 status,
    /// 5 result, 6 terminal, 7 lease ms (kept only for PROCESSING), 8 retention ms.
    pub(crate) finish: Statement,
    /// Records stuck in PROCESSING (each a [`StuckRow`]), oldest lease first: 1 scope,
    /// 2 limit.
    pub(crate) stuck: Statement,
    /// `(held, oldest_ms)`: the count of PROCESSING records inside their retention, and
    /// the oldest one's age (0 if none): 1 scope.
    pub(crate) held: Statement,
    /// The deletes of records past their retention and of expired tokens: 1 limit each.
    pub(crate) purge: [Statement; 2],
    /// A new one-time token: 1 scope, 2 token, 3 time to live in ms.
    pub(crate) issue_token: Statement,
    /// A token marked used if it is unused and unexpired: 1 scope, 2 token.
    pub(crate) consume_token: Statement,
    /// A token as it is now (a [`TokenRow`]): 1 scope, 2 token.
    pub(crate) read_token: Statement,
}

/// The claim and the takeover, one statement each, returning the attempt.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug)]
pub(crate) struct OneStatementClaims {
    /// [`NewClaim`]: 1 scope, 2 key, 3 payload hash, 4 token, 5 lease ms, 6 retention ms.
    pub(crate) claim: Statement,
    /// [`TakeOver`]: 1 scope, 2 key, 3 the token it was found with, 4 token, 5 lease ms,
    /// 6 retention ms.
    pub(crate) take_over: Statement,
}

/// [`RecordStore::read`](crate::idempotency::RecordStore::read).
pub(crate) async fn read<DB: Binds>(
    conn: &mut DB::Connection,
    s: &RecordStatements,
    scope: &str,
    key: &str,
) -> Result<Option<RecordRow>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    RecordRow: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.read
        .query_as::<DB, RecordRow>(&[Arg::Str(scope), Arg::Str(key)])?
        .fetch_optional(conn)
        .await
}

/// [`RecordStore::finish`](crate::idempotency::RecordStore::finish): inside a caller's
/// transaction, in a savepoint, so that a failure does not abort it.
pub(crate) async fn finish<DB: Binds>(
    conn: &mut DB::Connection,
    s: &RecordStatements,
    f: &Finish<'_>,
    txn: Txn,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let statement = s.finish.query::<DB>(&finish_args(f))?;
    let done = match txn {
        Txn::Own => statement.execute(conn).await?,
        Txn::Caller => {
            let mut savepoint = conn.begin().await?;
            let done = statement.execute(&mut *savepoint).await?;
            savepoint.commit().await?;
            done
        }
    };
    Ok(DB::rows_affected(&done) == 1)
}

/// [`RecordStore::stuck`](crate::idempotency::RecordStore::stuck).
pub(crate) async fn stuck<DB: Binds>(
    conn: &mut DB::Connection,
    s: &RecordStatements,
    scope: &str,
    limit: i64,
) -> Result<Vec<StuckRow>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    StuckRow: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.stuck
        .query_as::<DB, StuckRow>(&[Arg::Str(scope), Arg::I64(limit)])?
        .fetch_all(conn)
        .await
}

/// [`RecordStore::held`](crate::idempotency::RecordStore::held).
pub(crate) async fn held<DB: Binds>(
    conn: &mut DB::Connection,
    s: &RecordStatements,
    scope: &str,
) -> Result<(i64, i64), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i64, i64): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.held
        .query_as::<DB, (i64, i64)>(&[Arg::Str(scope)])?
        .fetch_one(conn)
        .await
}

/// [`RecordStore::purge`](crate::idempotency::RecordStore::purge): both deletes, the
/// rows they removed.
pub(crate) async fn purge<DB: Binds>(
    conn: &mut DB::Connection,
    s: &RecordStatements,
    limit: i64,
) -> Result<u64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let mut gone = 0;
    for statement in &s.purge {
        let done = statement
            .query::<DB>(&[Arg::I64(limit)])?
            .execute(&mut *conn)
            .await?;
        gone += DB::rows_affected(&done);
    }
    Ok(gone)
}

/// [`RecordStore::issue_token`](crate::idempotency::RecordStore::issue_token).
pub(crate) async fn issue_token<DB: Binds>(
    conn: &mut DB::Connection,
    s: &RecordStatements,
    scope: &str,
    token: &str,
    ttl_ms: i64,
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let args = [Arg::Str(scope), Arg::Str(token), Arg::I64(ttl_ms)];
    s.issue_token.query::<DB>(&args)?.execute(conn).await?;
    Ok(())
}

/// [`RecordStore::consume_token`](crate::idempotency::RecordStore::consume_token).
pub(crate) async fn consume_token<DB: Binds>(
    conn: &mut DB::Connection,
    s: &RecordStatements,
    scope: &str,
    token: &str,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let args = [Arg::Str(scope), Arg::Str(token)];
    let done = s.consume_token.query::<DB>(&args)?.execute(conn).await?;
    Ok(DB::rows_affected(&done) == 1)
}

/// [`RecordStore::read_token`](crate::idempotency::RecordStore::read_token).
pub(crate) async fn read_token<DB: Binds>(
    conn: &mut DB::Connection,
    s: &RecordStatements,
    scope: &str,
    token: &str,
) -> Result<Option<TokenRow>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    TokenRow: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.read_token
        .query_as::<DB, TokenRow>(&[Arg::Str(scope), Arg::Str(token)])?
        .fetch_optional(conn)
        .await
}

/// [`RecordStore::claim`](crate::idempotency::RecordStore::claim) in one statement.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) async fn claim<DB: Binds>(
    conn: &mut DB::Connection,
    s: &OneStatementClaims,
    c: &NewClaim<'_>,
) -> Result<Option<i32>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i32,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.claim
        .query_scalar::<DB, i32>(&claim_args(c))?
        .fetch_optional(conn)
        .await
}

/// [`RecordStore::take_over`](crate::idempotency::RecordStore::take_over) in one
/// statement.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) async fn take_over<DB: Binds>(
    conn: &mut DB::Connection,
    s: &OneStatementClaims,
    t: &TakeOver<'_>,
) -> Result<Option<i32>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i32,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.take_over
        .query_scalar::<DB, i32>(&take_over_args(t))?
        .fetch_optional(conn)
        .await
}

/// [`RecordStatements::finish`]'s values.
fn finish_args<'a>(f: &Finish<'a>) -> [Arg<'a>; 8] {
    [
        Arg::Str(f.scope),
        Arg::Str(f.key),
        Arg::Str(f.token),
        Arg::Str(f.status),
        Arg::OptStr(f.result),
        Arg::Bool(f.terminal),
        Arg::I64(f.lease_ms),
        Arg::I64(f.retention_ms),
    ]
}

/// [`OneStatementClaims::claim`]'s values.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn claim_args<'a>(c: &NewClaim<'a>) -> [Arg<'a>; 6] {
    [
        Arg::Str(c.scope),
        Arg::Str(c.key),
        Arg::OptStr(c.payload_hash),
        Arg::Str(c.token),
        Arg::I64(c.lease_ms),
        Arg::I64(c.retention_ms),
    ]
}

/// [`OneStatementClaims::take_over`]'s values.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn take_over_args<'a>(t: &TakeOver<'a>) -> [Arg<'a>; 6] {
    [
        Arg::Str(t.scope),
        Arg::Str(t.key),
        Arg::Str(t.from),
        Arg::Str(t.token),
        Arg::I64(t.lease_ms),
        Arg::I64(t.retention_ms),
    ]
}
