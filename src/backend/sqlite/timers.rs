//! Timers on SQLite: [`TimerStore`] over the statements in `backend/timer_sql.rs`. The
//! single writer makes the claim one `UPDATE … RETURNING` of the timers its subquery
//! chose.

use crate::backend::timer_sql::{ListBy, OnTimer};
use crate::timer::{FailedTimer, FiredTimer, NewTimer, TimerKey, TimerStats};

use sqlx::sqlite::{Sqlite, SqliteConnection};

use super::SqliteStore;
use crate::backend::names::PerNamespace;
use crate::backend::sql::{Arg, Binds, Params, Statement};
use crate::backend::timer_sql::{self, TimerStatements};
use crate::timer::{ClaimTimers, ClaimedTimer, TimerStore};

/// The database clock, in milliseconds since the epoch.
pub(super) const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// The statements every backend shares, built once per namespace.
pub(super) static STATEMENTS: PerNamespace<TimerStatements> = PerNamespace::new(|n| {
    TimerStatements::new(
        n,
        NOW,
        "INTEGER",
        (
            "INSERT",
            "ON CONFLICT (machine, entity_id, event, ref_id) DO NOTHING",
        ),
        Params::Numbered,
    )
});

/// A timer is due when its next try has come; one whose times are not integers (a
/// column's type is only a hint in SQLite) is claimed at once, to be set aside with the
/// reason (its row does not read as a timer).
const DUE: &str = "(typeof(c.next_at) = 'integer' AND c.next_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)) \
    OR typeof(c.next_at) <> 'integer' OR typeof(c.due_at) <> 'integer'";

/// One entity's timers in due order, a due time that is not an integer first (SQLite
/// orders text after every integer: such a row would wait for the entity's real timers).
const DUE_KEY: &str =
    "CASE WHEN typeof({t}.due_at) = 'integer' THEN {t}.due_at ELSE -9223372036854775808 END";

static CLAIM: PerNamespace<Statement> = PerNamespace::new(|n| {
    Statement::shared(
        timer_sql::claim_sql(n, NOW, (DUE, DUE_KEY), "", false),
        Params::Numbered,
    )
});

static PURGE: PerNamespace<Statement> =
    PerNamespace::new(|n| Statement::shared(timer_sql::purge_sql(n, NOW), Params::Numbered));

impl TimerStore for SqliteStore {
    async fn schedule_timer(
        &self,
        conn: &mut SqliteConnection,
        timer: &NewTimer<'_>,
    ) -> Result<bool, sqlx::Error> {
        timer_sql::schedule::<Sqlite>(conn, STATEMENTS.get(self.names()), timer).await
    }

    async fn mark_fired(
        &self,
        conn: &mut SqliteConnection,
        token: &str,
        fired: &[FiredTimer<'_>],
    ) -> Result<u64, sqlx::Error> {
        timer_sql::fired::<Sqlite>(conn, STATEMENTS.get(self.names()), token, fired).await
    }

    async fn mark_timer_failed(
        &self,
        conn: &mut SqliteConnection,
        failed: &FailedTimer<'_>,
    ) -> Result<bool, sqlx::Error> {
        timer_sql::failed::<Sqlite>(conn, STATEMENTS.get(self.names()), failed).await
    }

    async fn cancel_timer(
        &self,
        conn: &mut SqliteConnection,
        key: &TimerKey<'_>,
    ) -> Result<bool, sqlx::Error> {
        {
            let (_, history) = self.tables.quoted('"', self.names());
            let cancel = OnTimer::Cancel { history: &history };
            timer_sql::cancel_or_rearm::<Sqlite>(conn, STATEMENTS.get(self.names()), key, cancel)
                .await
        }
    }

    async fn rearm_timer(
        &self,
        conn: &mut SqliteConnection,
        key: &TimerKey<'_>,
    ) -> Result<bool, sqlx::Error> {
        timer_sql::cancel_or_rearm::<Sqlite>(
            conn,
            STATEMENTS.get(self.names()),
            key,
            OnTimer::Rearm,
        )
        .await
    }

    async fn list_timers(
        &self,
        conn: &mut SqliteConnection,
        status: &str,
        limit: i64,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        let by = ListBy::Status(status, limit);
        timer_sql::list::<Sqlite>(conn, STATEMENTS.get(self.names()), by).await
    }

    async fn timers_of(
        &self,
        conn: &mut SqliteConnection,
        machine: &str,
        entity_id: i64,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        let by = ListBy::Entity(machine, entity_id);
        timer_sql::list::<Sqlite>(conn, STATEMENTS.get(self.names()), by).await
    }

    async fn release_timers(
        &self,
        conn: &mut SqliteConnection,
        token: &str,
        ids: &[i64],
    ) -> Result<u64, sqlx::Error> {
        timer_sql::release::<Sqlite>(conn, STATEMENTS.get(self.names()), token, ids).await
    }

    async fn next_due_in_ms(
        &self,
        conn: &mut SqliteConnection,
        machine: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        timer_sql::next_due::<Sqlite>(conn, STATEMENTS.get(self.names()), machine).await
    }

    async fn timer_stats(&self, conn: &mut SqliteConnection) -> Result<TimerStats, sqlx::Error> {
        timer_sql::stats::<Sqlite>(conn, STATEMENTS.get(self.names())).await
    }

    async fn begin_timer_batch(
        &self,
        conn: &mut SqliteConnection,
        _lock_wait: std::time::Duration,
    ) -> Result<Option<usize>, sqlx::Error> {
        // No row locks: the batch holds the one write lock, under the writer's turn.
        crate::backend::units::begin_rules_unit::<Sqlite>(
            conn,
            crate::store::Txn::Own,
            Some("BEGIN IMMEDIATE"),
            false,
        )
        .await
        .map(Some)
    }

    async fn claim_timers(
        &self,
        conn: &mut SqliteConnection,
        claim: &ClaimTimers<'_>,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        timer_sql::claim_returning::<Sqlite>(conn, CLAIM.get(self.names()), claim).await
    }

    async fn purge_timers(
        &self,
        conn: &mut SqliteConnection,
        retention_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let done = PURGE
            .get(self.names())
            .query::<Sqlite>(&[Arg::I64(retention_ms), Arg::I64(limit)])?
            .execute(conn)
            .await?;
        Ok(<Sqlite as Binds>::rows_affected(&done))
    }
}
