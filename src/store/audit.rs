//! What an operator's actions leave behind: the audit trail the admin page writes for
//! every action it takes (who, what, on which target or filter, how many, when) and
//! shows. Each backend implements [`AuditStore`] in `src/backend/<backend>/audit.rs`.

use std::future::Future;

use super::Store;

/// An operator's action, about to be recorded.
#[derive(Debug, Clone, Copy)]
pub struct AuditEntry<'a> {
    /// Who took it, as the application's access resolver named them.
    pub who: &'a str,
    /// What: `outbox.requeue`, `flows.resume`, `timers.rearm`, …
    pub action: &'a str,
    /// The one thing it acted on, or the filter of a bulk action.
    pub target: &'a str,
    /// How many things it changed.
    pub affected: i64,
}

/// An action as recorded.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct AuditRow {
    /// The row's id, in the order the actions were recorded.
    pub id: i64,
    /// When, in milliseconds since the epoch (the database's clock).
    pub at_ms: i64,
    /// Who.
    pub who: String,
    /// What.
    pub action: String,
    /// On what, or which filter.
    pub target: String,
    /// How many things it changed.
    pub affected: i64,
}

/// A backend of the audit trail.
pub trait AuditStore: Store {
    /// Records an action, at the database's clock.
    fn record_audit(
        &self,
        conn: &mut Self::Conn,
        entry: &AuditEntry<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The latest `limit` actions, newest first.
    fn list_audit(
        &self,
        conn: &mut Self::Conn,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<AuditRow>, sqlx::Error>> + Send;
}
