//! Timers on MySQL/MariaDB: [`TimerStore`] over the statements in
//! `backend/timer_sql.rs`. The claim locks the chosen timers (`FOR UPDATE SKIP LOCKED`),
//! writes its token on them and reads them back, in one short transaction.

use crate::backend::timer_sql::{ListBy, OnTimer};
use crate::timer::{FailedTimer, FiredTimer, NewTimer, TimerKey, TimerStats};

use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::{AssertSqlSafe, Connection};

use super::MySqlStore;
use crate::backend::names::PerNamespace;
use crate::backend::sql::{Arg, Binds, Params, Statement};
use crate::backend::timer_sql::{self, TimerStatements, decoded};
use crate::timer::{ClaimTimers, ClaimedTimer, TimerStore};

/// The database clock, in milliseconds since the epoch.
pub(super) const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

/// The statements every backend shares, built once per namespace.
pub(super) static STATEMENTS: PerNamespace<TimerStatements> = PerNamespace::new(|n| {
    TimerStatements::new(n, NOW, "SIGNED", ("INSERT IGNORE", ""), Params::Plain)
});

/// The claim's choice, locked, of the timers due: 1 machine, 2 limit. A range of the
/// index on (status, next_at), which ends at now.
static CHOOSE: PerNamespace<Statement> = PerNamespace::new(|n| {
    let due = format!("c.next_at <= {NOW}");
    choose(
        n,
        &due,
        "ORDER BY c.next_at",
        "LIMIT ?2 FOR UPDATE SKIP LOCKED",
    )
});

/// The timers whose due time is no time, to be set aside, read without a lock: 1
/// machine, 2 limit. Two ranges of the index on (machine, status, due_at), empty but for
/// a corrupt row. (Tested with the due times in one statement, MariaDB read every pending
/// row of the index on (status, next_at) in each claim: 4–13 ms with 3,000 of them
/// pending.) Not a locking read: the range `due_at < 0` ends on the earliest pending
/// timer, and a locking read keeps that entry locked to its transaction's end (READ
/// COMMITTED or not), so the job that claimed that timer waited for another job's whole
/// batch to mark it fired.
static FIND_NO_TIME: PerNamespace<Statement> =
    PerNamespace::new(|n| choose(n, &no_time(), "", "LIMIT ?2"));

fn no_time() -> String {
    format!("({})", timer_sql::no_time())
}

fn choose(n: &crate::backend::names::Names, when: &str, order: &str, tail: &str) -> Statement {
    // Locked by their ids, the rows are read on the primary key: on the index of
    // `(machine, status, due_at)`, which the test of no time names too, the range's end
    // would be locked again.
    let hint = match order.is_empty() && tail.starts_with("FOR UPDATE") {
        true => "FORCE INDEX (PRIMARY)",
        false => "",
    };
    Statement::shared(
        format!(
            "SELECT c.id FROM {timers} c {hint} WHERE {} {order} {tail}",
            timer_sql::claimable_when(n, NOW, 1, when, timer_sql::DUE_KEY),
            timers = n.timers
        ),
        Params::Plain,
    )
}

/// Up to a limit of fired or cancelled timers, ended before the retention: 1 retention in
/// ms, 2 limit.
static PURGE: PerNamespace<Statement> = PerNamespace::new(|n| {
    Statement::shared(
        format!(
            "DELETE FROM {timers} WHERE status IN ('FIRED', 'CANCELLED') AND fired_at < {NOW} - ?1 \
             ORDER BY id LIMIT ?2",
            timers = n.timers
        ),
        Params::Plain,
    )
});

impl TimerStore for MySqlStore {
    async fn schedule_timer(
        &self,
        conn: &mut MySqlConnection,
        timer: &NewTimer<'_>,
    ) -> Result<bool, sqlx::Error> {
        timer_sql::schedule::<MySql>(conn, STATEMENTS.get(self.names()), timer).await
    }

