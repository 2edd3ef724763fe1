//! Persistence: one module per backend, each behind a cargo feature.
//!
//! A store supplies SQL and error classification, never the transition algorithm, which
//! lives once in [`engine`](crate::engine). The [`Store`] trait is the seam: a handful of
//! statements over a connection of the backend's own type.

use std::future::Future;
use std::ops::DerefMut;

use crate::Error;

/// The SQL of one store, written by each backend in its own dialect. The pairs are
/// `[plain, inside a caller's transaction]`; backends that need no locking read there
/// hold the same statement twice.
#[derive(Debug)]
#[allow(dead_code)] // every backend reads every field, and no backend is also a valid build
pub(crate) struct Statements {
    /// `INSERT` the entity at the initial state, version 0, unless it exists.
    pub insert_order: sqlx::SqlStr,
    /// `(status, version)` of an entity.
    pub get: sqlx::SqlStr,
    /// The judge's read: an [`ObservedRow`].
    pub observe: [sqlx::SqlStr; 2],
    /// The request's history row alone: a [`PriorRow`].
    pub prior: [sqlx::SqlStr; 2],
    /// The latest reference of an event on an entity.
    pub latest_ref: [sqlx::SqlStr; 2],
    /// The conditional update.
    pub update: sqlx::SqlStr,
    /// The history insert.
    pub record: sqlx::SqlStr,
    /// An entity's history: [`HistoryRow`]s.
    pub history: sqlx::SqlStr,
}

/// The [`Store`] methods every backend implements the same way (bind the same values to
/// its own SQL), for a store type with an inherent `fn sql(&self) -> &Statements` and
/// the backend's connection type `$conn`. Not generic code: each backend expands it for its
/// own concrete types.
#[allow(unused_macros)] // a build with no backend feature has no store
macro_rules! shared_store_methods {
    ($conn:ty) => {
        fn discard(conn: Self::Pooled) {
            // Detached, the connection no longer counts against the pool; dropped, its
            // socket closes at once, without a goodbye that could wait on a stream left
            // in the middle of a reply.
            drop(conn.detach());
        }

        async fn create(
            &self,
            conn: &mut $conn,
            order_id: i64,
            initial: &'static str,
        ) -> Result<(String, i64), sqlx::Error> {
            sqlx::query(self.sql().insert_order.clone())
                .bind(order_id)
                .bind(initial)
                .execute(&mut *conn)
                .await?;
            sqlx::query_as(self.sql().get.clone())
                .bind(order_id)
                .fetch_one(&mut *conn)
                .await
        }

        async fn prior(
            &self,
            conn: &mut $conn,
            key: $crate::store::Key<'_>,
            in_tx: bool,
        ) -> Result<Option<$crate::store::Prior>, sqlx::Error> {
            let row: Option<$crate::store::PriorRow> =
                sqlx::query_as(self.sql().prior[usize::from(in_tx)].clone())
                    .bind(key.order_id)
                    .bind(key.event)
                    .bind(key.ref_id)
                    .fetch_optional(conn)
                    .await?;
            Ok(row.map($crate::store::Prior::from))
        }

        async fn latest_ref(
            &self,
            conn: &mut $conn,
            key: $crate::store::Key<'_>,
            in_tx: bool,
        ) -> Result<Option<String>, sqlx::Error> {
            sqlx::query_scalar(self.sql().latest_ref[usize::from(in_tx)].clone())
                .bind(key.order_id)
                .bind(key.event)
                .fetch_optional(conn)
                .await
        }

        async fn commit(tx: Self::Tx<'_>) -> Result<(), sqlx::Error> {
            tx.commit().await
        }

        async fn rollback(tx: Self::Tx<'_>) -> Result<(), sqlx::Error> {
            tx.rollback().await
        }

        async fn update(
            &self,
            conn: &mut $conn,
            a: $crate::store::Apply<'_>,
        ) -> Result<u64, sqlx::Error> {
            let done = sqlx::query(self.sql().update.clone())
                .bind(a.to)
                .bind(a.key.order_id)
                .bind(a.from)
                .bind(a.version)
                .execute(conn)
                .await?;
            Ok(done.rows_affected())
        }

        async fn record(
            &self,
            conn: &mut $conn,
            a: $crate::store::Apply<'_>,
        ) -> Result<(), sqlx::Error> {
            sqlx::query(self.sql().record.clone())
                .bind(a.key.order_id)
                .bind(a.version + 1)
                .bind(a.from)
                .bind(a.to)
                .bind(a.key.event)
                .bind(a.key.ref_id)
                .bind(a.payload_hash)
                .bind(a.payload)
                .execute(conn)
                .await?;
            Ok(())
        }

        async fn get(
            &self,
            conn: &mut $conn,
            order_id: i64,
        ) -> Result<Option<(String, i64)>, sqlx::Error> {
            sqlx::query_as(self.sql().get.clone())
                .bind(order_id)
                .fetch_optional(conn)
                .await
        }

        async fn history(
            &self,
            conn: &mut $conn,
            order_id: i64,
        ) -> Result<Vec<$crate::store::RawTransition>, sqlx::Error> {
            let rows: Vec<$crate::store::HistoryRow> = sqlx::query_as(self.sql().history.clone())
                .bind(order_id)
                .fetch_all(conn)
                .await?;
            Ok(rows
                .into_iter()
                .map($crate::store::RawTransition::from)
                .collect())
        }
    };
}

