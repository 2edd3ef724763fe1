//! The operators' lookups, shared by every backend: written once with `?N` parameters,
//! each backend's millisecond clock and its outbox event columns.

use sqlx::{Executor, Row};

use crate::admin::lookup::{
    EventFilter, EventPage, EventsBy, FlowHit, Held, HeldKey, HeldRecord, PrefixHits, RecordHit,
    StuckRecord, TimerAt, TimerPage,
};
use crate::backend::names::Names;
use crate::backend::outbox_sql::readable;
use crate::backend::sql::{Arg, Binds, Params, Statement};
use crate::outbox::{EventKey, EventRow};
use crate::store::timers::TimerRow;

/// The statements, built once per backend.
#[derive(Debug)]
pub(crate) struct LookupStatements {
    /// 1 key, 2 limit.
    records: Statement,
    /// 1 key, 2 limit.
    flows: Statement,
    /// 1 reference, 2 limit.
    events_by_ref: Statement,
    /// Records, flows and events whose key (of an event, its reference) starts with a
    /// text: 1 text, 2 limit.
    prefixed: [Statement; 3],
    /// 1 machine, 2 entity, 3 limit.
    events_of_entity: Statement,
    /// 1 machine, 2 entity, 3 version, 4 limit.
    event_by_id: Statement,
    /// 1 limit.
    stuck: Statement,
    /// 1 scope, 2 limit.
    stuck_of_scope: Statement,
    /// How many records are stuck: no parameters.
    stuck_count: Statement,
    /// How many records of a scope are stuck: 1 scope.
    stuck_count_of_scope: Statement,
    /// Events of a status a filter matches, in key order: 1 status, 2 machine, 3 event,
    /// 4 text of the last error, 5 age in ms (2 to 5 each `NULL` for any); the first
    /// page, 6 limit; then a page past a key, 6 machine, 7 entity, 8 version of the key
    /// to read past, 9 limit. (Two statements: the key compared as a row is where the
    /// index scan starts, where an `OR` of it with `NULL` would be a filter on every
    /// entry before it.)
    in_status: [Statement; 2],
    /// How many events of a status a filter matches: 1 to 5 as `in_status`'s.
    count_in_status: Statement,
    /// Records stuck, then in flight, in lease order after a key: 1 scope (`NULL` for
    /// all), 2 lease end, 3 scope, 4 key of the record to read past (2 `NULL` for the
    /// first page), 5 limit.
    held: [Statement; 2],
    /// How many records are stuck, then in flight: 1 scope (`NULL` for all).
    held_count: [Statement; 2],
    /// How many timers are in a status: 1 status.
    timers_in: Statement,
    /// How many events were published in the last milliseconds: 1 milliseconds (a
    /// published event's `next_at` is when it was published: a range of the status
    /// index).
    published_since: Statement,
    /// Timers of a status in the order of their next attempt, with it (`next_at`):
    /// 1 status; the first page, 2 limit; then a page past a timer, 2 its next attempt,
    /// 3 its id, 4 limit.
    timers_page: [Statement; 2],
}

