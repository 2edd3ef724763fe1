//! What the write units of every SQL backend share: how a unit ends (committed if it
//! applied something, rolled back otherwise, and rolled back after an error), and which
//! requests of a batch it writes together.

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
/// before it, for [`end_rules_unit`] and [`abandon_rules_unit`].
pub(crate) async fn begin_rules_unit<DB: Database>(
    conn: &mut DB::Connection,
    txn: crate::store::Txn,
    begin: Option<&'static str>,
) -> Result<usize, sqlx::Error> {
    let depth = DB::TransactionManager::get_transaction_depth(conn);
    let statement = match txn {
        crate::store::Txn::Own => begin.map(sqlx::SqlSafeStr::into_sql_str),
        crate::store::Txn::Caller => None,
    };
    DB::TransactionManager::begin(conn, statement).await?;
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
