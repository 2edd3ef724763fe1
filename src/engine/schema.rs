//! The columns this version of orderly needs in the tables it drives, checked against
//! the database: a table of the user's own, made before an upgrade, that lacks one is
//! refused with one error naming the table, the column and the statement that adds it,
//! instead of a database error on every call.

use super::Engine;
use crate::error::Error;
use crate::error::Result;
use crate::machine::StateMachine;
use crate::store::{ErrorClass, Lease, Store, db_error};

/// The entity table's columns orderly reads and writes.
const ORDERS: &[&str] = &["id", "status", "version"];

/// The history table's columns (`write_id` came with the read-back of in-doubt writes,
/// `actor` and `reason` with who asked and why).
const HISTORY: &[&str] = &[
    "order_id",
    "seq",
    "from_status",
    "to_status",
    "event",
    "ref_id",
    "payload_hash",
    "payload",
    "write_id",
    "actor",
    "reason",
    "created_at",
];

impl<M: StateMachine, S: Store> Engine<M, S> {
    /// Checks that the entity and history tables have every column this version of
    /// orderly needs; [`Error::MissingColumn`] names the first one missing, with the
    /// statement that adds it. Call it at startup where the tables are your own (made
    /// by copying a migration, or before an upgrade): the default tables are created and
    /// upgraded by the store's migrations. A transition that fails on a missing column
    /// answers the same error.
    pub async fn check_tables(&self) -> Result<()> {
        super::within_deadline(self.config.deadline, false, async {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let out = missing(&self.store, lease.conn()).await;
            lease.release_after(&out);
            match out.map_err(db_error::<S>)? {
                None => Ok(()),
                Some((history, column)) => Err(Error::MissingColumn {
                    table: self.store.table_name(history),
                    column: column.to_string(),
                    fix: self.store.add_column_sql(history, column),
                }),
            }
        })
        .await
    }

    /// Creates the entity and history tables under their configured names where they
    /// do not exist, adds every column this version needs to a history table that lacks
    /// one (an upgrade: `write_id` to a history table made before it), then
    /// [checks](Self::check_tables) them. Idempotent: call it at startup, or take
    /// [`tables_sql`](Self::tables_sql) into a migration of your own. An entity table
    /// of your own with business columns is left as it is, and only checked. Another
    /// process creating the same tables at once is fine: a statement that fails is
    /// forgiven if the tables then pass the check.
    pub async fn create_tables(&self) -> Result<()> {
        let made = super::within_deadline(self.config.deadline, false, async {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let out = create(&self.store, lease.conn()).await;
            lease.release_after(&out);
            out.map_err(db_error::<S>)
        })
        .await;
        match (made, self.check_tables().await) {
            (_, Ok(())) => Ok(()),
            (Err(e), Err(_)) => Err(e),
            (Ok(()), Err(e)) => Err(e),
        }
    }

    /// The statements [`create_tables`](Self::create_tables) runs to create the tables
    /// under their configured names (`CREATE TABLE IF NOT EXISTS`, in this version's
    /// layout and the backend's dialect), for a migration of your own.
    pub fn tables_sql(&self) -> Vec<String> {
        self.store.create_tables_sql()
    }

    /// `error` as the call that met it should answer: [`Error::MissingColumn`] if it
    /// was a fatal database error and a table lacks a column, else `error` itself.
    pub(super) async fn explain(&self, error: Error) -> Error {
        match &error {
            Error::Database {
                retryable: false, ..
            } => match self.check_tables().await {
                Err(missing @ Error::MissingColumn { .. }) => missing,
                _ => error,
            },
            _ => error,
        }
    }
}

/// Creates the tables where missing, then adds the history table's missing columns, one
/// at a time. An entity table that lacks one of its three is left to the check: adding
/// `id` or `status` to a table of the user's would only hide a wrong table name.
async fn create<S: Store>(store: &S, conn: &mut S::Conn) -> Result<(), sqlx::Error> {
    for sql in store.create_tables_sql() {
        store.run_sql(conn, sql).await?;
    }
    for _ in 0..HISTORY.len() {
        match missing(store, conn).await? {
            Some((true, column)) => {
                store
                    .run_sql(conn, store.add_column_sql(true, column))
                    .await?
            }
            _ => break,
        }
    }
    Ok(())
}

/// Selects `columns` of a table from no row: an error if it lacks one. Nothing to run
/// (a store whose schema checks nothing) is no error.
async fn probe<S: Store>(
    store: &S,
    conn: &mut S::Conn,
    history: bool,
    columns: &[&'static str],
) -> Result<(), sqlx::Error> {
    let sql = store.probe_sql(history, columns);
    if sql.is_empty() {
        return Ok(());
    }
    store.run_sql(conn, sql).await
}

/// The first column missing: `(in the history table, its name)`.
async fn missing<S: Store>(
    store: &S,
    conn: &mut S::Conn,
) -> Result<Option<(bool, &'static str)>, sqlx::Error> {
    for (history, columns) in [(false, ORDERS), (true, HISTORY)] {
        match probe(store, conn, history, columns).await {
            Ok(()) => continue,
            Err(e) if S::classify(&e) != ErrorClass::Fatal => return Err(e),
            Err(e) => {
                // One of them: which.
                for column in columns {
                    match probe(store, conn, history, &[column]).await {
                        Ok(()) => {}
                        Err(e) if S::classify(&e) != ErrorClass::Fatal => return Err(e),
                        Err(_) => return Ok(Some((history, column))),
                    }
                }
                return Err(e);
            }
        }
    }
    Ok(None)
}
