//! What the bench needs of each backend (`BenchDb`), and the rows it loads.

use super::*;

/// What the bench needs of a store: with the `admin` feature, all the operators' page
/// needs (the admin mode).
#[cfg(feature = "admin")]
pub(super) trait BenchStore: orderly::admin::AdminStore {}
#[cfg(feature = "admin")]
impl<S: orderly::admin::AdminStore> BenchStore for S {}
#[cfg(not(feature = "admin"))]
pub(super) trait BenchStore {}
#[cfg(not(feature = "admin"))]
impl<S> BenchStore for S {}

/// What a backend provides to the bench: the raw patterns, and a reset between passes.
pub(super) trait BenchDb: Send + Sync + 'static {
    type S: BenchStore + FlowStore + OutboxStore + orderly::TimerStore;
    /// Runs literal SQL on the bench database.
    fn exec(&self, sql: String) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// One round of the hand-written relay: in one transaction, up to `batch` pending
    /// events chosen with `SKIP LOCKED` (SQLite: under `BEGIN IMMEDIATE`), published
    /// through `sink` together, marked published; how many.
    fn relay_hand<K: Sink>(
        &self,
        batch: i64,
        sink: &K,
    ) -> impl Future<Output = Result<usize, BoxError>> + Send;
    /// A fresh database `name` for the example service, its URL: the service's stock
    /// table created, with `skus` skus `sku-c-0…` of plenty each (the service creates
    /// its other tables and seeds its own skus when it starts).
    fn service_db(
        &self,
        name: &str,
        skus: usize,
    ) -> impl Future<Output = Result<String, BoxError>> + Send;
    /// The statement that refreshes `table`'s planner statistics.
    fn analyze(&self, table: &str) -> String {
        format!("ANALYZE {table}")
    }
    /// A count, from literal SQL.
    fn count(&self, sql: String) -> impl Future<Output = Result<i64, BoxError>> + Send;
    /// The integers of the first column of literal SQL's rows.
    fn lateness_ms(&self, sql: String) -> impl Future<Output = Result<Vec<i64>, BoxError>> + Send;
    /// The database's clock in milliseconds since the epoch, as an SQL expression.
    fn now_ms_sql(&self) -> &'static str;
    /// One round of the hand-written timer loop: in one transaction, up to `batch`
    /// pending due timers chosen with `SKIP LOCKED` (SQLite: under `BEGIN IMMEDIATE`),
    /// each fired through `engine` inside it (`transition(…).within`), marked fired; how
    /// many.
    fn timers_hand(
        &self,
        batch: i64,
        engine: &Engine<TimerMachine, Self::S>,
    ) -> impl Future<Output = Result<usize, BoxError>> + Send;
    /// By hand, one request of the hot-rows mode: in one transaction, hot entity `id`
    /// locked (SQLite: `BEGIN IMMEDIATE`), its version moved on, the history row with
    /// `ref_id` (whose unique key refuses a replay).
    fn hot_hand(&self, id: i64, ref_id: &str) -> impl Future<Output = Result<(), BoxError>> + Send;
    fn engine(&self) -> Engine<OrderMachine, Self::S>;
    fn floor(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// The floor's statements for every one of `ids` in one transaction on one
    /// connection: the floor of coalescing `ids.len()` requests into one write unit.
    fn floor_batch(&self, ids: &[i64]) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// SQLite only (`None` elsewhere): the floor's statements for each of `ids`, one
    /// transaction each, in a plain loop on a connection of its own (no pool, no
    /// engine); each request's latency in microseconds.
    fn driver_limit(
        &self,
        ids: &[i64],
    ) -> impl Future<Output = Result<Option<Vec<u32>>, BoxError>> + Send {
        let _ = ids;
        async { Ok(None) }
    }
    /// SQLite only (`None` elsewhere): the floor's statements for each of `ids` through a
    /// direct binding (rusqlite) on a connection of its own, `per_commit` requests per
    /// transaction; each request's latency in microseconds.
    fn direct(
        &self,
        ids: &[i64],
        per_commit: usize,
    ) -> impl Future<Output = Result<Option<Vec<u32>>, BoxError>> + Send {
        let _ = (ids, per_commit);
        async { Ok(None) }
    }
    /// PostgreSQL only (`None` elsewhere): the floor's statement driven by pgbench (a C
    /// client, one commit per request) at `c` clients for exactly `transitions`
    /// transitions, on orders of its own that are all there (it cannot run out), and
    /// what it applied, counted from the history: transitions per second.
    fn pgbench_floor(
        &self,
        c: usize,
        transitions: i64,
    ) -> impl Future<Output = Result<Option<f64>, BoxError>> + Send {
        let _ = (c, transitions);
        async { Ok(None) }
    }
    fn naive(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// Reads the history row of `(id, Pay, pay-id)`; it must exist.
    fn read(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// By hand, what `Records::run` does with a transition inside: the claim, then one
    /// transaction with the transition's writes and the record's completion.
    fn records_hand(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// By hand, what a flow of two local steps writes: the flow record, then per step one
    /// transaction with the transition's writes, the step row and the fenced update of
    /// the flow record.
    fn flow_hand(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// By hand, what a transition along an edge that emits writes: the floor's writes
    /// and the outbox row, in one unit (PostgreSQL: one statement).
    fn outbox_hand(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// The `guarded` mode's guard: the amount `id` is due, read on the unit's connection.
    fn due<'c>(
        conn: &'c mut <Self::S as Store>::Conn,
        id: i64,
    ) -> orderly::idempotency::Work<'c, Result<i64, sqlx::Error>>;
    /// The `guarded` mode's effect: `id`'s ledger row, written on the unit's connection.
    fn ledger<'c>(
        conn: &'c mut <Self::S as Store>::Conn,
        id: i64,
    ) -> orderly::idempotency::Work<'c, Result<(), sqlx::Error>>;
    /// By hand, what a guarded transition does: in one transaction, the entity locked
    /// (SQLite: `BEGIN IMMEDIATE`), the guard's read, the update, the history row and the
    /// effect's ledger row.
    fn guarded_hand(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// Every bench order back to `Created`, version 0, its history, outbox rows and the
    /// idempotency records gone.
    fn reset(&self) -> impl Future<Output = Result<(), BoxError>> + Send;
    fn explain(&self) -> impl Future<Output = Result<String, BoxError>> + Send;
    fn describe(&self) -> String;
}

/// `url` with its database (the path) replaced by `name`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(super) fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let base = base.rsplit_once('/').map_or(base, |(head, _)| head);
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

pub(super) const REF_PREFIX: &str = "pay-";

pub(super) fn bench_ref(id: i64) -> String {
    format!("{REF_PREFIX}{id}")
}

pub(super) fn ensure(cond: bool, what: &str, id: i64) -> Result<(), BoxError> {
    if cond {
        Ok(())
    } else {
        Err(format!("{what} did not apply to order {id}").into())
    }
}

/// `INSERT … VALUES` statements creating orders `1..=orders` at Created, 1000 per statement.
pub(super) fn order_inserts(orders: i64) -> Vec<String> {
    (1..=orders)
        .collect::<Vec<_>>()
        .chunks(1000)
        .map(|chunk| {
            let values: Vec<String> = chunk
                .iter()
                .map(|id| format!("({id}, 'Created', 0)"))
                .collect();
            format!(
                "INSERT INTO orders (id, status, version) VALUES {}",
                values.join(",")
            )
        })
        .collect()
}

/// `INSERT … VALUES` statements creating `rows` history rows of other orders (negative
/// ids, four transitions each), 1000 per statement.
pub(super) fn history_inserts(rows: i64) -> Vec<String> {
    (0..rows)
        .collect::<Vec<_>>()
        .chunks(1000)
        .map(|chunk| {
            let values: Vec<String> = chunk
                .iter()
                .map(|g| format!("({}, {}, 'Created', 'Paid', 'Pay', 'pre-{g}')", -1 - g / 4, g % 4 + 1))
                .collect();
            format!(
                "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES {}",
                values.join(",")
            )
        })
        .collect()
}

/// `sql` with orderly's tables as the shared benches write them (`orderly_outbox`, as
/// MariaDB and SQLite name them) named as PostgreSQL keeps them (`orderly.outbox`).
#[cfg(feature = "postgres")]
pub(super) fn in_schema(sql: &str) -> String {
    const TABLES: [&str; 9] = [
        "transitions",
        "idempotency_records",
        "one_time_tokens",
        "flow_steps",
        "flows",
        "outbox",
        "inbox",
        "timers",
        "audit",
    ];
    let mut out = sql.to_owned();
    for table in TABLES {
        out = out.replace(&format!("orderly_{table}"), &format!("orderly.{table}"));
    }
    out
}
