//! The timer statements every backend shares, written once with `?N` parameters
//! ([`TimerStatements`]): each backend's `timers.rs` builds them once with its clock, its
//! integer type and its parameter style, calls the functions here from its methods of
//! [`TimerStore`](crate::timer::TimerStore), and writes its own claim and purge.

use sqlx::Executor;

use crate::backend::names::Names;
use crate::backend::sql::{Arg, Binds, Params, Statement};
use crate::timer::{
    Arm, ClaimedTimer, CorruptTimer, FailedTimer, FiredTimer, NewTimer, TimerKey, TimerRow,
    TimerStats,
};

/// A timer's columns as the job and the operator read them, over `timers AS t`, with its
/// lateness on the database's clock `now`.
pub(crate) fn columns(now: &str) -> String {
    prefixed_columns(now, "t.")
}

/// The columns, each name after `prefix` (a table alias with its dot, or nothing: SQLite's
/// `RETURNING` takes no alias).
fn prefixed_columns(now: &str, p: &str) -> String {
    format!(
        "{p}id, {p}machine, {p}entity_id, {p}event, {p}ref_id, {p}state, {p}version, \
         {p}due_at, {p}status, {p}outcome, {p}attempts, {p}last_error, {late} AS late_ms",
        late = late(now, &format!("{p}due_at"))
    )
}

/// How late `due` is at `now`, in milliseconds, saturating: `now - due` overflows a
/// 64-bit integer for a due time below `now - i64::MAX` (a corrupt row), which fails
/// the whole statement on PostgreSQL and MariaDB.
fn late(now: &str, due: &str) -> String {
    format!(
        "CASE WHEN {due} < {now} - 9223372036854775807 THEN 9223372036854775807 \
         ELSE {now} - {due} END"
    )
}

/// The latest due time a timer row may hold: the end of year 9999, in milliseconds since
/// the epoch. A due time outside `0..=MAX_DUE_MS` is no time (a row written by hand, or
/// corrupted): the job sets it aside.
pub(crate) const MAX_DUE_MS: i64 = 253_402_300_799_999;

/// The key that orders one entity's pending timers, of the timer aliased `{t}`: its due
/// time where the backend stores one. SQLite stores any type in a column, and orders
/// text after every integer: there a due time that is not an integer orders first, so
/// that the row is claimed (and set aside) at once rather than after the entity's real
/// timers.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const DUE_KEY: &str = "{t}.due_at";

/// Whether the timer `c` may be claimed for machine `?{machine}` now: pending, due (its
/// next try has come, or its due time is no time, or, where `due` adds it, its times are
/// not integers: such a row is claimed to be set aside), not under a live lease, and the earliest pending timer of its
/// entity (so one entity's timers fire one after another, in due order).
/// `key` orders one entity's timers ([`DUE_KEY`], with `{t}` for the alias).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn claimable(n: &Names, now: &str, machine: usize, due: &str, key: &str) -> String {
    claimable_when(n, now, machine, &format!("({due} OR {})", no_time()), key)
}

/// Whether the timer `c`'s due time is no time (outside `0..=`[`MAX_DUE_MS`]).
pub(crate) fn no_time() -> String {
    format!("c.due_at < 0 OR c.due_at > {MAX_DUE_MS}")
}

/// [`claimable`] with the whole test of when the timer `c` may be claimed in `when`
/// (for a backend that chooses the due and the rows of no time apart, each on its index).
pub(crate) fn claimable_when(
    n: &Names,
    now: &str,
    machine: usize,
    when: &str,
    key: &str,
) -> String {
    let timers = &n.timers;
    let (e, c) = (key.replace("{t}", "e"), key.replace("{t}", "c"));
    format!(
        "c.status = 'PENDING' AND c.machine = ?{machine} AND {when} \
         AND c.lease_until <= {now} \
         AND NOT EXISTS (SELECT 1 FROM {timers} e WHERE e.machine = c.machine \
             AND e.entity_id = c.entity_id AND e.status = 'PENDING' \
             AND ({e} < {c} OR ({e} = {c} AND e.id < c.id)))"
    )
}

