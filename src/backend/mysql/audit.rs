//! The audit trail on MySQL/MariaDB.

use crate::backend::audit_sql;
use crate::backend::audit_sql::AuditStatements;
use crate::backend::names::PerNamespace;
use crate::backend::sql::Params;
use crate::store::audit::{AuditEntry, AuditRow, AuditStore};
use sqlx::mysql::{MySql, MySqlConnection};

use super::MySqlStore;

static AUDIT: PerNamespace<AuditStatements> =
    PerNamespace::new(|n| AuditStatements::new(n, super::timers::NOW, Params::Plain));

impl AuditStore for MySqlStore {
    async fn record_audit(
        &self,
        conn: &mut MySqlConnection,
        entry: &AuditEntry<'_>,
    ) -> Result<(), sqlx::Error> {
        audit_sql::record::<MySql>(conn, AUDIT.get(self.names()), entry).await
    }

    async fn list_audit(
        &self,
        conn: &mut MySqlConnection,
        limit: i64,
    ) -> Result<Vec<AuditRow>, sqlx::Error> {
        audit_sql::list::<MySql>(conn, AUDIT.get(self.names()), limit).await
    }
}
