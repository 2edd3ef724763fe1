//! The flow layer's statements whose values every backend binds alike: each backend
//! writes them once in its dialect ([`FlowStatements`], numbered parameters as
//! [`Statement`] reads them), and its methods of [`FlowStore`](crate::flow::FlowStore)
//! call the functions here, which bind the values and run them. A backend whose flow
//! start and recovery claim are one statement each (PostgreSQL, SQLite) writes those in
//! [`FlowClaims`]; the others (MySQL) write those two methods themselves. A backend that
//! purges by keys (MySQL, SQLite) writes its choice of flows in [`PurgeByKeys`].

use sqlx::Executor;

#[cfg(any(feature = "sqlite", feature = "mysql"))]
use crate::backend::names::Names;
use crate::backend::sql::{Arg, Binds, Statement};
use crate::flow::{FlowRow, Listing, StepRow, StepWrite, Touch};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::flow::{NewFlow, TakeDue};

/// The listings, in the order [`FlowStatements::list`] holds their statements.
pub(crate) const LISTINGS: [Listing; 5] = [
    Listing::Parked,
    Listing::Running,
    Listing::Stuck,
    Listing::Finished,
    Listing::All,
];

/// Where `which` stands in [`LISTINGS`]: a listing added to the enum fails to compile
/// here until it has its statement.
fn place(which: Listing) -> usize {
    match which {
        Listing::Parked => 0,
        Listing::Running => 1,
        Listing::Stuck => 2,
        Listing::Finished => 3,
        Listing::All => 4,
    }
}

/// A backend's flow statements, each with the numbered parameters its comment lists.
#[derive(Debug)]
pub(crate) struct FlowStatements {
    /// A flow's record (a [`FlowRow`]): 1 kind, 2 key.
    pub(crate) read_flow: Statement,
    /// A flow's steps (each a [`StepRow`]), by index, the forward phase first: 1 kind,
    /// 2 key.
    pub(crate) read_steps: Statement,
    /// The fenced update of a flow's record ([`Touch`]): 1 kind, 2 key, 3 token, 4 lease
    /// ms, 5 progress, 6 step at, 7 status, 8 park reason, 9 output, 10 last error.
    pub(crate) touch: Statement,
    /// The upsert of a step row ([`StepWrite`]): 1 kind, 2 key, 3 index, 4 phase, 5 name,
    /// 6 status, 7 begins, 8 downstream key, 9 token, 10 output, 11 error.
    pub(crate) record_step: Statement,
    /// A phase's started and failed steps marked for retry: 1 kind, 2 key, 3 phase.
    pub(crate) retry_steps: Statement,
    /// A parked flow handed from token 5 to token 3: 1 kind, 2 key, 3 token, 4 lease ms,
    /// 5 the parking token.
    pub(crate) unpark: Statement,
    /// A running flow handed from the token it waits under, 5, to token 3: 1 kind,
    /// 2 key, 3 token, 4 lease ms, 5 the waiting token.
    pub(crate) wake: Statement,
    /// A page of each listing's flows, in the order of [`LISTINGS`]: 1 kind and 2 key to
    /// start after, 3 limit.
    pub(crate) list: [Statement; 5],
    /// How many flows each listing holds, in the order of [`LISTINGS`]; no parameters.
    pub(crate) count: [Statement; 5],
}

/// The flow start and the recovery claim, one statement each.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug)]
pub(crate) struct FlowClaims {
    /// Inserts a flow or takes a live one over whose lease ran out, returning its
    /// attempt: 1 kind, 2 key, 3 version, 4 input hash, 5 input, 6 token, 7 lease ms.
    pub(crate) start_flow: Statement,
    /// Hands the due flows to a token, returning `(key, attempt)`: 1 kind, 2 version,
    /// 3 token, 4 lease ms, 5 limit.
    pub(crate) take_due: Statement,
}