/// One more attempt, saturating.
pub(crate) const ATTEMPT: &str = "CASE WHEN attempts < 0 THEN 1 WHEN attempts >= 2147483646 THEN 2147483647 ELSE attempts + 1 END";

/// The statements of the methods every backend shares, built once.
#[derive(Debug)]
pub(crate) struct TimerStatements {
    /// A timer inserted unless one with its key exists: 1 machine, 2 entity, 3 event,
    /// 4 reference, 5 state, 6 version, 7 delay in ms.
    insert: Statement,
    /// The table, the clock and the parameter style, for the statements built per call.
    timers: String,
    now: String,
    params: Params,
    /// A claimed timer back to PENDING after a delay, or DEAD: 1 dead, 2 retry in ms,
    /// 3 error, 4 id, 5 token.
    failed: Statement,
    /// A pending or dead timer cancelled, unless the history holds its event under its
    /// reference: 1 machine, 2 entity, 3 event, 4 reference; `{history}` stands for the
    /// store's history table.
    cancel: String,
    /// A dead timer pending again, due now: 1 machine, 2 entity, 3 event, 4 reference.
    rearm: Statement,
    /// Timers in a status, oldest due first: 1 status, 2 limit.
    list: Statement,
    /// An entity's timers, by due time: 1 machine, 2 entity.
    of_entity: Statement,
    /// Counts.
    stats: Statement,
    /// How long until the next pending timer of a machine falls due: 1 machine.
    next_due: Statement,
}

impl TimerStatements {
    /// The statements with the backend's millisecond clock `now` (an expression), its
    /// 64-bit integer type name for casts, the insert that does nothing on a duplicate key
    /// (its verb, and the text that ends it), and its parameter style.
    pub(crate) fn new(
        n: &Names,
        now: &str,
        int: &str,
        (insert, on_duplicate): (&str, &str),
        params: Params,
    ) -> Self {
        let s = |sql: String| Statement::shared(sql, params);
        let columns = columns(now);
        let timers = &n.timers;
        TimerStatements {
            insert: s(format!(
                "{insert} INTO {timers} (machine, entity_id, event, ref_id, state, version, due_at, \
                     next_at, created_at) \
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, n.ms + ?7, n.ms + ?7, n.ms \
                 FROM (SELECT {now} AS ms) n WHERE 1 = 1 {on_duplicate}"
            )),
            timers: timers.clone(),
            now: now.to_string(),
            params,
            failed: s(format!(
                "UPDATE {timers} SET status = CASE WHEN ?1 THEN 'DEAD' ELSE 'PENDING' END, \
                     next_at = {now} + ?2, last_error = ?3, owner_token = NULL, lease_until = 0 \
                 WHERE id = ?4 AND owner_token = ?5 AND status = 'PENDING'"
            )),
            cancel: format!(
                "UPDATE {timers} SET status = 'CANCELLED', fired_at = {now}, owner_token = NULL, \
                     lease_until = 0 \
                 WHERE machine = ?1 AND entity_id = ?2 AND event = ?3 AND ref_id = ?4 \
                   AND status IN ('PENDING', 'DEAD') AND (owner_token IS NULL OR lease_until <= {now}) \
                   AND NOT EXISTS (SELECT 1 FROM {{history}} h \
                       WHERE h.order_id = ?2 AND h.event = ?3 AND h.ref_id = ?4)"
            ),
            rearm: s(format!(
                "UPDATE {timers} SET status = 'PENDING', attempts = 0, next_at = {now}, \
                     last_error = NULL, owner_token = NULL, lease_until = 0 \
                 WHERE machine = ?1 AND entity_id = ?2 AND event = ?3 AND ref_id = ?4 \
                   AND status = 'DEAD'"
            )),
            list: s(format!(
                "SELECT {columns} FROM {timers} AS t WHERE t.status = ?1 \
                 ORDER BY t.due_at, t.id LIMIT ?2"
            )),
            of_entity: s(format!(
                "SELECT {columns} FROM {timers} AS t WHERE t.machine = ?1 AND t.entity_id = ?2 \
                 ORDER BY t.due_at, t.id"
            )),
            next_due: s(format!(
                "SELECT next_at - {now} FROM {timers} WHERE status = 'PENDING' \
                     AND next_at > {now} AND machine = ?1 ORDER BY next_at LIMIT 1"
            )),
            stats: s(format!(
                "SELECT CAST(COALESCE(SUM(CASE WHEN status = 'PENDING' THEN 1 ELSE 0 END), 0) AS {int}) AS pending, \
                        CAST(COALESCE(SUM(CASE WHEN status = 'PENDING' AND due_at <= n.ms THEN 1 ELSE 0 END), 0) AS {int}) AS due, \
                        CAST(COALESCE(SUM(CASE WHEN status = 'DEAD' THEN 1 ELSE 0 END), 0) AS {int}) AS dead, \
                        CAST(COALESCE({oldest}, 0) AS {int}) AS oldest_late_ms \
                 FROM {timers} CROSS JOIN (SELECT {now} AS ms) n \
                 WHERE status IN ('PENDING', 'DEAD') GROUP BY n.ms",
                oldest = late(
                    "n.ms",
                    "MIN(CASE WHEN status = 'PENDING' AND due_at <= n.ms THEN due_at END)"
                )
            )),
        }
    }
}

