//! The audit trail's statements, shared by every backend: written once with `?N`
//! parameters and each backend's millisecond clock.

use sqlx::Executor;

use crate::backend::names::Names;
use crate::backend::sql::{Arg, Binds, Params, Statement};
use crate::store::audit::{AuditEntry, AuditRow};

/// The two statements, built once per backend.
#[derive(Debug)]
pub(crate) struct AuditStatements {
    /// An action recorded: 1 who, 2 action, 3 target, 4 affected.
    insert: Statement,
    /// The latest actions: 1 limit.
    list: Statement,
}

impl AuditStatements {
    /// The statements over `n`'s audit table, with the backend's millisecond clock `now`
    /// (an expression) and its parameter style.
    pub(crate) fn new(n: &Names, now: &str, params: Params) -> Self {
        let audit = &n.audit;
        AuditStatements {
            insert: Statement::shared(
                format!(
                    "INSERT INTO {audit} (at_ms, who, action, target, affected) \
                     VALUES ({now}, ?1, ?2, ?3, ?4)"
                ),
                params,
            ),
            list: Statement::shared(
                format!(
                    "SELECT id, at_ms, who, action, target, affected FROM {audit} \
                     ORDER BY id DESC LIMIT ?1"
                ),
                params,
            ),
        }
    }
}

/// [`AuditStore::record_audit`](crate::store::audit::AuditStore::record_audit).
pub(crate) async fn record<DB: Binds>(
    conn: &mut DB::Connection,
    s: &AuditStatements,
    e: &AuditEntry<'_>,
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let args = [
        Arg::Str(e.who),
        Arg::Str(e.action),
        Arg::Str(e.target),
        Arg::I64(e.affected),
    ];
    s.insert.query::<DB>(&args)?.execute(conn).await?;
    Ok(())
}

/// [`AuditStore::list_audit`](crate::store::audit::AuditStore::list_audit).
pub(crate) async fn list<DB: Binds>(
    conn: &mut DB::Connection,
    s: &AuditStatements,
    limit: i64,
) -> Result<Vec<AuditRow>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    AuditRow: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.list
        .query_as::<DB, AuditRow>(&[Arg::I64(limit)])?
        .fetch_all(conn)
        .await
}
