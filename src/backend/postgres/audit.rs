//! The audit trail on PostgreSQL.

use crate::backend::audit_sql;
use crate::backend::audit_sql::AuditStatements;
use crate::backend::sql::Params;
use crate::store::audit::{AuditEntry, AuditRow, AuditStore};
use sqlx::postgres::{PgConnection, Postgres};
use std::sync::LazyLock;

use super::PgStore;

static AUDIT: LazyLock<AuditStatements> =
    LazyLock::new(|| AuditStatements::new(super::timers::NOW, Params::Dollar));

impl AuditStore for PgStore {
    async fn record_audit(
        &self,
        conn: &mut PgConnection,
        entry: &AuditEntry<'_>,
    ) -> Result<(), sqlx::Error> {
        audit_sql::record::<Postgres>(conn, &AUDIT, entry).await
    }

    async fn list_audit(
        &self,
        conn: &mut PgConnection,
        limit: i64,
    ) -> Result<Vec<AuditRow>, sqlx::Error> {
        audit_sql::list::<Postgres>(conn, &AUDIT, limit).await
    }
}