/// One claimed or listed row, decoded on its own: a row whose columns do not read as a
/// [`TimerRow`] is a [`CorruptTimer`] (with its id), so that one bad row never fails the
/// claim of the others.
pub(crate) fn decoded<'r, R>(row: &'r R) -> ClaimedTimer
where
    R: sqlx::Row,
    TimerRow: sqlx::FromRow<'r, R>,
    &'static str: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let timer = <TimerRow as sqlx::FromRow<'r, R>>::from_row(row).map_err(|e| CorruptTimer {
        id: row.try_get::<i64, _>("id").ok(),
        reason: format!("unreadable row: {e}"),
    })?;
    if !(0..=MAX_DUE_MS).contains(&timer.due_at) {
        return Err(CorruptTimer {
            id: Some(timer.id),
            reason: format!(
                "due_at {} is no time (milliseconds since 1970 up to the year 9999)",
                timer.due_at
            ),
        });
    }
    Ok(timer)
}

/// The insert's arguments for one of `arm`'s timers, firing with `ref_id`.
fn arm_args<'a>(arm: &Arm<'a>, ref_id: &'a str, event: &'a str, after_ms: u64) -> [Arg<'a>; 7] {
    [
        Arg::Str(arm.machine),
        Arg::I64(arm.entity_id),
        Arg::Str(event),
        Arg::Str(ref_id),
        Arg::OptStr(Some(arm.state)),
        Arg::OptI64(Some(arm.version)),
        Arg::I64(i64::try_from(after_ms).unwrap_or(i64::MAX)),
    ]
}

/// [`Store::arm_timers`](crate::Store::arm_timers): each timer inserted unless its key is
/// there.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) async fn arm<DB: Binds>(
    conn: &mut DB::Connection,
    s: &TimerStatements,
    arm: &Arm<'_>,
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let ref_id = arm.ref_id();
    for (event, after_ms) in arm.timers {
        let args = arm_args(arm, &ref_id, event, *after_ms);
        s.insert.query::<DB>(&args)?.execute(&mut *conn).await?;
    }
    Ok(())
}

/// [`arm`] on MySQL/MariaDB, each insert sent as text: it runs in the transition's unit,
/// on a caller's connection inside `.within`, where a prepare dropped with the call
/// would leave that connection out of step (`backend/mysql/text.rs`).
#[cfg(feature = "mysql")]
pub(crate) async fn arm_as_text(
    conn: &mut sqlx::mysql::MySqlConnection,
    s: &TimerStatements,
    arm: &Arm<'_>,
) -> Result<(), sqlx::Error> {
    let ref_id = arm.ref_id();
    for (event, after_ms) in arm.timers {
        let args = arm_args(arm, &ref_id, event, *after_ms);
        s.insert.text(&args)?.execute(&mut *conn).await?;
    }
    Ok(())
}