/// `Store::attempt` and `Store::first_round` for a store without data-modifying CTEs
/// (MySQL/MariaDB, SQLite): the floor's statements in a short transaction, `BEGIN`; the
/// store's `bump` (`UPDATE … SET status = to, version = version + 1 WHERE id = ? AND
/// status = from`, returning the new version); the history insert; `COMMIT`. Events with
/// several source states are not attempted: the recorded `from` would need the matched
/// row. Needs `first_round: FirstRound` and the inherent `bump`.
#[allow(unused_macros)] // PostgreSQL has its own; a build may have neither of the others
macro_rules! transaction_attempt {
    () => {
        async fn attempt(
            &self,
            conn: &mut Self::Conn,
            request: $crate::store::Request<'_>,
        ) -> Result<$crate::store::Optimistic, sqlx::Error> {
            use $crate::store::{Apply, Optimistic};
            let ([from], [to]) = (request.from_states, request.to_states) else {
                return Ok(Optimistic::NotTried);
            };
            let mut tx = Self::begin(conn, false).await?;
            let Some(version) = self.bump(&mut *tx, request.key.order_id, from, to).await? else {
                Self::rollback(tx).await?;
                return Ok(Optimistic::NotApplied);
            };
            let apply = Apply {
                key: request.key,
                from,
                to,
                version: version - 1,
                payload_hash: request.payload_hash,
                payload: request.payload,
            };
            if let Err(e) = self.record(&mut *tx, apply).await {
                // Recorded before (a unique violation), or a failure: undo the update.
                Self::rollback(tx).await?;
                return Err(e);
            }
            Self::commit(tx).await?;
            Ok(Optimistic::Applied(
                (*from).to_string(),
                (*to).to_string(),
                version,
            ))
        }

        fn first_round(&self) -> &$crate::store::FirstRound {
            &self.first_round
        }
    };
}

/// `with_read_first` and `recent_replay_share`, for a store with a `first_round:
/// FirstRound` field; `$from` is the share its `Adaptive` policy reads first from.
#[allow(unused_macros)] // a build with no server backend has no use for it
macro_rules! first_round_methods {
    ($from:literal) => {
        #[doc = concat!(
                    "This store, starting each transition as `policy` says (default ",
                    "[`ReadFirst::Adaptive`], reading first from a replay share of ", $from, ")."
                )]
        pub fn with_read_first(mut self, policy: ReadFirst) -> Self {
            self.first_round = self.first_round.with_policy(policy);
            self
        }

        /// The share of recent transitions through this store (and its clones) that were
        /// replays, between 0 and 1, as [`ReadFirst::Adaptive`] counts it; 0 under the
        /// other policies. A cheap gauge for metrics.
        pub fn recent_replay_share(&self) -> f64 {
            self.first_round.share()
        }
    };
}

