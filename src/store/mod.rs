//! Persistence: the seam between the engine and a database.
//!
//! The engine owns every policy: whether to read first, how often to retry, how to judge
//! what it read. A store owns SQL. It offers a few coarse operations, each one round trip
//! or one atomic unit that it opens and closes itself, over a connection of the
//! backend's own type, and it classifies the backend's errors. Nothing on the seam
//! begins, commits or rolls back on the engine's behalf, and no flag tells a store which
//! policy is running.
//!
//! | operation | what it is |
//! |---|---|
//! | [`Store::apply_first`] | the apply-first unit: the write along the event's edge with no read before it, for one request or several in one commit |
//! | [`Store::observe`] | the judge's read: the entity and this request's history row |
//! | [`Store::apply`] | the conditional write after a read: update guarded by status and version, history row |
//! | [`Store::latest_ref`] | the refusal's read: the event's latest reference |
//! | [`Store::prior`] / [`Store::priors`] | the request's history row; many requests in one statement |
//! | [`Store::create`], [`Store::get`], [`Store::history`] | the entity and its history |
//! | [`Store::classify`] | retryable, connection lost, or fatal |
//!
//! The two write units ([`Store::apply_first`] and [`Store::apply`]) are the only places
//! a transition's rows are written; whatever must commit with a transition joins there.
//! The apply-first unit takes several requests at once (one commit, each request
//! answered for itself): the engine's coalesced writes (`coalesce/writes.rs`) reach the
//! store through it.
//!
//! This folder holds the seam only, in no dialect: the [`Store`] trait and the
//! [`Schema`] its tables are written by (`schema.rs`), the rows it
//! returns (`rows.rs`), table names (`tables.rs`), error classes (`errors.rs`; each
//! dialect's codes are its backend's), pooled connections that go back to the pool only when their conversation
//! ended (`lease.rs`). The backends implement it from
//! above, in [`crate::backend`].

use std::future::Future;
use std::ops::DerefMut;

pub mod audit;
pub(crate) mod errors;
mod lease;
mod requests;
mod rows;
mod schema;
mod tables;
pub mod timers;
mod unit;

pub use errors::ErrorClass;
pub(crate) use errors::db_error;
pub(crate) use lease::Lease;
pub use requests::{
    Apply, Audit, FirstWrite, Key, Observed, OwnedKey, Request, Txn, Unpooled, Written,
};
pub use rows::{Entity, PositionedPrior, Prior, RawTransition, RefRow};
pub use schema::Schema;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) use tables::validate_namespace;
pub use tables::{DEFAULT_NAMESPACE, DEMO_TABLE, Tables};
pub use unit::Unit;