/// [`TimerStore::schedule_timer`](crate::timer::TimerStore::schedule_timer).
pub(crate) async fn schedule<DB: Binds>(
    conn: &mut DB::Connection,
    s: &TimerStatements,
    t: &NewTimer<'_>,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let args = [
        Arg::Str(t.key.machine),
        Arg::I64(t.key.entity_id),
        Arg::Str(t.key.event),
        Arg::Str(t.key.ref_id),
        Arg::OptStr(t.at.map(|(state, _)| state)),
        Arg::OptI64(t.at.map(|(_, version)| version)),
        Arg::I64(t.after_ms),
    ];
    let done = s.insert.query::<DB>(&args)?.execute(conn).await?;
    Ok(DB::rows_affected(&done) == 1)
}

/// [`TimerStore::mark_fired`](crate::timer::TimerStore::mark_fired): one statement for
/// the whole batch, its ids and outcomes written inline (integers, and the outcome words
/// orderly writes), its notes bound; not kept prepared (its text changes with the batch).
pub(crate) async fn fired<DB: Binds + sqlx::database::HasStatementCache>(
    conn: &mut DB::Connection,
    s: &TimerStatements,
    token: &str,
    fired: &[FiredTimer<'_>],
) -> Result<u64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    if fired.is_empty() {
        return Ok(0);
    }
    let mut args = vec![Arg::Str(token)];
    let (mut outcomes, mut notes, mut ids) = (String::new(), String::new(), Vec::new());
    for f in fired {
        let outcome = OUTCOMES.iter().find(|o| **o == f.outcome).ok_or_else(|| {
            sqlx::Error::Protocol(format!("{:?} is no outcome of a timer", f.outcome))
        })?;
        let id = f.id;
        outcomes.push_str(&format!(" WHEN {id} THEN '{outcome}'"));
        if let Some(note) = f.note {
            args.push(Arg::Str(note));
            notes.push_str(&format!(" WHEN {id} THEN ?{}", args.len()));
        }
        ids.push(id.to_string());
    }
    let notes = if notes.is_empty() {
        "NULL".to_string()
    } else {
        format!("CASE id{notes} ELSE NULL END")
    };
    let sql = format!(
        "UPDATE {timers} SET status = 'FIRED', fired_at = {now}, owner_token = NULL, lease_until = 0, \
             outcome = CASE id{outcomes} END, last_error = {notes} \
         WHERE owner_token = ?1 AND status = 'PENDING' AND id IN ({ids})",
        timers = s.timers,
        now = s.now,
        ids = ids.join(", ")
    );
    execute_once::<DB>(conn, &Statement::shared(sql, s.params), &args).await
}

/// Runs `statement`, whose text is new at each call, with `args`: as text with its values
/// written in where the backend sends it so ([`Binds::once_text`]), else prepared and not
/// kept. The rows it changed.
pub(crate) async fn execute_once<DB: Binds + sqlx::database::HasStatementCache>(
    conn: &mut DB::Connection,
    statement: &Statement,
    args: &[Arg<'_>],
) -> Result<u64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let done = match DB::once_text(statement, args) {
        Some(text) => {
            sqlx::raw_sql(sqlx::AssertSqlSafe(text?))
                .execute(conn)
                .await?
        }
        None => {
            statement
                .query::<DB>(args)?
                .persistent(false)
                .execute(conn)
                .await?
        }
    };
    Ok(DB::rows_affected(&done))
}