/// `Store::BATCHES_READS` and `Store::priors` for a store that reads a batch in one
/// statement, for a store type with an inherent `fn batch_reads(&self) -> &BatchReads`: its statement for
/// the batch's size rounded up to a power of two, each request bound in order as (order
/// id, event, reference), the unused places as NULLs, which match nothing; each row back
/// is `(position from 0, from, to, payload hash, seq)`. A lone request is read with the
/// store's plain `prior` statement.
#[allow(unused_macros)] // SQLite reads one request per statement
macro_rules! batched_priors {
    () => {
        const BATCHES_READS: bool = true;

        async fn priors(
            &self,
            conn: &mut Self::Conn,
            keys: &[$crate::store::OwnedKey],
        ) -> Result<Vec<Option<$crate::store::Prior>>, sqlx::Error> {
            if let [key] = keys {
                return Ok(vec![self.prior(conn, key.as_key(), false).await?]);
            }
            let mut priors = Vec::with_capacity(keys.len());
            for chunk in keys.chunks($crate::store::PRIORS_MAX) {
                let size = chunk.len().next_power_of_two();
                let mut query = sqlx::query_as(self.batch_reads().sql(size).clone());
                for key in chunk {
                    query = query.bind(key.order_id).bind(key.event).bind(&key.ref_id);
                }
                for _ in chunk.len()..size {
                    query = query
                        .bind(None::<i64>)
                        .bind(None::<&str>)
                        .bind(None::<&str>);
                }
                let rows: Vec<$crate::store::PositionedPrior> = query.fetch_all(&mut *conn).await?;
                priors.extend($crate::store::in_place(chunk.len(), rows));
            }
            Ok(priors)
        }
    };
}

/// The most requests one batched read reads; a larger batch is read in several.
#[allow(dead_code)] // SQLite reads one request per statement
pub(crate) const PRIORS_MAX: usize = 64;

/// A store's batched read in each size: 1, 2, 4, … [`PRIORS_MAX`] requests. Powers of two,
/// so that a handful of prepared statements serve every batch.
#[derive(Debug, Clone)]
#[allow(dead_code)] // SQLite reads one request per statement
pub(crate) struct BatchReads(std::sync::Arc<[sqlx::SqlStr]>);

#[allow(dead_code)] // SQLite reads one request per statement
impl BatchReads {
    /// The statements, from the backend's SQL for `n` requests.
    pub(crate) fn new(sql_for: impl Fn(usize) -> String) -> Self {
        use sqlx::SqlSafeStr;
        let sizes = std::iter::successors(Some(1), |n| (*n < PRIORS_MAX).then_some(n * 2));
        BatchReads(
            sizes
                .map(|n| sqlx::AssertSqlSafe(sql_for(n)).into_sql_str())
                .collect(),
        )
    }

    /// The statement for up to `n` requests (`n` rounded up to a power of two, at most
    /// [`PRIORS_MAX`]).
    pub(crate) fn sql(&self, n: usize) -> &sqlx::SqlStr {
        let i = n.clamp(1, PRIORS_MAX).next_power_of_two().trailing_zeros();
        &self.0[i as usize]
    }
}

/// A row of a batched read: the request's position, then a [`PriorRow`].
pub type PositionedPrior = (i64, String, String, Option<String>, i64);

/// The answers of a batched read of `n` requests, in the order asked. A position out of
/// range would be a server fault; its row is left out rather than misplaced.
#[allow(dead_code)] // SQLite reads one request per statement
pub(crate) fn in_place(n: usize, rows: Vec<PositionedPrior>) -> Vec<Option<Prior>> {
    let mut answers = vec![None; n];
    for (position, from, to, payload_hash, seq) in rows {
        if let Some(answer) = usize::try_from(position)
            .ok()
            .and_then(|i| answers.get_mut(i))
        {
            *answer = Some(Prior::from((from, to, payload_hash, seq)));
        }
    }
    answers
}

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// Names of the tables orderly reads and writes, so it can drive an existing table.
///
/// The entity table needs the columns `id` (64-bit integer key), `status` (text) and
/// `version` (64-bit integer); any other columns are left alone. The history table has the
/// layout of `order_transitions` in `migrations/<backend>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    orders: String,
    history: String,
}

