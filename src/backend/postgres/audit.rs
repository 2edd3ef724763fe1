//! The audit trail on PostgreSQL.

use crate::backend::audit_sql;
use crate::backend::audit_sql::AuditStatements;
use crate::backend::names::PerNamespace;
use crate::backend::sql::Params;
use crate::store::audit::{AuditEntry, AuditRow, AuditStore};
use sqlx::postgres::{PgConnection, Postgres};

use super::PgStore;

static AUDIT: PerNamespace<AuditStatements> =
    PerNamespace::new(|n| AuditStatements::new(n, super::timers::NOW, Params::Dollar));

impl AuditStore for PgStore {
    async fn record_audit(
        &self,
        conn: &mut PgConnection,
        entry: &AuditEntry<'_>,
    ) -> Result<(), sqlx::Error> {
        audit_sql::record::<Postgres>(conn, AUDIT.get(self.names()), entry).await
    }

    async fn list_audit(
        &self,
        conn: &mut PgConnection,
        limit: i64,
    ) -> Result<Vec<AuditRow>, sqlx::Error> {
        audit_sql::list::<Postgres>(conn, AUDIT.get(self.names()), limit).await
    }
}