impl LookupStatements {
    /// The statements with the backend's millisecond clock `now` (an expression), its
    /// outbox event columns (over the alias `o`), an event's age in milliseconds (an
    /// expression over `o`), its function of a text's 1-based position in another
    /// (`instr`, `strpos`: case counts) and its parameter style.
    pub(crate) fn new(
        n: &Names,
        now: &str,
        event_columns: &str,
        age_ms: &str,
        position: &str,
        params: Params,
    ) -> Self {
        let Names {
            outbox,
            records,
            flows,
            timers,
            ..
        } = n;
        let s = |sql: String| Statement::shared(sql, params);
        let events = |filter: &str, order: &str, limit: &str| {
            s(format!(
                "SELECT {event_columns} FROM {outbox} AS o WHERE {filter} ORDER BY {order} LIMIT {limit}"
            ))
        };
        let key = "o.machine, o.entity_id, o.version";
        let stuck_where = |scope: &str| {
            format!("{scope}status = 'PROCESSING' AND lease_until <= {now} AND expires_at > {now}")
        };
        let stuck = |scope: &str, limit: &str| {
            s(format!(
                "SELECT scope, idem_key, attempt, {now} - lease_until AS stuck_ms, \
                        {now} - created_at AS age_ms \
                 FROM {records} WHERE {} ORDER BY lease_until LIMIT {limit}",
                stuck_where(scope)
            ))
        };
        let stuck_count = |scope: &str| {
            s(format!(
                "SELECT COUNT(*) FROM {records} WHERE {}",
                stuck_where(scope)
            ))
        };
        let held_where = |held: Held| {
            let lease = match held {
                Held::Stuck => format!("lease_until <= {now} AND expires_at > {now}"),
                Held::InFlight => format!("lease_until > {now}"),
            };
            format!("status = 'PROCESSING' AND {lease} AND (?1 IS NULL OR scope = ?1)")
        };
        let held = |held: Held| {
            s(format!(
                "SELECT scope, idem_key, attempt, lease_until, lease_until - {now} AS lease_left_ms, \
                        {now} - created_at AS age_ms \
                 FROM {records} WHERE {} AND (?2 IS NULL OR lease_until > ?2 OR (lease_until = ?2 \
                     AND (scope > ?3 OR (scope = ?3 AND idem_key > ?4)))) \
                 ORDER BY lease_until, scope, idem_key LIMIT ?5",
                held_where(held)
            ))
        };
        let held_count = |held: Held| {
            s(format!(
                "SELECT COUNT(*) FROM {records} WHERE {}",
                held_where(held)
            ))
        };
        let matching = format!(
            "o.status = ?1 AND (?2 IS NULL OR o.machine = ?2) AND (?3 IS NULL OR o.event = ?3) \
             AND (?4 IS NULL OR {position}(o.last_error, ?4) > 0) AND (?5 IS NULL OR {age_ms} >= ?5)"
        );
        LookupStatements {
            in_status: [
                events(&matching, key, "?6"),
                // The leading bounds repeat what the row comparison says, for the
                // planners that start an index range only at a column's own bound
                // (MySQL, MariaDB).
                events(
                    &format!(
                        "{matching} AND o.machine >= ?6 AND (o.machine > ?6 OR o.entity_id >= ?7) \
                         AND ({key}) > (?6, ?7, ?8)"
                    ),
                    key,
                    "?9",
                ),
            ],
            count_in_status: s(format!(
                "SELECT COUNT(*) FROM {outbox} AS o WHERE {matching}"
            )),
            records: s(format!(
                "SELECT scope, idem_key, status, attempt, lease_until - {now} AS lease_left_ms, \
                        {now} - created_at AS age_ms \
                 FROM {records} WHERE idem_key = ?1 ORDER BY scope LIMIT ?2"
            )),
            flows: s(format!(
                "SELECT kind, flow_key, status, park_reason FROM {flows} \
                 WHERE flow_key = ?1 ORDER BY kind LIMIT ?2"
            )),
            events_by_ref: events("o.ref_id = ?1", key, "?2"),
            prefixed: [
                s(format!(
                    "SELECT scope, idem_key, status, attempt, lease_until - {now} AS lease_left_ms, \
                            {now} - created_at AS age_ms \
                     FROM {records} WHERE {position}(idem_key, ?1) = 1 ORDER BY idem_key, scope LIMIT ?2"
                )),
                s(format!(
                    "SELECT kind, flow_key, status, park_reason FROM {flows} \
                     WHERE {position}(flow_key, ?1) = 1 ORDER BY flow_key, kind LIMIT ?2"
                )),
                events(&format!("{position}(o.ref_id, ?1) = 1"), key, "?2"),
            ],
            events_of_entity: events(
                "o.machine = ?1 AND o.entity_id = ?2",
                "o.version DESC",
                "?3",
            ),
            event_by_id: events(
                "o.machine = ?1 AND o.entity_id = ?2 AND o.version = ?3",
                key,
                "?4",
            ),
            stuck: stuck("", "?1"),
            stuck_of_scope: stuck("scope = ?1 AND ", "?2"),
            stuck_count: stuck_count(""),
            stuck_count_of_scope: stuck_count("scope = ?1 AND "),
            held: [held(Held::Stuck), held(Held::InFlight)],
            held_count: [held_count(Held::Stuck), held_count(Held::InFlight)],
            timers_in: s(format!("SELECT COUNT(*) FROM {timers} WHERE status = ?1")),
            published_since: s(format!(
                "SELECT COUNT(*) FROM {outbox} WHERE status = 'PUBLISHED' AND next_at > {now} - ?1"
            )),
            timers_page: {
                let page = |past: &str, limit: &str| {
                    s(format!(
                        "SELECT {}, t.next_at AS next_at FROM {timers} AS t \
                         WHERE t.status = ?1{past} ORDER BY t.next_at, t.id LIMIT {limit}",
                        crate::backend::timer_sql::columns(now)
                    ))
                };
                // The leading bound repeats what the row comparison says, for the
                // planners that start an index range only at a column's own bound.
                [
                    page("", "?2"),
                    page(
                        " AND t.next_at >= ?2 AND (t.next_at, t.id) > (?2, ?3)",
                        "?4",
                    ),
                ]
            },
        }
    }
}