impl Default for Tables {
    /// `orders` and `order_transitions`, as created by the migrations.
    fn default() -> Self {
        Tables {
            orders: "orders".into(),
            history: "order_transitions".into(),
        }
    }
}

impl Tables {
    /// Custom table names. Each must be an identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most
    /// 63 bytes), optionally qualified by a schema (`schema.table`); anything else is
    /// [`Error::InvalidInput`]. Names are quoted in SQL, so reserved words work.
    pub fn new(orders: &str, history: &str) -> Result<Self, Error> {
        Ok(Tables {
            orders: validate_name(orders)?,
            history: validate_name(history)?,
        })
    }

    /// The entity table name.
    pub fn orders(&self) -> &str {
        &self.orders
    }

    /// The history table name.
    pub fn history(&self) -> &str {
        &self.history
    }

    /// Both names quoted with `q` (the backend's identifier quote).
    #[allow(dead_code)] // a build with no backend feature has no store
    pub(crate) fn quoted(&self, q: char) -> (String, String) {
        (quote(&self.orders, q), quote(&self.history, q))
    }
}

fn validate_name(name: &str) -> Result<String, Error> {
    let ok_part = |p: &str| {
        let mut chars = p.chars();
        p.len() <= 63
            && chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|p| ok_part(p)) {
        Ok(name.to_string())
    } else {
        Err(Error::InvalidInput(format!(
            "table name {name:?} is not an identifier ([A-Za-z_][A-Za-z0-9_]*, optionally schema-qualified)"
        )))
    }
}

#[allow(dead_code)] // a build with no backend feature has no store
fn quote(name: &str, q: char) -> String {
    name.split('.')
        .map(|p| format!("{q}{p}{q}"))
        .collect::<Vec<_>>()
        .join(".")
}

/// The identity of a transition request.
#[derive(Debug, Clone, Copy)]
pub struct Key<'a> {
    /// The entity.
    pub order_id: i64,
    /// The event name.
    pub event: &'static str,
    /// The caller's reference.
    pub ref_id: &'a str,
}

/// A [`Key`] that owns its reference, for a request queued for a batched read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedKey {
    /// The entity.
    pub order_id: i64,
    /// The event name.
    pub event: &'static str,
    /// The caller's reference.
    pub ref_id: String,
}

impl OwnedKey {
    /// Borrowed again.
    pub fn as_key(&self) -> Key<'_> {
        Key {
            order_id: self.order_id,
            event: self.event,
            ref_id: &self.ref_id,
        }
    }
}

impl From<Key<'_>> for OwnedKey {
    fn from(key: Key<'_>) -> Self {
        OwnedKey {
            order_id: key.order_id,
            event: key.event,
            ref_id: key.ref_id.to_string(),
        }
    }
}

/// A transition request as a store sees it: the key, the edges its event may take, and
/// the payload. Stores that can apply optimistically in the same statement as their read
/// use the edges; the others read only.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The request's identity.
    pub key: Key<'a>,
    /// States the event leaves from, in the same order as `to_states`.
    pub from_states: &'a [&'static str],
    /// The state each of `from_states` leads to on this event.
    pub to_states: &'a [&'static str],
    /// Payload fingerprint.
    pub payload_hash: Option<&'a str>,
    /// Payload JSON text.
    pub payload: Option<&'a str>,
}

/// Whether the read also attempted the update (see [`Store::observe`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Optimistic {
    /// The store only read.
    #[default]
    NotTried,
    /// The store tried the conditional update and it did not apply: if the judge would
    /// apply on what the store read, the entity moved in between, so the engine tries
    /// again.
    NotApplied,
    /// The store applied the transition in the same statement: `(from, to, version)`.
    Applied(String, String, i64),
}

