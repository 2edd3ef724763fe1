//! The audit trail on SQLite.

use crate::backend::audit_sql;
use crate::backend::audit_sql::AuditStatements;
use crate::backend::sql::Params;
use crate::store::audit::{AuditEntry, AuditRow, AuditStore};
use sqlx::sqlite::{Sqlite, SqliteConnection};
use std::sync::LazyLock;

use super::SqliteStore;

static AUDIT: LazyLock<AuditStatements> =
    LazyLock::new(|| AuditStatements::new(super::timers::NOW, Params::Numbered));

impl AuditStore for SqliteStore {
    async fn record_audit(
        &self,
        conn: &mut SqliteConnection,
        entry: &AuditEntry<'_>,
    ) -> Result<(), sqlx::Error> {
        audit_sql::record::<Sqlite>(conn, &AUDIT, entry).await
    }

    async fn list_audit(
        &self,
        conn: &mut SqliteConnection,
        limit: i64,
    ) -> Result<Vec<AuditRow>, sqlx::Error> {
        audit_sql::list::<Sqlite>(conn, &AUDIT, limit).await
    }
}
