//! Timers on PostgreSQL: [`TimerStore`] over the statements in `backend/timer_sql.rs`.
//! The claim is one `UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED) … RETURNING`.

use std::sync::LazyLock;

use sqlx::postgres::{PgConnection, Postgres};

use super::PgStore;
use crate::backend::sql::{Arg, Binds, Params, Statement};
use crate::backend::timer_sql::{self, TimerStatements, shared_timer_methods};
use crate::timer::{ClaimTimers, ClaimedTimer, TimerStore};

/// The database clock, in milliseconds since the epoch.
pub(super) const NOW: &str = super::NOW;

/// The statements every backend shares, built once.
pub(super) static STATEMENTS: LazyLock<TimerStatements> = LazyLock::new(|| {
    TimerStatements::new(
        NOW,
        "BIGINT",
        (
            "INSERT",
            "ON CONFLICT (machine, entity_id, event, ref_id) DO NOTHING",
        ),
        Params::Dollar,
    )
});

static CLAIM: LazyLock<Statement> = LazyLock::new(|| {
    Statement::shared(
        timer_sql::claim_sql(
            NOW,
            &format!("c.next_at <= {NOW}"),
            "FOR UPDATE SKIP LOCKED",
            true,
        ),
        Params::Dollar,
    )
});

static PURGE: LazyLock<Statement> =
    LazyLock::new(|| Statement::shared(timer_sql::purge_sql(NOW), Params::Dollar));

impl TimerStore for PgStore {
    shared_timer_methods!(Postgres, PgConnection, STATEMENTS);

    async fn claim_timers(
        &self,
        conn: &mut PgConnection,
        claim: &ClaimTimers<'_>,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        timer_sql::claim_returning::<Postgres>(conn, &CLAIM, claim).await
    }

    async fn purge_timers(
        &self,
        conn: &mut PgConnection,
        retention_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let done = PURGE
            .query::<Postgres>(&[Arg::I64(retention_ms), Arg::I64(limit)])?
            .execute(conn)
            .await?;
        Ok(<Postgres as Binds>::rows_affected(&done))
    }
}