/// [`TimerStore::release_timers`](crate::timer::TimerStore::release_timers): one
/// statement, its ids written inline (integers); not kept prepared.
pub(crate) async fn release<DB: Binds + sqlx::database::HasStatementCache>(
    conn: &mut DB::Connection,
    s: &TimerStatements,
    token: &str,
    ids: &[i64],
) -> Result<u64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    if ids.is_empty() {
        return Ok(0);
    }
    let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
    let sql = format!(
        "UPDATE {timers} SET owner_token = NULL, lease_until = 0, \
             attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END \
         WHERE owner_token = ?1 AND status = 'PENDING' AND id IN ({ids})",
        timers = s.timers,
        ids = ids.join(", ")
    );
    execute_once::<DB>(conn, &Statement::shared(sql, s.params), &[Arg::Str(token)]).await
}

/// The outcomes a fired timer records.
const OUTCOMES: [&str; 4] = ["applied", "replayed", "moot", "refused"];

/// [`TimerStore::mark_timer_failed`](crate::timer::TimerStore::mark_timer_failed).
pub(crate) async fn failed<DB: Binds>(
    conn: &mut DB::Connection,
    s: &TimerStatements,
    f: &FailedTimer<'_>,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let args = [
        Arg::Bool(f.dead),
        Arg::I64(f.retry_in_ms),
        Arg::Str(f.error),
        Arg::I64(f.id),
        Arg::Str(f.token),
    ];
    let done = s.failed.query::<DB>(&args)?.execute(conn).await?;
    Ok(DB::rows_affected(&done) == 1)
}

/// What [`cancel_or_rearm`] does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OnTimer<'a> {
    /// Cancels the timer unless the history table (its name as SQL) holds its event
    /// under its reference: a job applied it, and did not live to record it fired.
    Cancel { history: &'a str },
    /// Re-arms a dead timer.
    Rearm,
}

/// [`TimerStore::cancel_timer`](crate::timer::TimerStore::cancel_timer) and
/// [`TimerStore::rearm_timer`](crate::timer::TimerStore::rearm_timer).
pub(crate) async fn cancel_or_rearm<DB: Binds>(
    conn: &mut DB::Connection,
    s: &TimerStatements,
    key: &TimerKey<'_>,
    what: OnTimer<'_>,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let args = [
        Arg::Str(key.machine),
        Arg::I64(key.entity_id),
        Arg::Str(key.event),
        Arg::Str(key.ref_id),
    ];
    let done = match what {
        OnTimer::Rearm => s.rearm.query::<DB>(&args)?.execute(conn).await?,
        OnTimer::Cancel { history } => {
            // Built per call: the history table is the store's, the rest the namespace's.
            let cancel = Statement::shared(s.cancel.replace("{history}", history), s.params);
            cancel.query::<DB>(&args)?.execute(conn).await?
        }
    };
    Ok(DB::rows_affected(&done) == 1)
}

/// [`TimerStore::list_timers`](crate::timer::TimerStore::list_timers) (`entity` `None`)
/// and [`TimerStore::timers_of`](crate::timer::TimerStore::timers_of). Each row decoded
/// on its own.
pub(crate) async fn list<DB: Binds>(
    conn: &mut DB::Connection,
    s: &TimerStatements,
    by: ListBy<'_>,
) -> Result<Vec<ClaimedTimer>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    TimerRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    &'static str: sqlx::ColumnIndex<DB::Row>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
{
    let rows = match by {
        ListBy::Status(status, limit) => {
            s.list
                .query::<DB>(&[Arg::Str(status), Arg::I64(limit)])?
                .fetch_all(conn)
                .await?
        }
        ListBy::Entity(machine, entity_id) => {
            s.of_entity
                .query::<DB>(&[Arg::Str(machine), Arg::I64(entity_id)])?
                .fetch_all(conn)
                .await?
        }
    };
    Ok(rows.iter().map(decoded).collect())
}

/// Which timers [`list`] reads.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ListBy<'a> {
    /// Up to a limit in a status.
    Status(&'a str, i64),
    /// One entity's, of one machine.
    Entity(&'a str, i64),
}

/// [`TimerStore::timer_stats`](crate::timer::TimerStore::timer_stats).
pub(crate) async fn stats<DB: Binds>(
    conn: &mut DB::Connection,
    s: &TimerStatements,
) -> Result<TimerStats, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    TimerStats: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    Ok(s.stats
        .query_as::<DB, TimerStats>(&[])?
        .fetch_optional(conn)
        .await?
        .unwrap_or_default())
}

