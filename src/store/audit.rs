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

/// An action as recorded (its texts read lossily: a byte that is not UTF-8 shows as
/// U+FFFD).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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

crate::support::text::shown_row!(AuditRow {
    id: plain,
    at_ms: plain,
    who: text,
    action: text,
    target: text,
    affected: plain,
});

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