/// A backend: coarse operations over the backend's own connection type.
///
/// Every operation that takes a [`Txn`] runs inside the caller's transaction for
/// [`Txn::Caller`]: its reads see the latest commits (locking reads where the isolation
/// level would otherwise return the transaction's snapshot), and its write unit is a
/// savepoint, so a lost race is undone without aborting the caller's transaction.
pub trait Store: Schema + Clone + Send + Sync + 'static {
    /// The backend's connection (`SqliteConnection`, `PgConnection`, `MySqlConnection`).
    type Conn: Send;
    /// A connection borrowed from the store's pool.
    type Pooled: DerefMut<Target = Self::Conn> + Send;

    /// The backend's name, a label of the library's metrics (`postgres`, `mysql`,
    /// `sqlite`).
    const BACKEND: &'static str = "custom";

    /// The share of recent replays, in 1/1024ths, from which reading a request's history
    /// row first is cheaper on this backend than trying to apply first (see
    /// [`ReadFirst::Adaptive`](crate::ReadFirst::Adaptive)).
    const READ_FIRST_FROM: u32;

    /// The most requests [`priors`](Self::priors) reads in one statement. Above 1, the
    /// engine coalesces the read-first reads of concurrent callers; at 1, each reads its
    /// own row on its own connection.
    const BATCH_READ_MAX: usize = 1;

    /// Whether [`apply_first`](Self::apply_first) writes several requests (of distinct
    /// entities) at less than the cost of writing them one by one: the engine then
    /// coalesces the apply-first writes of concurrent callers into one unit.
    const BATCHES_WRITES: bool = false;

    /// Whether this store, as it is now, batches writes ([`BATCHES_WRITES`](Self::BATCHES_WRITES)
    /// unless a store knows better).
    fn batches_writes(&self) -> bool {
        Self::BATCHES_WRITES
    }

    /// Borrows a connection: from the pool, or one the store keeps out of it between
    /// its conversations (PostgreSQL's kept connection, which skipped the pool's
    /// `before_acquire` hook).
    fn acquire(&self) -> impl Future<Output = Result<Self::Pooled, sqlx::Error>> + Send;

    /// Takes back a connection borrowed with [`acquire`](Self::acquire) whose conversation
    /// ran to its end, no transaction left open on it. By default it goes back to the
    /// pool; a store may keep it for its next borrower (PostgreSQL's kept connection,
    /// [`PgStore::keep_connection`](crate::PgStore::keep_connection)).
    fn give_back(&self, conn: Self::Pooled) {
        drop(conn);
    }

    /// Runs one statement that returns no rows (the DDL and the column probes of
    /// [`Engine::create_tables`](crate::Engine::create_tables), written by the store's
    /// [`Schema`]). The default runs nothing.
    fn run_sql(
        &self,
        conn: &mut Self::Conn,
        sql: String,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = (conn, sql);
        std::future::ready(Ok(()))
    }

    /// A turn at writing, taken before the connection of one of the idempotency
    /// records' or the flows' write transactions (or writing statements) and held until
    /// it is done, on a database that has one writer at a time: its writers then queue
    /// in order in the process instead of retrying the database's lock. `None` (the
    /// default) where writers do not wait on one lock; SQLite hands turns out in order,
    /// and past its busy timeout lets the writer go on without one (to meet the lock
    /// as before: a write nested inside another's transaction fails as it always did).
    fn write_turn(&self) -> impl Future<Output = Option<WriteTurn>> + Send {
        std::future::ready(None)
    }

    /// Closes a pooled connection instead of returning it to the pool, for a connection
    /// whose state is unknown: a conversation on it was interrupted (its caller dropped
    /// the future) or it failed. Closing the socket makes the server roll back whatever
    /// transaction was open on it; the pool opens a replacement when one is needed.
    fn discard(conn: Self::Pooled);

    /// Classifies a database error by the backend's codes.
    fn classify(err: &sqlx::Error) -> ErrorClass;

    /// The apply-first unit, outside a caller's transaction, for one request or several
    /// (one commit for all): moves each entity along one of its request's edges if it is
    /// in that edge's source state, and records the history row, with no read before and
    /// no version predicate. The status is judged on the latest committed row, which the
    /// write locks. A request recorded before is stopped by the history's unique key and
    /// its writes undone: [`FirstWrite::NotApplied`], as when nothing matched; the other
    /// requests of the unit are not affected. [`FirstWrite::NotTried`] for a request this
    /// store does not try first (the engine then reads and judges). One answer per
    /// request, in order.
    fn apply_first(
        &self,
        conn: &mut Self::Conn,
        requests: &[Request<'_>],
    ) -> impl Future<Output = Result<Vec<FirstWrite>, sqlx::Error>> + Send;

    /// Whether the store writes apply-first units on a writer of its own that needs no
    /// connection of the pool's ([`apply_first_unpooled`](Self::apply_first_unpooled)):
    /// SQLite's writer thread, once started; PostgreSQL's connection kept out of the pool
    /// between units. By default it does not.
    fn writes_unpooled(&self) -> bool {
        false
    }

    /// The apply-first unit of `requests`, as [`apply_first`](Self::apply_first) writes
    /// it, on the store's own writer, with no connection taken from the pool; called where
    /// [`writes_unpooled`](Self::writes_unpooled). A lone caller whose write applies then
    /// never takes a connection from the pool and gives it back: sqlx tests every
    /// connection it takes back (a round trip to the server, on a task of its own).
    /// [`Unpooled::KeyMet`] or [`Unpooled::NoWriter`] if nothing was written: the unit
    /// then goes through a connection (`apply_first`). An error leaves the writer ready
    /// for the next unit.
    fn apply_first_unpooled(
        &self,
        requests: &[Request<'_>],
    ) -> impl Future<Output = Result<Unpooled, sqlx::Error>> + Send {
        let _ = requests;
        async { Ok(Unpooled::NoWriter) }
    }

    /// The apply-first write of one request inside the caller's transaction: as
    /// [`apply_first`](Self::apply_first), the update along the event's edge judged on
    /// the latest committed row (which it locks) and the history row, with no read
    /// before. A request recorded before changes nothing ([`FirstWrite::NotApplied`])
    /// and leaves the caller's transaction usable: a statement that raises no error
    /// for it, a failed statement's own undo and a restoring update, or a savepoint. By default [`FirstWrite::NotTried`]: the engine then reads
    /// and judges.
    fn apply_first_in(
        &self,
        conn: &mut Self::Conn,
        request: &Request<'_>,
    ) -> impl Future<Output = Result<FirstWrite, sqlx::Error>> + Send {
        let _ = (conn, request);
        async { Ok(FirstWrite::NotTried) }
    }

    /// The judge's read, in one statement: the entity and, if the entity exists, this
    /// request's history row. `None` if the entity does not exist (the engine then asks
    /// [`prior`](Self::prior): a request recorded for an entity that is gone is still a
    /// replay).
    fn observe(
        &self,
        conn: &mut Self::Conn,
        key: Key<'_>,
        txn: Txn,
    ) -> impl Future<Output = Result<Option<Observed>, sqlx::Error>> + Send;

    /// The write unit after a read, atomically: `UPDATE … SET status = to, version =
    /// version + 1 WHERE id = ? AND status = from AND version = v` and the history row
    /// with `seq = v + 1`. [`Written::Lost`] (nothing written) if the update matched no
    /// row or the history's unique key holds a twin's row.
    fn apply(
        &self,
        conn: &mut Self::Conn,
        apply: &Apply<'_>,
        txn: Txn,
    ) -> impl Future<Output = Result<Written, sqlx::Error>> + Send;

    /// Opens the unit of a guarded request (or of a create that arms timers) on `conn`:
    /// a transaction, or a savepoint inside the caller's for [`Txn::Caller`]. Every
    /// statement of the unit goes through the [`Unit`], which ends it once: committed,
    /// undone, or, dropped before either, abandoned.
    fn begin_unit<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        txn: Txn,
    ) -> impl Future<Output = Result<Unit<'a, Self>, sqlx::Error>> + Send {
        Unit::begin(self, conn, txn)
    }

    /// Opens the unit of a request whose edge has a guard or an effect: a transaction
    /// on the engine's own connection ([`Txn::Own`]; on SQLite `BEGIN IMMEDIATE`), a
    /// savepoint inside the caller's transaction ([`Txn::Caller`]). Returns what
    /// [`end_rules_unit`](Self::end_rules_unit) and
    /// [`abandon_rules_unit`](Self::abandon_rules_unit) need to put the connection back
    /// as it was (sqlx's count of open transactions). The default cannot: such requests
    /// then fail with a configuration error, writing nothing.
    fn begin_rules_unit(
        &self,
        conn: &mut Self::Conn,
        txn: Txn,
    ) -> impl Future<Output = Result<usize, sqlx::Error>> + Send {
        let _ = (conn, txn);
        std::future::ready(Err(sqlx::Error::Configuration(
            "this store runs no guards or effects".into(),
        )))
    }

    /// Ends the unit [`begin_rules_unit`](Self::begin_rules_unit) opened: commits it (or
    /// releases the savepoint) if `commit`, else undoes it. Whatever the answer, the
    /// connection is left as it was before the unit (`depth`).
    fn end_rules_unit(
        &self,
        conn: &mut Self::Conn,
        commit: bool,
        depth: usize,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = (conn, commit, depth);
        std::future::ready(Ok(()))
    }

    /// Gives up the unit without a round trip (its call was dropped, or its connection
    /// failed): the undo is queued for the connection's next use, and the connection is
    /// as it was before the unit (`depth`).
    fn abandon_rules_unit(&self, conn: &mut Self::Conn, depth: usize) {
        let _ = (conn, depth);
    }

    /// Gives up a unit whose commit or rollback was in flight when its call was dropped:
    /// the server may have run it or not. By default as
    /// [`abandon_rules_unit`](Self::abandon_rules_unit); a backend whose driver keeps
    /// state about an end it ran but could not report (SQLite's worker) settles it here.
    fn abandon_ending_unit(&self, conn: &mut Self::Conn, depth: usize) {
        self.abandon_rules_unit(conn, depth);
    }

    /// The write after a read inside a unit of
    /// [`begin_rules_unit`](Self::begin_rules_unit), which the engine ends: as
    /// [`apply`](Self::apply), without a savepoint of its own, since whatever it answers
    /// but [`Written::Applied`] (and any error) makes the engine undo the whole unit. By
    /// default [`apply`](Self::apply) inside the caller's transaction.
    fn apply_in_unit(
        &self,
        conn: &mut Self::Conn,
        apply: &Apply<'_>,
    ) -> impl Future<Output = Result<Written, sqlx::Error>> + Send {
        self.apply(conn, apply, Txn::Caller)
    }

    /// The write after a read inside a transaction its owner rolls back whole on any
    /// error (the timer job's batch), without a savepoint: [`Written::Lost`] only when it
    /// wrote nothing (the entity was no longer at the state and version read); a request
    /// recorded before comes back as the error it is, for the owner to undo everything.
    /// By default [`apply`](Self::apply) inside the caller's transaction.
    fn apply_in_batch(
        &self,
        conn: &mut Self::Conn,
        apply: &Apply<'_>,
    ) -> impl Future<Output = Result<Written, sqlx::Error>> + Send {
        self.apply(conn, apply, Txn::Caller)
    }

    /// [`apply_in_batch`](Self::apply_in_batch) for writes of distinct entities, each
    /// answered in its place; an error leaves the transaction for its owner to roll back.
    /// By default one at a time; a store may write them in one statement.
    fn apply_many_in_batch(
        &self,
        conn: &mut Self::Conn,
        applies: &[Apply<'_>],
    ) -> impl Future<Output = Result<Vec<Written>, sqlx::Error>> + Send {
        apply_each_in_batch(self, conn, applies)
    }

    /// Writes the timers a state carries ([`Arm`](timers::Arm)), each unless its
    /// key is there already, inside the open unit that entered the state (a unit of
    /// [`begin_rules_unit`](Self::begin_rules_unit)). The default cannot: a move into a
    /// state with timers then fails with a configuration error, writing nothing.
    fn arm_timers(
        &self,
        conn: &mut Self::Conn,
        arm: &timers::Arm<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = (conn, arm);
        std::future::ready(Err(sqlx::Error::Configuration(
            "this store keeps no timers".into(),
        )))
    }

    /// The entity, locked until the unit ends (`SELECT … FOR UPDATE`), read as last
    /// committed; inside a unit of [`begin_rules_unit`](Self::begin_rules_unit). By
    /// default [`get`](Self::get), for a store whose unit already holds the only write
    /// lock (SQLite).
    fn lock(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
    ) -> impl Future<Output = Result<Option<Entity>, sqlx::Error>> + Send {
        self.get(conn, order_id)
    }

    /// Inside a unit of [`begin_rules_unit`](Self::begin_rules_unit), after the judge's
    /// reads and before the guard and effect run: a write, where the backend needs one,
    /// that checks the unit's transaction is still open. On a Galera node another node's
    /// write set can roll a transaction back during one of its reads without an error;
    /// the statements after it then each commit on their own, and rules run there would
    /// write outside the unit. If the transaction is gone, an error the store classifies
    /// as a lost connection (nothing of the unit stands; the request goes again on
    /// another connection). By default nothing is sent.
    fn write_before_rules(
        &self,
        _conn: &mut Self::Conn,
        _order_id: i64,
        _version: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        async { Ok(()) }
    }

    /// The judge's read inside a unit of [`begin_rules_unit`](Self::begin_rules_unit):
    /// the entity locked as [`lock`](Self::lock) locks it, and this request's history row
    /// as last committed when the lock was granted (a request recorded by the unit that
    /// held the lock before is seen). By default the two reads one after the other
    /// ([`lock`](Self::lock), then [`prior`](Self::prior)); a store that can reads both
    /// in one statement.
    fn lock_observe(
        &self,
        conn: &mut Self::Conn,
        key: Key<'_>,
        txn: Txn,
    ) -> impl Future<Output = Result<(Option<Entity>, Option<Prior>), sqlx::Error>> + Send {
        async move {
            let entity = self.lock(conn, key.order_id).await?;
            let prior = self.prior(conn, key, txn).await?;
            Ok((entity, prior))
        }
    }

    /// The reference under which `key.event` was last applied to `key.order_id`, if ever.
    /// Read only when the event is not allowed from the current state, to tell a
    /// conflicting reference (`RefConflict`) from an invalid event.
    fn latest_ref(
        &self,
        conn: &mut Self::Conn,
        key: Key<'_>,
        txn: Txn,
    ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send;

    /// This request's history row alone.
    fn prior(
        &self,
        conn: &mut Self::Conn,
        key: Key<'_>,
        txn: Txn,
    ) -> impl Future<Output = Result<Option<Prior>, sqlx::Error>> + Send;

    /// The history rows of several requests (at most
    /// [`BATCH_READ_MAX`](Self::BATCH_READ_MAX)), outside a caller's transaction: for
    /// each key, in order, its row if it was recorded. One statement on a store that
    /// batches reads; by default, one [`prior`](Self::prior) read after another.
    fn priors(
        &self,
        conn: &mut Self::Conn,
        keys: &[OwnedKey],
    ) -> impl Future<Output = Result<Vec<Option<Prior>>, sqlx::Error>> + Send {
        async move {
            let mut priors = Vec::with_capacity(keys.len());
            for key in keys {
                priors.push(self.prior(conn, key.as_key(), Txn::Own).await?);
            }
            Ok(priors)
        }
    }

    /// Inserts the entity at `initial` with version 0 unless it exists; returns it as it
    /// is afterwards (inside a caller's transaction, as committed, not as the
    /// transaction's snapshot).
    fn create(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
        initial: &'static str,
        txn: Txn,
    ) -> impl Future<Output = Result<Entity, sqlx::Error>> + Send;

    /// The entity, if it exists.
    fn get(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
    ) -> impl Future<Output = Result<Option<Entity>, sqlx::Error>> + Send;

    /// The entity's history, oldest first.
    fn history(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
    ) -> impl Future<Output = Result<Vec<RawTransition>, sqlx::Error>> + Send;
}

/// A writer's turn on a database with one writer at a time ([`Store::write_turn`]): the
/// next writer's begins when this is dropped.
#[derive(Debug)]
pub struct WriteTurn(#[allow(dead_code)] tokio::sync::OwnedMutexGuard<()>);

impl WriteTurn {
    /// Waits for the turn of `gate`, at most `patience`; `None` past it.
    pub async fn take(
        gate: &std::sync::Arc<tokio::sync::Mutex<()>>,
        patience: std::time::Duration,
    ) -> Option<Self> {
        tokio::time::timeout(patience, gate.clone().lock_owned())
            .await
            .ok()
            .map(WriteTurn)
    }
}

/// [`Store::apply_in_batch`] for each of `applies`, one after another: the default of
/// [`Store::apply_many_in_batch`], and a store's way for the batches its statements do
/// not take.
pub(crate) async fn apply_each_in_batch<S: Store>(
    store: &S,
    conn: &mut S::Conn,
    applies: &[Apply<'_>],
) -> Result<Vec<Written>, sqlx::Error> {
    let mut written = Vec::with_capacity(applies.len());
    for apply in applies {
        written.push(store.apply_in_batch(&mut *conn, apply).await?);
    }
    Ok(written)
}
