//! The operators' lookups, shared by every backend: written once with `?N` parameters,
//! each backend's millisecond clock and its outbox event columns.

use sqlx::Executor;

use crate::admin::lookup::{EventsBy, FlowHit, RecordHit, StuckRecord};
use crate::backend::names::Names;
use crate::backend::outbox_sql::readable;
use crate::backend::sql::{Arg, Binds, Params, Statement};
use crate::outbox::EventRow;

/// The statements, built once per backend.
#[derive(Debug)]
pub(crate) struct LookupStatements {
    /// 1 key, 2 limit.
    records: Statement,
    /// 1 key, 2 limit.
    flows: Statement,
    /// 1 reference, 2 limit.
    events_by_ref: Statement,
    /// 1 machine, 2 entity, 3 limit.
    events_of_entity: Statement,
    /// 1 machine, 2 entity, 3 version, 4 limit.
    event_by_id: Statement,
    /// 1 limit.
    stuck: Statement,
    /// 1 scope, 2 limit.
    stuck_of_scope: Statement,
}

impl LookupStatements {
    /// The statements with the backend's millisecond clock `now` (an expression), its
    /// outbox event columns (over the alias `o`) and its parameter style.
    pub(crate) fn new(n: &Names, now: &str, event_columns: &str, params: Params) -> Self {
        let Names {
            outbox,
            records,
            flows,
            ..
        } = n;
        let s = |sql: String| Statement::shared(sql, params);
        let events = |filter: &str, order: &str, limit: &str| {
            s(format!(
                "SELECT {event_columns} FROM {outbox} AS o WHERE {filter} ORDER BY {order} LIMIT {limit}"
            ))
        };
        let key = "o.machine, o.entity_id, o.version";
        let stuck = |scope: &str, limit: &str| {
            s(format!(
                "SELECT scope, idem_key, attempt, {now} - lease_until AS stuck_ms, \
                        {now} - created_at AS age_ms \
                 FROM {records} \
                 WHERE {scope}status = 'PROCESSING' AND lease_until <= {now} AND expires_at > {now} \
                 ORDER BY lease_until LIMIT {limit}"
            ))
        };
        LookupStatements {
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