/// A history row as stored, before its names are parsed into the machine's types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawTransition {
    /// Version of the entity after this transition.
    pub seq: i64,
    /// State before.
    pub from: String,
    /// State after.
    pub to: String,
    /// Event name.
    pub event: String,
    /// Caller's reference.
    pub ref_id: String,
    /// SHA-256 of the payload, hex, if one was given.
    pub payload_hash: Option<String>,
    /// The payload as JSON text, if one was given.
    pub payload: Option<String>,
    /// When it was recorded.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// The judge's read as one row, in the column order every backend's `observe` statement
/// returns: the entity `(status, version)` and this request's history row
/// `(from_status, to_status, payload_hash, seq)`, the latter all-NULL when absent. The
/// statements select the entity row and left-join the history row, so when the entity is
/// missing no row comes back and [`Store::prior`] is asked instead.
pub type ObservedRow = (
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
);

impl Observed {
    /// Assembles the judge's view from an `observe` row and what the statement did about
    /// the update.
    pub fn from_row(row: ObservedRow, optimistic: Optimistic) -> Self {
        let (status, version, from, to, payload_hash, seq) = row;
        Observed {
            current: status.zip(version),
            prior: match (from, to, seq) {
                (Some(from), Some(to), Some(seq)) => Some(Prior {
                    seq,
                    from,
                    to,
                    payload_hash,
                }),
                _ => None,
            },
            optimistic,
        }
    }
}

/// A history row in the column order every backend's `history` statement returns.
pub type HistoryRow = (
    i64,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    chrono::DateTime<chrono::Utc>,
);

impl From<HistoryRow> for RawTransition {
    fn from(r: HistoryRow) -> Self {
        RawTransition {
            seq: r.0,
            from: r.1,
            to: r.2,
            event: r.3,
            ref_id: r.4,
            payload_hash: r.5,
            payload: r.6,
            created_at: r.7,
        }
    }
}

/// What the judge reads first, in one round trip: enough to answer a replay and to apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// The entity's `(status, version)`, or `None` if it does not exist.
    pub current: Option<(String, i64)>,
    /// The history row of this exact `(order, event, ref)`, if any.
    pub prior: Option<Prior>,
    /// Whether the same statement also applied the transition.
    pub optimistic: Optimistic,
}

/// A recorded application of the request being judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prior {
    /// Version after it.
    pub seq: i64,
    /// State before it.
    pub from: String,
    /// State after it.
    pub to: String,
    /// Payload fingerprint recorded with it.
    pub payload_hash: Option<String>,
}

/// A history row as every backend's `prior` statement returns it:
/// `(from_status, to_status, payload_hash, seq)`.
pub type PriorRow = (String, String, Option<String>, i64);

impl From<PriorRow> for Prior {
    fn from((from, to, payload_hash, seq): PriorRow) -> Self {
        Prior {
            seq,
            from,
            to,
            payload_hash,
        }
    }
}

/// A conditional update the engine has decided on.
#[derive(Debug, Clone, Copy)]
pub struct Apply<'a> {
    /// The request.
    pub key: Key<'a>,
    /// Expected current status.
    pub from: &'static str,
    /// New status.
    pub to: &'static str,
    /// Expected current version; the new one is `version + 1`.
    pub version: i64,
    /// Payload fingerprint.
    pub payload_hash: Option<&'a str>,
    /// Payload JSON text.
    pub payload: Option<&'a str>,
}

/// How a store classifies a database error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Serialization failure, deadlock, busy, lock or pool timeout: try again.
    Retryable,
    /// The connection failed or was closed under the statement (an I/O error, a session
    /// killed or terminated by an administrator, the server shutting down or crashing).
    /// The connection is discarded. A write sent on it may or may not have committed:
    /// the engine re-reads the request on a fresh connection before it answers.
    ConnectionLost,
    /// Anything else.
    Fatal,
}

