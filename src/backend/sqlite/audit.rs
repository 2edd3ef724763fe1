//! The audit trail on SQLite.

use crate::backend::audit_sql;
use crate::backend::audit_sql::AuditStatements;
use crate::backend::names::PerNamespace;
use crate::backend::sql::Params;
use crate::store::audit::{AuditEntry, AuditRow, AuditStore};
use sqlx::sqlite::{Sqlite, SqliteConnection};

use super::SqliteStore;

static AUDIT: PerNamespace<AuditStatements> =
    PerNamespace::new(|n| AuditStatements::new(n, super::timers::NOW, Params::Numbered));

impl AuditStore for SqliteStore {
    async fn record_audit(
        &self,
        conn: &mut SqliteConnection,
        entry: &AuditEntry<'_>,
    ) -> Result<(), sqlx::Error> {
        audit_sql::record::<Sqlite>(conn, AUDIT.get(self.names()), entry).await
    }

    async fn list_audit(
        &self,
        conn: &mut SqliteConnection,
        limit: i64,
    ) -> Result<Vec<AuditRow>, sqlx::Error> {
        audit_sql::list::<Sqlite>(conn, AUDIT.get(self.names()), limit).await
    }
}