/// [`LookupStore::records_by_key`](crate::admin::lookup::LookupStore::records_by_key).
pub(crate) async fn records<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    key: &str,
    limit: i64,
) -> Result<Vec<RecordHit>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    RecordHit: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.records
        .query_as::<DB, RecordHit>(&[Arg::Str(key), Arg::I64(limit)])?
        .fetch_all(conn)
        .await
}

/// [`LookupStore::by_prefix`](crate::admin::lookup::LookupStore::by_prefix): a row
/// that does not read as an event is left out (and named in the log).
pub(crate) async fn prefixed<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    prefix: &str,
    limit: i64,
) -> Result<PrefixHits, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    RecordHit: for<'r> sqlx::FromRow<'r, DB::Row>,
    FlowHit: for<'r> sqlx::FromRow<'r, DB::Row>,
    EventRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    &'static str: sqlx::ColumnIndex<DB::Row>,
    String: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    Vec<u8>: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    i32: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
{
    let args = [Arg::Str(prefix), Arg::I64(limit)];
    let [records, flows, events] = &s.prefixed;
    let records = records
        .query_as::<DB, RecordHit>(&args)?
        .fetch_all(&mut *conn)
        .await?;
    let flows = flows
        .query_as::<DB, FlowHit>(&args)?
        .fetch_all(&mut *conn)
        .await?;
    let rows = events.query::<DB>(&args)?.fetch_all(&mut *conn).await?;
    Ok(PrefixHits {
        records,
        flows,
        events: readable(&rows),
    })
}

/// [`LookupStore::flows_by_key`](crate::admin::lookup::LookupStore::flows_by_key).
pub(crate) async fn flows<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    key: &str,
    limit: i64,
) -> Result<Vec<FlowHit>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    FlowHit: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.flows
        .query_as::<DB, FlowHit>(&[Arg::Str(key), Arg::I64(limit)])?
        .fetch_all(conn)
        .await
}

/// [`LookupStore::events_by`](crate::admin::lookup::LookupStore::events_by): a row that
/// does not read as an event is left out (and named in the log).
pub(crate) async fn events<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    by: EventsBy<'_>,
    limit: i64,
) -> Result<Vec<EventRow>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    EventRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    &'static str: sqlx::ColumnIndex<DB::Row>,
    String: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    Vec<u8>: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    i32: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
{
    let query = match by {
        EventsBy::Ref(ref_id) => s
            .events_by_ref
            .query::<DB>(&[Arg::Str(ref_id), Arg::I64(limit)])?,
        EventsBy::Entity { machine, entity_id } => s.events_of_entity.query::<DB>(&[
            Arg::Str(machine),
            Arg::I64(entity_id),
            Arg::I64(limit),
        ])?,
        EventsBy::Id {
            machine,
            entity_id,
            version,
        } => s.event_by_id.query::<DB>(&[
            Arg::Str(machine),
            Arg::I64(entity_id),
            Arg::I64(version),
            Arg::I64(limit),
        ])?,
    };
    let rows = query.fetch_all(conn).await?;
    Ok(readable(&rows))
}

/// A status and a filter's values, `in_status`'s 1 to 5.
fn filter_args<'a>(status: &'a str, f: &EventFilter<'a>) -> [Arg<'a>; 5] {
    [
        Arg::Str(status),
        Arg::OptStr(f.machine),
        Arg::OptStr(f.event),
        Arg::OptStr(f.error_contains),
        Arg::OptI64(f.older_than_ms),
    ]
}

/// [`LookupStore::events_in`](crate::admin::lookup::LookupStore::events_in): a row
/// that does not read as an event is left out (and named in the log).
pub(crate) async fn events_in<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    status: &str,
    filter: &EventFilter<'_>,
    after: Option<&EventKey>,
    limit: i64,
) -> Result<EventPage, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    EventRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    &'static str: sqlx::ColumnIndex<DB::Row>,
    String: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    Vec<u8>: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    i32: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
{
    let [status, machine, event, error, older] = filter_args(status, filter);
    let rows = match after {
        None => {
            let args = [status, machine, event, error, older, Arg::I64(limit)];
            s.in_status[0].query::<DB>(&args)?.fetch_all(conn).await?
        }
        Some(k) => {
            let args = [
                status,
                machine,
                event,
                error,
                older,
                Arg::Str(&k.machine),
                Arg::I64(k.entity_id),
                Arg::I64(k.version),
                Arg::I64(limit),
            ];
            s.in_status[1].query::<DB>(&args)?.fetch_all(conn).await?
        }
    };
    Ok(EventPage {
        rows: readable(&rows),
        read: rows.len(),
    })
}