/// The purge of finished flows as a transaction: a statement choosing a batch, then
/// each flow's steps and record deleted by key.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
#[derive(Debug)]
pub(crate) struct PurgeByKeys {
    /// `(kind, key)` of up to 2 limit finished flows untouched for 1 age ms, locked where
    /// the backend locks rows.
    pub(crate) choose: Statement,
    /// A flow's steps, then its record: 1 kind, 2 key.
    pub(crate) delete: [Statement; 2],
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
impl PurgeByKeys {
    /// The purge with the backend's choice of flows, `choose`; `positional` as for
    /// [`Statement::new`].
    pub(crate) fn new(n: &Names, choose: String, positional: bool) -> Self {
        let delete = [&n.flow_steps, &n.flows].map(|table| {
            Statement::new(
                format!("DELETE FROM {table} WHERE kind = ?1 AND flow_key = ?2"),
                positional,
            )
        });
        PurgeByKeys {
            choose: Statement::new(choose, positional),
            delete,
        }
    }
}

/// [`FlowStore::read_flow`](crate::flow::FlowStore::read_flow).
pub(crate) async fn read_flow<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowStatements,
    kind: &str,
    key: &str,
) -> Result<Option<FlowRow>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    FlowRow: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.read_flow
        .query_as::<DB, FlowRow>(&[Arg::Str(kind), Arg::Str(key)])?
        .fetch_optional(conn)
        .await
}

/// [`FlowStore::read_steps`](crate::flow::FlowStore::read_steps).
pub(crate) async fn read_steps<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowStatements,
    kind: &str,
    key: &str,
) -> Result<Vec<StepRow>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    StepRow: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.read_steps
        .query_as::<DB, StepRow>(&[Arg::Str(kind), Arg::Str(key)])?
        .fetch_all(conn)
        .await
}

/// [`FlowStore::touch`](crate::flow::FlowStore::touch).
pub(crate) async fn touch<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowStatements,
    t: &Touch<'_>,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let done = s.touch.query::<DB>(&touch_args(t))?.execute(conn).await?;
    Ok(DB::rows_affected(&done) == 1)
}

/// [`FlowStore::record_step`](crate::flow::FlowStore::record_step).
pub(crate) async fn record_step<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowStatements,
    w: &StepWrite<'_>,
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    s.record_step
        .query::<DB>(&record_step_args(w))?
        .execute(conn)
        .await?;
    Ok(())
}

/// [`FlowStore::retry_steps`](crate::flow::FlowStore::retry_steps).
pub(crate) async fn retry_steps<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowStatements,
    kind: &str,
    key: &str,
    phase: &str,
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let args = [Arg::Str(kind), Arg::Str(key), Arg::Str(phase)];
    s.retry_steps.query::<DB>(&args)?.execute(conn).await?;
    Ok(())
}

/// [`FlowStore::unpark`](crate::flow::FlowStore::unpark).
pub(crate) async fn unpark<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowStatements,
    kind: &str,
    key: &str,
    from: &str,
    token: &str,
    lease_ms: i64,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    hand_over::<DB>(conn, &s.unpark, kind, key, from, token, lease_ms).await
}

/// [`FlowStore::wake_flow`](crate::flow::FlowStore::wake_flow).
pub(crate) async fn wake_flow<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowStatements,
    kind: &str,
    key: &str,
    from: &str,
    token: &str,
    lease_ms: i64,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    hand_over::<DB>(conn, &s.wake, kind, key, from, token, lease_ms).await
}

/// A flow handed from token `from` to `token` by `statement` (an unpark or a wake):
/// whether it was.
async fn hand_over<DB: Binds>(
    conn: &mut DB::Connection,
    statement: &Statement,
    kind: &str,
    key: &str,
    from: &str,
    token: &str,
    lease_ms: i64,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let args = [
        Arg::Str(kind),
        Arg::Str(key),
        Arg::Str(token),
        Arg::I64(lease_ms),
        Arg::Str(from),
    ];
    let done = statement.query::<DB>(&args)?.execute(conn).await?;
    Ok(DB::rows_affected(&done) == 1)
}

/// [`FlowStore::list_flows`](crate::flow::FlowStore::list_flows).
pub(crate) async fn list_flows<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowStatements,
    which: Listing,
    after: Option<(&str, &str)>,
    limit: i64,
) -> Result<Vec<FlowRow>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    FlowRow: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let (kind, key) = after.unwrap_or(("", ""));
    s.list[place(which)]
        .query_as::<DB, FlowRow>(&[Arg::Str(kind), Arg::Str(key), Arg::I64(limit)])?
        .fetch_all(conn)
        .await
}

