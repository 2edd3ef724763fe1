//! Timers on PostgreSQL: [`TimerStore`] over the statements in `backend/timer_sql.rs`.
//! The claim is one `UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED) … RETURNING`.

use crate::backend::timer_sql::{ListBy, OnTimer};
use crate::timer::{FailedTimer, FiredTimer, NewTimer, TimerKey, TimerStats};

use sqlx::postgres::{PgConnection, Postgres};

use super::PgStore;
use crate::backend::names::PerNamespace;
use crate::backend::sql::{Arg, Binds, Params, Statement};
use crate::backend::timer_sql::{self, TimerStatements};
use crate::timer::{ClaimTimers, ClaimedTimer, TimerStore};

/// The database clock, in milliseconds since the epoch.
pub(super) const NOW: &str = super::NOW;

/// The statements every backend shares, built once per namespace.
pub(super) static STATEMENTS: PerNamespace<TimerStatements> = PerNamespace::new(|n| {
    TimerStatements::new(
        n,
        NOW,
        "BIGINT",
        (
            "INSERT",
            "ON CONFLICT (machine, entity_id, event, ref_id) DO NOTHING",
        ),
        Params::Dollar,
    )
});

static CLAIM: PerNamespace<Statement> = PerNamespace::new(|n| {
    Statement::shared(
        timer_sql::claim_sql(
            n,
            NOW,
            (&format!("c.next_at <= {NOW}"), timer_sql::DUE_KEY),
            "FOR UPDATE SKIP LOCKED",
            true,
        ),
        Params::Dollar,
    )
});

static PURGE: PerNamespace<Statement> =
    PerNamespace::new(|n| Statement::shared(timer_sql::purge_sql(n, NOW), Params::Dollar));

impl TimerStore for PgStore {
    async fn schedule_timer(
        &self,
        conn: &mut PgConnection,
        timer: &NewTimer<'_>,
    ) -> Result<bool, sqlx::Error> {
        timer_sql::schedule::<Postgres>(conn, STATEMENTS.get(self.names()), timer).await
    }

    async fn mark_fired(
        &self,
        conn: &mut PgConnection,
        token: &str,
        fired: &[FiredTimer<'_>],
    ) -> Result<u64, sqlx::Error> {
        timer_sql::fired::<Postgres>(conn, STATEMENTS.get(self.names()), token, fired).await
    }

    async fn mark_timer_failed(
        &self,
        conn: &mut PgConnection,
        failed: &FailedTimer<'_>,
    ) -> Result<bool, sqlx::Error> {
        timer_sql::failed::<Postgres>(conn, STATEMENTS.get(self.names()), failed).await
    }

    async fn cancel_timer(
        &self,
        conn: &mut PgConnection,
        key: &TimerKey<'_>,
    ) -> Result<bool, sqlx::Error> {
        {
            let (_, history) = self.tables.quoted('"', self.names());
            let cancel = OnTimer::Cancel { history: &history };
            timer_sql::cancel_or_rearm::<Postgres>(conn, STATEMENTS.get(self.names()), key, cancel)
                .await
        }
    }

    async fn rearm_timer(
        &self,
        conn: &mut PgConnection,
        key: &TimerKey<'_>,
    ) -> Result<bool, sqlx::Error> {
        timer_sql::cancel_or_rearm::<Postgres>(
            conn,
            STATEMENTS.get(self.names()),
            key,
            OnTimer::Rearm,
        )
        .await
    }

    async fn list_timers(
        &self,
        conn: &mut PgConnection,
        status: &str,
        limit: i64,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        let by = ListBy::Status(status, limit);
        timer_sql::list::<Postgres>(conn, STATEMENTS.get(self.names()), by).await
    }

    async fn timers_of(
        &self,
        conn: &mut PgConnection,
        machine: &str,
        entity_id: i64,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        let by = ListBy::Entity(machine, entity_id);
        timer_sql::list::<Postgres>(conn, STATEMENTS.get(self.names()), by).await
    }

    async fn release_timers(
        &self,
        conn: &mut PgConnection,
        token: &str,
        ids: &[i64],
    ) -> Result<u64, sqlx::Error> {
        timer_sql::release::<Postgres>(conn, STATEMENTS.get(self.names()), token, ids).await
    }

    async fn next_due_in_ms(
        &self,
        conn: &mut PgConnection,
        machine: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        timer_sql::next_due::<Postgres>(conn, STATEMENTS.get(self.names()), machine).await
    }

    async fn timer_stats(&self, conn: &mut PgConnection) -> Result<TimerStats, sqlx::Error> {
        timer_sql::stats::<Postgres>(conn, STATEMENTS.get(self.names())).await
    }

    async fn begin_timer_batch(
        &self,
        conn: &mut PgConnection,
        lock_wait: std::time::Duration,
    ) -> Result<Option<usize>, sqlx::Error> {
        let depth = crate::backend::units::begin_rules_unit::<Postgres>(
            conn,
            crate::store::Txn::Own,
            Some("BEGIN"),
            true,
        )
        .await?;
        // For this transaction only: a lock wait ends (55P03, retryable) within it.
        let ms = lock_wait.as_millis().clamp(1, i32::MAX as u128).to_string();
        sqlx::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(format!("{ms}ms"))
            .execute(&mut *conn)
            .await?;
        Ok(Some(depth))
    }

    async fn claim_timers(
        &self,
        conn: &mut PgConnection,
        claim: &ClaimTimers<'_>,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        timer_sql::claim_returning::<Postgres>(conn, CLAIM.get(self.names()), claim).await
    }

    async fn purge_timers(
        &self,
        conn: &mut PgConnection,
        retention_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let done = PURGE
            .get(self.names())
            .query::<Postgres>(&[Arg::I64(retention_ms), Arg::I64(limit)])?
            .execute(conn)
            .await?;
        Ok(<Postgres as Binds>::rows_affected(&done))
    }
}