/// [`LookupStore::count_events_in`](crate::admin::lookup::LookupStore::count_events_in).
pub(crate) async fn count_events_in<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    status: &str,
    filter: &EventFilter<'_>,
) -> Result<i64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.count_in_status
        .query_scalar::<DB, i64>(&filter_args(status, filter))?
        .fetch_one(conn)
        .await
}

/// [`LookupStore::stuck_records`](crate::admin::lookup::LookupStore::stuck_records).
pub(crate) async fn stuck<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    scope: Option<&str>,
    limit: i64,
) -> Result<Vec<StuckRecord>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    StuckRecord: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let query = match scope {
        None => s.stuck.query_as::<DB, StuckRecord>(&[Arg::I64(limit)])?,
        Some(scope) => s
            .stuck_of_scope
            .query_as::<DB, StuckRecord>(&[Arg::Str(scope), Arg::I64(limit)])?,
    };
    query.fetch_all(conn).await
}

/// [`LookupStore::count_stuck_records`](crate::admin::lookup::LookupStore::count_stuck_records).
pub(crate) async fn count_stuck<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    scope: Option<&str>,
) -> Result<i64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let query = match scope {
        None => s.stuck_count.query_scalar::<DB, i64>(&[])?,
        Some(scope) => s
            .stuck_count_of_scope
            .query_scalar::<DB, i64>(&[Arg::Str(scope)])?,
    };
    query.fetch_one(conn).await
}

/// The index of `held`'s statements.
fn held_index(held: Held) -> usize {
    match held {
        Held::Stuck => 0,
        Held::InFlight => 1,
    }
}

/// [`LookupStore::held_records`](crate::admin::lookup::LookupStore::held_records).
pub(crate) async fn held<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    held: Held,
    scope: Option<&str>,
    after: Option<&HeldKey>,
    limit: i64,
) -> Result<Vec<HeldRecord>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    HeldRecord: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let args = [
        Arg::OptStr(scope),
        Arg::OptI64(after.map(|a| a.lease_until)),
        Arg::OptStr(after.map(|a| a.scope.as_str())),
        Arg::OptStr(after.map(|a| a.idem_key.as_str())),
        Arg::I64(limit),
    ];
    s.held[held_index(held)]
        .query_as::<DB, HeldRecord>(&args)?
        .fetch_all(conn)
        .await
}

/// [`LookupStore::count_held_records`](crate::admin::lookup::LookupStore::count_held_records).
pub(crate) async fn count_held<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    held: Held,
    scope: Option<&str>,
) -> Result<i64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.held_count[held_index(held)]
        .query_scalar::<DB, i64>(&[Arg::OptStr(scope)])?
        .fetch_one(conn)
        .await
}

/// [`LookupStore::count_timers_in`](crate::admin::lookup::LookupStore::count_timers_in).
pub(crate) async fn count_timers<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    status: &str,
) -> Result<i64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.timers_in
        .query_scalar::<DB, i64>(&[Arg::Str(status)])?
        .fetch_one(conn)
        .await
}

/// [`LookupStore::count_published_since`](crate::admin::lookup::LookupStore::count_published_since).
pub(crate) async fn count_published<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    ms: i64,
) -> Result<i64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.published_since
        .query_scalar::<DB, i64>(&[Arg::I64(ms)])?
        .fetch_one(conn)
        .await
}

/// [`LookupStore::timers_page`](crate::admin::lookup::LookupStore::timers_page): each row
/// decoded on its own; the next page starts after the last row whose place reads.
pub(crate) async fn timers_page<DB: Binds>(
    conn: &mut DB::Connection,
    s: &LookupStatements,
    status: &str,
    after: Option<&TimerAt>,
    limit: i64,
) -> Result<TimerPage, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    TimerRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    &'static str: sqlx::ColumnIndex<DB::Row>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
{
    let rows = match after {
        None => {
            let args = [Arg::Str(status), Arg::I64(limit)];
            s.timers_page[0].query::<DB>(&args)?.fetch_all(conn).await?
        }
        Some(a) => {
            let args = [
                Arg::Str(status),
                Arg::I64(a.next_at),
                Arg::I64(a.id),
                Arg::I64(limit),
            ];
            s.timers_page[1].query::<DB>(&args)?.fetch_all(conn).await?
        }
    };
    let full = i64::try_from(rows.len()).is_ok_and(|n| n >= limit);
    let next = rows.iter().rev().find_map(|r| {
        Some(TimerAt {
            next_at: r.try_get("next_at").ok()?,
            id: r.try_get("id").ok()?,
        })
    });
    Ok(TimerPage {
        rows: rows
            .iter()
            .map(crate::backend::timer_sql::decoded)
            .collect(),
        next: next.filter(|_| full),
    })
}