/// [`FlowStore::count_flows`](crate::flow::FlowStore::count_flows).
pub(crate) async fn count_flows<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowStatements,
    which: Listing,
) -> Result<i64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.count[place(which)]
        .query_scalar::<DB, i64>(&[])?
        .fetch_one(conn)
        .await
}

/// [`FlowStore::start_flow`](crate::flow::FlowStore::start_flow) in one statement.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) async fn start_flow<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowClaims,
    f: &NewFlow<'_>,
) -> Result<Option<i32>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (i32,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.start_flow
        .query_scalar::<DB, i32>(&start_flow_args(f))?
        .fetch_optional(conn)
        .await
}

/// [`FlowStore::take_due`](crate::flow::FlowStore::take_due) in one statement.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) async fn take_due<DB: Binds>(
    conn: &mut DB::Connection,
    s: &FlowClaims,
    d: &TakeDue<'_>,
) -> Result<Vec<(String, i32)>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (String, i32): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    s.take_due
        .query_as::<DB, (String, i32)>(&take_due_args(d))?
        .fetch_all(conn)
        .await
}

/// [`FlowStore::purge_flows`](crate::flow::FlowStore::purge_flows) by keys, inside the
/// transaction `tx` the backend began (and commits): the flows chosen, then each one's
/// steps and record deleted. How many flows went.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) async fn purge_by_keys<DB: Binds>(
    tx: &mut DB::Connection,
    s: &PurgeByKeys,
    age_ms: i64,
    limit: i64,
) -> Result<u64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (String, String): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let keys = s
        .choose
        .query_as::<DB, (String, String)>(&[Arg::I64(age_ms), Arg::I64(limit)])?
        .fetch_all(&mut *tx)
        .await?;
    for (kind, key) in &keys {
        for delete in &s.delete {
            delete
                .query::<DB>(&[Arg::Str(kind), Arg::Str(key)])?
                .execute(&mut *tx)
                .await?;
        }
    }
    Ok(keys.len() as u64)
}

/// [`FlowStatements::touch`]'s values.
fn touch_args<'a>(t: &Touch<'a>) -> [Arg<'a>; 10] {
    [
        Arg::Str(t.kind),
        Arg::Str(t.key),
        Arg::Str(t.token),
        Arg::I64(t.lease_ms),
        Arg::Bool(t.progress),
        Arg::OptI32(t.step_at),
        Arg::OptStr(t.status),
        Arg::OptStr(t.park),
        Arg::OptStr(t.output),
        Arg::OptStr(t.error),
    ]
}

/// [`FlowStatements::record_step`]'s values.
fn record_step_args<'a>(w: &StepWrite<'a>) -> [Arg<'a>; 11] {
    [
        Arg::Str(w.kind),
        Arg::Str(w.key),
        Arg::I32(w.index),
        Arg::Str(w.phase),
        Arg::Str(w.name),
        Arg::Str(w.status),
        Arg::Bool(w.begins),
        Arg::OptStr(w.downstream_key),
        Arg::Str(w.token),
        Arg::OptStr(w.output),
        Arg::OptStr(w.error),
    ]
}

/// [`FlowClaims::start_flow`]'s values.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn start_flow_args<'a>(s: &NewFlow<'a>) -> [Arg<'a>; 7] {
    [
        Arg::Str(s.kind),
        Arg::Str(s.key),
        Arg::I32(s.version),
        Arg::Str(s.input_hash),
        Arg::Str(s.input),
        Arg::Str(s.token),
        Arg::I64(s.lease_ms),
    ]
}

/// [`FlowClaims::take_due`]'s values.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn take_due_args<'a>(d: &TakeDue<'a>) -> [Arg<'a>; 5] {
    [
        Arg::Str(d.kind),
        Arg::I32(d.version),
        Arg::Str(d.token),
        Arg::I64(d.lease_ms),
        Arg::I64(d.limit),
    ]
}

#[cfg(test)]
mod tests {
    use super::{LISTINGS, place};

    #[test]
    fn every_listing_stands_where_its_statement_is() {
        for (i, which) in LISTINGS.iter().enumerate() {
            assert_eq!(place(*which), i, "{which:?}");
        }
    }
}