    async fn mark_fired(
        &self,
        conn: &mut MySqlConnection,
        token: &str,
        fired: &[FiredTimer<'_>],
    ) -> Result<u64, sqlx::Error> {
        timer_sql::fired::<MySql>(conn, STATEMENTS.get(self.names()), token, fired).await
    }

    async fn mark_timer_failed(
        &self,
        conn: &mut MySqlConnection,
        failed: &FailedTimer<'_>,
    ) -> Result<bool, sqlx::Error> {
        timer_sql::failed::<MySql>(conn, STATEMENTS.get(self.names()), failed).await
    }

    async fn cancel_timer(
        &self,
        conn: &mut MySqlConnection,
        key: &TimerKey<'_>,
    ) -> Result<bool, sqlx::Error> {
        {
            let (_, history) = self.tables.quoted('`', self.names());
            let cancel = OnTimer::Cancel { history: &history };
            timer_sql::cancel_or_rearm::<MySql>(conn, STATEMENTS.get(self.names()), key, cancel)
                .await
        }
    }

    async fn rearm_timer(
        &self,
        conn: &mut MySqlConnection,
        key: &TimerKey<'_>,
    ) -> Result<bool, sqlx::Error> {
        timer_sql::cancel_or_rearm::<MySql>(conn, STATEMENTS.get(self.names()), key, OnTimer::Rearm)
            .await
    }

    async fn list_timers(
        &self,
        conn: &mut MySqlConnection,
        status: &str,
        limit: i64,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        let by = ListBy::Status(status, limit);
        timer_sql::list::<MySql>(conn, STATEMENTS.get(self.names()), by).await
    }

    async fn timers_of(
        &self,
        conn: &mut MySqlConnection,
        machine: &str,
        entity_id: i64,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        let by = ListBy::Entity(machine, entity_id);
        timer_sql::list::<MySql>(conn, STATEMENTS.get(self.names()), by).await
    }

    async fn release_timers(
        &self,
        conn: &mut MySqlConnection,
        token: &str,
        ids: &[i64],
    ) -> Result<u64, sqlx::Error> {
        timer_sql::release::<MySql>(conn, STATEMENTS.get(self.names()), token, ids).await
    }

    async fn next_due_in_ms(
        &self,
        conn: &mut MySqlConnection,
        machine: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        timer_sql::next_due::<MySql>(conn, STATEMENTS.get(self.names()), machine).await
    }

    async fn timer_stats(&self, conn: &mut MySqlConnection) -> Result<TimerStats, sqlx::Error> {
        timer_sql::stats::<MySql>(conn, STATEMENTS.get(self.names())).await
    }

    async fn begin_timer_batch(
        &self,
        conn: &mut MySqlConnection,
        lock_wait: std::time::Duration,
    ) -> Result<Option<usize>, sqlx::Error> {
        // A lock wait ends (1205, retryable) within `lock_wait`, in whole seconds (at
        // least 1): for the session, its own value kept first and put back when the
        // batch ends (a connection whose batch did not end is closed). The assignments
        // of one SET run in order.
        let seconds = lock_wait.as_secs().clamp(1, 1_073_741_824);
        sqlx::raw_sql(AssertSqlSafe(format!(
            "SET @orderly_lock_wait = @@SESSION.innodb_lock_wait_timeout, \
             SESSION innodb_lock_wait_timeout = {seconds}"
        )))
        .execute(&mut *conn)
        .await?;
        // READ COMMITTED as the claim's own transaction (no gap locks between jobs); on
        // a Galera node the wait for the cluster's certified writes first, as a rules
        // unit does.
        let begin = if self.causal_reads() == Some(true) {
            "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT 1; \
             SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION"
        } else {
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION"
        };
        crate::backend::units::begin_rules_unit::<MySql>(
            conn,
            crate::store::Txn::Own,
            Some(begin),
            false,
        )
        .await
        .map(Some)
    }

    async fn end_timer_batch(
        &self,
        conn: &mut MySqlConnection,
        commit: bool,
        depth: usize,
    ) -> Result<(), sqlx::Error> {
        use crate::Store;
        self.end_rules_unit(conn, commit, depth).await?;
        sqlx::raw_sql("SET SESSION innodb_lock_wait_timeout = @orderly_lock_wait")
            .execute(&mut *conn)
            .await
            .map(drop)
    }

    async fn claim_timers(
        &self,
        conn: &mut MySqlConnection,
        c: &ClaimTimers<'_>,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        // Inside a job's batch transaction, the claim is part of it.
        if <<MySql as sqlx::Database>::TransactionManager as sqlx_core::transaction::TransactionManager>::get_transaction_depth(conn) > 0 {
            return self.claim_in(conn, c).await;
        }
        let mut tx = conn
            .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
            .await?;
        let claimed = self.claim_in(&mut tx, c).await?;
        tx.commit().await?;
        Ok(claimed)
    }

    async fn purge_timers(
        &self,
        conn: &mut MySqlConnection,
        retention_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let done = PURGE
            .get(self.names())
            .query::<MySql>(&[Arg::I64(retention_ms), Arg::I64(limit)])?
            .execute(conn)
            .await?;
        Ok(<MySql as Binds>::rows_affected(&done))
    }
}

impl MySqlStore {
    /// The claim's statements, inside a transaction of READ COMMITTED.
    async fn claim_in(
        &self,
        tx: &mut MySqlConnection,
        c: &ClaimTimers<'_>,
    ) -> Result<Vec<ClaimedTimer>, sqlx::Error> {
        let mut ids: Vec<i64> = Vec::new();
        // The rows of no time found unlocked, then locked by their ids (the primary key:
        // no other entry is locked), each claimable still.
        let found: Vec<(i64,)> = FIND_NO_TIME
            .get(self.names())
            .query_as::<MySql, (i64,)>(&[Arg::Str(c.machine), Arg::I64(c.limit)])?
            .fetch_all(&mut *tx)
            .await?;
        if !found.is_empty() {
            // Integers read back from the database: safe to write inline.
            let found: Vec<String> = found.iter().map(|(id,)| id.to_string()).collect();
            let lock = choose(
                self.names(),
                &format!("c.id IN ({}) AND {}", found.join(", "), no_time()),
                "",
                "FOR UPDATE SKIP LOCKED",
            );
            // A text new at each call: sent as text (see `Binds::once_text`).
            let locked: Vec<(i64,)> = lock.text(&[Arg::Str(c.machine)])?.all_as(&mut *tx).await?;
            ids.extend(locked.into_iter().map(|(id,)| id));
        }
        let room = c.limit - ids.len() as i64;
        if room > 0 {
            let chosen: Vec<(i64,)> = CHOOSE
                .get(self.names())
                .query_as::<MySql, (i64,)>(&[Arg::Str(c.machine), Arg::I64(room)])?
                .fetch_all(&mut *tx)
                .await?;
            // A row of no time may be due as well: the transaction's own lock does not
            // skip it.
            for (id,) in chosen {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // The ids are integers read back from the database: safe to write inline.
        let ids = ids
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let timers = &self.names().timers;
        // Texts new at each call: sent as text, their values written in (see
        // `Binds::once_text`).
        let hand_over = Statement::shared(
            format!(
                "UPDATE {timers} SET owner_token = ?1, lease_until = {NOW} + ?2, \
                 attempts = {attempt} WHERE status = 'PENDING' AND id IN ({ids})",
                attempt = timer_sql::ATTEMPT
            ),
            Params::Plain,
        );
        timer_sql::execute_once::<MySql>(
            &mut *tx,
            &hand_over,
            &[Arg::Str(c.token), Arg::I64(c.lease_ms)],
        )
        .await?;
        let read = Statement::shared(
            format!(
                "SELECT {} FROM {timers} AS t WHERE t.owner_token = ?1 AND t.id IN ({ids})",
                timer_sql::columns(NOW)
            ),
            Params::Plain,
        );
        let rows = read.text(&[Arg::Str(c.token)])?.fetch_all(&mut *tx).await?;
        Ok(timer_sql::in_due_order(rows.iter().map(decoded).collect()))
    }
}
