//! What the write units of every SQL backend share: how a unit ends (committed if it
//! applied something, rolled back otherwise, and rolled back after an error), and which
//! requests of a batch it writes together.

use std::mem::ManuallyDrop;

use sqlx::{Database, Transaction};
use sqlx_core::transaction::TransactionManager;

use crate::store::{FirstWrite, Request};

/// Ends a unit of apply-first writes: committed if one of them applied, else rolled
/// back (it wrote nothing).
pub(crate) async fn end_unit<DB: Database>(
    tx: Transaction<'_, DB>,
    written: Vec<FirstWrite>,
) -> Result<Vec<FirstWrite>, sqlx::Error> {
    if written
        .iter()
        .any(|w| matches!(w, FirstWrite::Applied { .. }))
    {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(written)
}

/// Rolls a write unit back after `error`, and returns the error. A rollback that fails
/// too (on a connection already lost) adds nothing to what `error` says.
pub(crate) async fn undo<DB: Database, T>(
    tx: Transaction<'_, DB>,
    error: sqlx::Error,
) -> Result<T, sqlx::Error> {
    let _ = tx.rollback().await;
    Err(error)
}

/// Whether no two requests are for one entity (a batch's write unit can then write them
/// all with one statement per kind of row).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn distinct_entities(requests: &[Request<'_>]) -> bool {
    let mut ids: Vec<i64> = requests.iter().map(|r| r.key.order_id).collect();
    ids.sort_unstable();
    ids.windows(2).all(|w| w[0] != w[1])
}

/// A request a batch's unit tries in multi-row statements: its place in the batch, the
/// request, and its one edge.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) type Tried<'a, 'r> = (usize, &'a Request<'r>, &'static str, &'static str);

/// The requests of a batch with one source state (a store whose update cannot return the
/// row it matched tries only those), in the order of their entities.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn tried<'a, 'r>(requests: &'a [Request<'r>]) -> Vec<Tried<'a, 'r>> {
    let mut tried: Vec<Tried<'a, 'r>> = requests
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match (r.from_states, r.to_states) {
            ([from], [to]) => Some((i, r, *from, *to)),
            _ => None,
        })
        .collect();
    tried.sort_by_key(|t| t.1.key.order_id);
    tried
}

/// Opens a rules unit ([`Store::begin_rules_unit`](crate::Store::begin_rules_unit)) as
/// sqlx counts transactions (so that the unit's own savepoints nest inside it): with
/// `begin` (the backend's `BEGIN`, if not sqlx's) on the engine's own connection, a
/// savepoint inside the caller's transaction. Returns sqlx's count of open transactions
/// before it, for [`end_rules_unit`], [`end_caller_unit`] and [`abandon_rules_unit`].
///
/// With `forget`, sqlx's `begin` is forgotten, not dropped, if this call is dropped
/// while it runs: on PostgreSQL, dropped while its `SAVEPOINT` is in flight, it queues a
/// rollback at the caller's count (a plain `ROLLBACK` of the caller's whole transaction
/// at one level, after which the caller's statements would autocommit). Forgotten (a
/// small allocation leaked), it leaves at most an empty savepoint of the unit's name in
/// the caller's transaction, which holds no write and needs no undo. Not on SQLite,
/// whose `begin` holds its worker's lock until dropped.
pub(crate) async fn begin_rules_unit<DB: Database>(
    conn: &mut DB::Connection,
    txn: crate::store::Txn,
    begin: Option<&'static str>,
    forget: bool,
) -> Result<usize, sqlx::Error> {
    let depth = DB::TransactionManager::get_transaction_depth(conn);
    let statement = match txn {
        crate::store::Txn::Own => begin.map(sqlx::SqlSafeStr::into_sql_str),
        crate::store::Txn::Caller => None,
    };
    if !forget {
        DB::TransactionManager::begin(conn, statement).await?;
        return Ok(depth);
    }
    let mut begin = ManuallyDrop::new(Box::pin(DB::TransactionManager::begin(conn, statement)));
    let begun = (&mut *begin).await;
    drop(ManuallyDrop::into_inner(begin));
    begun?;
    Ok(depth)
}

/// Ends a rules unit: commits (or releases its savepoint) if `commit`, else undoes it. A
/// commit or rollback that fails leaves sqlx's count where it was before the unit (the
/// undo queued for the connection's next use), so that neither the retry on this
/// connection nor the caller's own transaction is thrown off by it.
pub(crate) async fn end_rules_unit<DB: Database>(
    conn: &mut DB::Connection,
    commit: bool,
    depth: usize,
) -> Result<(), sqlx::Error> {
    let ended = if commit {
        DB::TransactionManager::commit(conn).await
    } else {
        DB::TransactionManager::rollback(conn).await
    };
    if ended.is_err() {
        abandon_rules_unit::<DB>(conn, depth);
    }
    ended
}

/// Ends a rules unit inside the caller's transaction (`depth`, the caller's count, is
/// above 0) so that a drop at any point leaves the caller's transaction as it was, or
/// with the unit whole in it. sqlx's own `RELEASE SAVEPOINT`, dropped in flight, would
/// leave its count one level high: the undo then queued names a savepoint the server
/// released (on PostgreSQL the caller's transaction aborts on it), and a count left
/// high would make the caller's `commit()` a `RELEASE`. Instead, kept (`commit`), the
/// unit's savepoint is replaced by an empty one of the same name (`keep`, one message:
/// sent whole or not at all); then, either way, sqlx's count is brought back without a
/// round trip by the rollback [`abandon_rules_unit`] queues, which undoes the unit if it
/// was not kept and nothing if it was. The unit's name is left on an empty savepoint in
/// the caller's transaction, which the server drops at the caller's commit.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn end_caller_unit<DB: Database>(
    conn: &mut DB::Connection,
    commit: bool,
    depth: usize,
    keep: fn(usize) -> String,
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let kept = match commit {
        true => sqlx::raw_sql(sqlx::AssertSqlSafe(keep(depth)))
            .execute(&mut *conn)
            .await
            .map(drop),
        false => Ok(()),
    };
    abandon_rules_unit::<DB>(conn, depth);
    kept
}

/// The savepoint sqlx opens for a unit inside a caller's transaction at `depth`, as a
/// statement (`SAVEPOINT name`), and its release.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn unit_savepoint(depth: usize) -> (String, String) {
    use sqlx_core::transaction::{begin_ansi_transaction_sql, commit_ansi_transaction_sql};
    (
        begin_ansi_transaction_sql(depth).as_str().to_owned(),
        commit_ansi_transaction_sql(depth + 1).as_str().to_owned(),
    )
}

/// Gives up a rules unit without a round trip (a dropped call, a lost connection): its
/// undo is queued for the connection's next use, one rollback per transaction or
/// savepoint open above `depth`. Counted once: on SQLite sqlx's count falls only when
/// its worker thread runs each queued rollback, so a loop that read the count after
/// each would queue rollbacks until the worker caught up, and the extra ones undid the
/// caller's own transaction.
pub(crate) fn abandon_rules_unit<DB: Database>(conn: &mut DB::Connection, depth: usize) {
    let open = DB::TransactionManager::get_transaction_depth(conn).saturating_sub(depth);
    for _ in 0..open {
        DB::TransactionManager::start_rollback(conn);
    }
}