/// A backend: statements and error classification over the backend's own connection type.
///
/// Every method that takes `in_tx` runs inside the caller's transaction when it is true
/// (using a savepoint for its own atomic unit), and on its own otherwise.
pub trait Store: Clone + Send + Sync + 'static {
    /// The backend's connection (`SqliteConnection`, `PgConnection`, `MySqlConnection`).
    type Conn: Send;
    /// A connection borrowed from the store's pool.
    type Pooled: DerefMut<Target = Self::Conn> + Send;
    /// An open transaction or savepoint on a connection.
    type Tx<'c>: DerefMut<Target = Self::Conn> + Send;

    /// Borrows a connection from the pool.
    fn acquire(&self) -> impl Future<Output = Result<Self::Pooled, sqlx::Error>> + Send;

    /// Closes a pooled connection instead of returning it to the pool, for a connection
    /// whose state is unknown: a conversation on it was interrupted (its caller dropped
    /// the future) or it failed. Closing the socket makes the server roll back whatever
    /// transaction was open on it; the pool opens a replacement when one is needed.
    fn discard(conn: Self::Pooled);

    /// Inserts the entity at `initial` with version 0 unless it exists; returns its
    /// `(status, version)` afterwards.
    fn create(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
        initial: &'static str,
    ) -> impl Future<Output = Result<(String, i64), sqlx::Error>> + Send;

    /// Reads what the judge needs, in one statement: the entity and, if the entity exists,
    /// this request's history row (see [`ObservedRow`]), with
    /// [`Optimistic::NotTried`]. Inside a caller's transaction (`in_tx`), a read that sees
    /// the latest commits.
    fn observe(
        &self,
        conn: &mut Self::Conn,
        request: Request<'_>,
        in_tx: bool,
    ) -> impl Future<Output = Result<Observed, sqlx::Error>> + Send;

    /// The apply-first attempt, outside a caller's transaction: write the transition along
    /// one of `request`'s edges if the entity is in its source state, with no read
    /// before and no version predicate, judging the status on the latest committed row,
    /// which the write locks. `Applied(from, to, version)` if it wrote; `NotApplied` if
    /// nothing matched; `NotTried` if this store does not attempt such a request. A
    /// request recorded before must be stopped by the history's unique key, undoing the
    /// attempt, and reported as that unique violation.
    fn attempt(
        &self,
        conn: &mut Self::Conn,
        request: Request<'_>,
    ) -> impl Future<Output = Result<Optimistic, sqlx::Error>> + Send;

    /// The store's [`ReadFirst`] policy and the share of replays it counts.
    fn first_round(&self) -> &FirstRound;

    /// This request's history row alone, for when the entity row is missing (a request
    /// recorded for an entity that no longer exists is still a replay).
    fn prior(
        &self,
        conn: &mut Self::Conn,
        key: Key<'_>,
        in_tx: bool,
    ) -> impl Future<Output = Result<Option<Prior>, sqlx::Error>> + Send;

    /// Whether [`priors`](Self::priors) reads many requests in one statement. If so, the
    /// engine coalesces the read-first reads of concurrent callers (see [`ReadFirst`]);
    /// if not, each reads its own row on its own connection.
    const BATCHES_READS: bool = false;

    /// The history rows of several requests, outside a caller's transaction: for each
    /// key, in order, its row if it was recorded. One statement on a store that
    /// [batches reads](Self::BATCHES_READS); by default, one [`prior`](Self::prior) read
    /// after another.
    fn priors(
        &self,
        conn: &mut Self::Conn,
        keys: &[OwnedKey],
    ) -> impl Future<Output = Result<Vec<Option<Prior>>, sqlx::Error>> + Send {
        async move {
            let mut priors = Vec::with_capacity(keys.len());
            for key in keys {
                priors.push(self.prior(conn, key.as_key(), false).await?);
            }
            Ok(priors)
        }
    }

    /// The reference under which `key.event` was last applied to `key.order_id`, if ever.
    /// Read only when the event is not allowed from the current state, to tell a
    /// conflicting reference (`RefConflict`) from an invalid event.
    fn latest_ref(
        &self,
        conn: &mut Self::Conn,
        key: Key<'_>,
        in_tx: bool,
    ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send;

    /// Starts the atomic unit of an apply: `BEGIN` (or the backend's write-intent form)
    /// on a pooled connection, a savepoint inside the caller's transaction.
    fn begin(
        conn: &mut Self::Conn,
        in_tx: bool,
    ) -> impl Future<Output = Result<Self::Tx<'_>, sqlx::Error>> + Send + '_;

    /// Commits what [`begin`](Self::begin) started.
    fn commit(tx: Self::Tx<'_>) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_;

    /// Rolls back what [`begin`](Self::begin) started.
    fn rollback(tx: Self::Tx<'_>) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_;

    /// `UPDATE … SET status = to, version = version + 1 WHERE id = ? AND status = from AND
    /// version = v`; returns the number of rows matched (0 or 1).
    fn update(
        &self,
        conn: &mut Self::Conn,
        apply: Apply<'_>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Inserts the history row with `seq = version + 1`. A unique violation means a twin
    /// request won; the engine classifies it with [`is_unique_violation`].
    fn record(
        &self,
        conn: &mut Self::Conn,
        apply: Apply<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The entity's `(status, version)`.
    fn get(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
    ) -> impl Future<Output = Result<Option<(String, i64)>, sqlx::Error>> + Send;

    /// The entity's history, oldest first.
    fn history(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
    ) -> impl Future<Output = Result<Vec<RawTransition>, sqlx::Error>> + Send;

    /// Classifies a database error by the backend's codes.
    fn classify(err: &sqlx::Error) -> ErrorClass;
}

/// Which round trip a transition starts with, outside a caller's transaction (where the
/// engine always reads first). The outcome is the same either way; only the cost differs.
///
/// Trying to apply first answers a new request with the floor's statements (on PostgreSQL
/// one statement; on MySQL/MariaDB and SQLite `BEGIN; UPDATE; INSERT; COMMIT`, for an
/// event with one source state). But a replay then costs the attempt, which writes
/// nothing, and the read after it: two round trips on PostgreSQL, four on MySQL/MariaDB,
/// and on SQLite a wait for the single write lock. Reading the request's history row
/// first answers a replay with that one read, and costs a new request one round trip
/// more.
///
/// On a store that [batches reads](Store::BATCHES_READS) (PostgreSQL, MySQL/MariaDB), the
/// engine reads first before taking a connection, and the reads of concurrent callers
/// share statements: while one is in flight, those that arrive queue for the next, which
/// reads them all. A lone caller's read goes at once; no answer changes (docs/design.md,
/// "Why are the reads of a storm batched?").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadFirst {
    /// Always try to apply first.
    Never,
    /// Always read first.
    Always,
    /// Try to apply first, but read first while replays make up enough of the recent
    /// requests through this store (an exponentially weighted share, over roughly the
    /// last 16) for reading first to be cheaper: a storm of redelivered callbacks.
    /// PostgreSQL reads first from a share of 3/8, MySQL/MariaDB and SQLite from 1/4.
    #[default]
    Adaptive,
}

/// A store's [`ReadFirst`] policy, with the recent share of replays that `Adaptive`
/// goes by. Clones share the share, so every clone of an engine feeds the same one.
#[derive(Debug, Clone)]
#[allow(dead_code)] // a build with no backend has no store
pub struct FirstRound {
    policy: ReadFirst,
    /// In 1/1024ths, the share from which `Adaptive` reads first.
    read_first_from: u32,
    replays: std::sync::Arc<ReplayRate>,
}

#[allow(dead_code)] // a build with no backend has no store
impl FirstRound {
    /// `Adaptive` by default, reading first from a share of `read_first_from`/1024.
    pub fn new(read_first_from: u32) -> Self {
        FirstRound {
            policy: ReadFirst::default(),
            read_first_from,
            replays: Default::default(),
        }
    }

    /// The same with `policy`.
    pub fn with_policy(self, policy: ReadFirst) -> Self {
        FirstRound { policy, ..self }
    }

    /// Whether the next request should start with the read.
    pub fn reads_first(&self) -> bool {
        match self.policy {
            ReadFirst::Never => false,
            ReadFirst::Always => true,
            ReadFirst::Adaptive => self.replays.get() >= self.read_first_from,
        }
    }

    /// Whether a request turned out to be a replay: once per request, from its first
    /// round of the store's work.
    pub fn note(&self, replay: bool) {
        if self.policy == ReadFirst::Adaptive {
            self.replays.note(replay);
        }
    }

    /// The share, between 0 and 1.
    pub fn share(&self) -> f64 {
        f64::from(self.replays.get()) / f64::from(ReplayRate::ONE)
    }
}

/// The share of recent requests that were replays, exponentially weighted (each new
/// request weighs 1/16), in 1/1024ths.
#[derive(Debug, Default)]
pub(crate) struct ReplayRate(std::sync::atomic::AtomicU32);

impl ReplayRate {
    const ONE: u32 = 1024;

    /// Concurrent callers may overwrite each other's update: the share is a hint, and a
    /// lost sample only delays it.
    fn note(&self, replay: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let old = self.0.load(Relaxed);
        let sample = if replay { Self::ONE } else { 0 };
        self.0.store(old - old / 16 + sample / 16, Relaxed);
    }

    fn get(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Wraps a driver error with the store's classification.
pub(crate) fn db_error<S: Store>(source: sqlx::Error) -> Error {
    let retryable = S::classify(&source) != ErrorClass::Fatal;
    Error::Database { source, retryable }
}

/// Classification shared by all drivers: errors about the pool or the connection rather
/// than the statement. `None` for a database error, which each backend classifies by its
/// codes.
#[allow(dead_code)] // used by every backend, and no backend is also a valid build
pub(crate) fn classify_common(err: &sqlx::Error) -> Option<ErrorClass> {
    match err {
        sqlx::Error::PoolTimedOut => Some(ErrorClass::Retryable),
        // The socket failed or closed (a killed session, a crashed server, a reset), the
        // server's reply could not be read (a stream cut mid-message), or SQLite's worker
        // thread is gone: the connection cannot be trusted again.
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => Some(ErrorClass::ConnectionLost),
        sqlx::Error::Database(_) => None,
        _ => Some(ErrorClass::Fatal),
    }
}

/// Whether `err` is a unique-key violation (a twin request's history row).
pub fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(e) if e.is_unique_violation())
}

#[cfg(test)]
mod first_round_tests {
    use super::{FirstRound, ReadFirst};

    /// How many replays in a row switch an adaptive store to reading first, and how many
    /// new requests after that switch it back.
    fn switch_points(read_first_from: u32) -> (u32, u32) {
        let first = FirstRound::new(read_first_from);
        let mut replays = 0;
        while !first.reads_first() {
            first.note(true);
            replays += 1;
            assert!(replays < 200, "never reads first");
        }
        for _ in 0..100 {
            first.note(true);
        }
        let mut fresh = 0;
        while first.reads_first() {
            first.note(false);
            fresh += 1;
        }
        (replays, fresh)
    }

    #[test]
    fn adaptive_reads_first_in_a_storm_and_stops_after_it() {
        // 1 - (15/16)^n reaches 3/4 at n = 22 and 1/4 at n = 5; the share falls below 3/4
        // after 5 new requests and below 1/4 after 22 (integer rounding may add one).
        let (on, off) = switch_points(768);
        assert!(
            (22..=23).contains(&on) && (5..=6).contains(&off),
            "{on} {off}"
        );
        let (on, off) = switch_points(256);
        assert!(
            (5..=6).contains(&on) && (21..=23).contains(&off),
            "{on} {off}"
        );
    }

    #[test]
    fn fixed_policies_ignore_the_share() {
        let never = FirstRound::new(0).with_policy(ReadFirst::Never);
        let always = FirstRound::new(1024).with_policy(ReadFirst::Always);
        for _ in 0..50 {
            never.note(true);
            always.note(false);
        }
        assert!(!never.reads_first() && always.reads_first());
        assert_eq!((never.share(), always.share()), (0.0, 0.0));
    }
}