/// [`TimerStore::next_due_in_ms`](crate::timer::TimerStore::next_due_in_ms).
pub(crate) async fn next_due<DB: Binds>(
    conn: &mut DB::Connection,
    s: &TimerStatements,
    machine: &str,
) -> Result<Option<i64>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let row: Option<(i64,)> = s
        .next_due
        .query_as::<DB, (i64,)>(&[Arg::Str(machine)])?
        .fetch_optional(conn)
        .await?;
    Ok(row.map(|(ms,)| ms))
}

/// The purge every backend but MySQL/MariaDB writes (which takes no `LIMIT` in an `IN`
/// subquery): 1 retention in ms, 2 limit.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn purge_sql(n: &Names, now: &str) -> String {
    let timers = &n.timers;
    format!(
        "DELETE FROM {timers} WHERE id IN (SELECT id FROM {timers} \
             WHERE status IN ('FIRED', 'CANCELLED') AND fired_at < {now} - ?1 LIMIT ?2)"
    )
}

/// The single-statement claim (SQLite, PostgreSQL): the chosen rows' claim written and
/// returned. `due` is the test that a timer is due and `key` orders one entity's timers ([`claimable`]); `lock` ends the subquery (`FOR UPDATE SKIP LOCKED`, or nothing); `from`
/// says whether the backend joins the chosen rows (`UPDATE … FROM`) rather than
/// matching them with `IN`. 1 token, 2 lease in ms, 3 machine, 4 limit.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn claim_sql(
    n: &Names,
    now: &str,
    (due, key): (&str, &str),
    lock: &str,
    from: bool,
) -> String {
    let timers = &n.timers;
    // Ordered by `next_at` alone, the order of the index on (status, next_at): the scan
    // stops at the batch's last row (with a tie-break on `id` too, PostgreSQL sorted
    // every pending row first, 40 ms a claim over 20,000).
    let choose = format!(
        "SELECT c.id FROM {timers} c WHERE {claimable} ORDER BY c.next_at LIMIT ?4 {lock}",
        claimable = claimable(n, now, 3, due, key)
    );
    let set = format!("owner_token = ?1, lease_until = {now} + ?2, attempts = {ATTEMPT}");
    if from {
        let columns = prefixed_columns(now, "t.");
        format!(
            "UPDATE {timers} AS t SET {set} FROM ({choose}) s WHERE t.id = s.id RETURNING {columns}"
        )
    } else {
        let columns = prefixed_columns(now, "");
        format!("UPDATE {timers} SET {set} WHERE id IN ({choose}) RETURNING {columns}")
    }
}

/// Runs a claim statement built by [`claim_sql`], each row decoded on its own, earliest
/// due first.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) async fn claim_returning<DB: Binds>(
    conn: &mut DB::Connection,
    statement: &Statement,
    c: &crate::timer::ClaimTimers<'_>,
) -> Result<Vec<ClaimedTimer>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    TimerRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    &'static str: sqlx::ColumnIndex<DB::Row>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
{
    let args = [
        Arg::Str(c.token),
        Arg::I64(c.lease_ms),
        Arg::Str(c.machine),
        Arg::I64(c.limit),
    ];
    let rows = statement.query::<DB>(&args)?.fetch_all(conn).await?;
    Ok(in_due_order(rows.iter().map(decoded).collect()))
}

/// Claimed rows earliest due first (rows that did not read last).
pub(crate) fn in_due_order(mut rows: Vec<ClaimedTimer>) -> Vec<ClaimedTimer> {
    rows.sort_by_key(|r| match r {
        Ok(t) => (0, t.due_at, t.id),
        Err(c) => (1, 0, c.id.unwrap_or(0)),
    });
    rows
}
