//! The store's writer: the apply-first units of the engine's own transactions, written on
//! a thread of the store's own through a direct binding (rusqlite) to the same database
//! file, its statements prepared once.
//!
//! sqlx runs each SQLite connection on a worker thread of its own and hands every
//! statement, and every statement's result, across to it. On two cores those hand-offs,
//! not SQLite, were most of a lone caller's time. Here a whole unit is one hand-off to the
//! writer and one back, whatever its size.
//!
//! The thread runs a unit to its end, `COMMIT`, or `ROLLBACK` on any failure, even when the
//! caller's future was dropped: a dropped call leaves its unit whole or absent, never half
//! written, and the write id tells a retry which.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{CachedStatement, Connection, OpenFlags, ToSql};
use sqlx::SqlStr;
use sqlx::sqlite::SqliteConnection;

use super::errors::{SQLITE_PRIMARY_KEY, SQLITE_UNIQUE, WriterError};
use super::units::UnitStatements;
use crate::store::{FirstWrite, Request};

/// Work for the writer's thread, on its connection.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The writer of one store and its clones: the sending end of its thread's queue. The
/// thread and its connection end when the last clone of the store is dropped.
pub(super) struct Writer {
    jobs: mpsc::Sender<Job>,
    /// Cleared when the thread ends: a transaction its connection could not end (a
    /// failed `ROLLBACK`) closes the connection, which undoes it, and the store's units
    /// go through the pool from then on.
    alive: Arc<AtomicBool>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Writer")
    }
}

/// The settings the writer's connection copies from the pool's, so that its writes are as
/// durable, and as patient with other writers, as the pool's.
struct Settings {
    file: String,
    busy_timeout_ms: i64,
    synchronous: i64,
    foreign_keys: i64,
}

impl Writer {
    /// A writer on the database file `conn` has open, with `conn`'s busy timeout,
    /// `synchronous` and `foreign_keys` settings, once `statements` prepare there (the
    /// tables the store drives exist on a plain connection to the file). `None` where a
    /// second connection cannot share the database: in memory or temporary (no file), or
    /// in exclusive locking mode; or where the file cannot be opened, or a statement does
    /// not prepare, on a plain connection (for example a table in a database attached by
    /// the pool's own connect hook). Without a writer the store writes its units through
    /// the pool.
    pub(super) async fn start(
        conn: &mut SqliteConnection,
        statements: Vec<SqlStr>,
    ) -> Result<Option<Writer>, sqlx::Error> {
        let file: Option<String> =
            sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
                .fetch_optional(&mut *conn)
                .await?;
        let locking: String = sqlx::query_scalar("PRAGMA locking_mode")
            .fetch_one(&mut *conn)
            .await?;
        let file = match file {
            Some(file) if !file.is_empty() && locking.eq_ignore_ascii_case("normal") => file,
            _ => return Ok(None),
        };
        let settings = Settings {
            file,
            busy_timeout_ms: pragma(conn, "PRAGMA busy_timeout").await?,
            synchronous: pragma(conn, "PRAGMA synchronous").await?,
            foreign_keys: pragma(conn, "PRAGMA foreign_keys").await?,
        };
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready, opened) = tokio::sync::oneshot::channel();
        let alive = Arc::new(AtomicBool::new(true));
        let living = Arc::clone(&alive);
        let spawned = std::thread::Builder::new()
            .name("orderly-sqlite-writer".into())
            .spawn(move || {
                let db = open(&settings, &statements);
                let opened = db.is_ok();
                if ready.send(opened).is_err() || !opened {
                    living.store(false, Ordering::Release);
                    return;
                }
                if let Ok(mut db) = db {
                    for job in queue {
                        job(&mut db);
                        // Every job ends its transaction; one left open is undone here,
                        // and a connection that cannot undo it is closed (which does).
                        if !db.is_autocommit()
                            && (db.execute_batch("ROLLBACK").is_err() || !db.is_autocommit())
                        {
                            break;
                        }
                    }
                }
                living.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            return Ok(None);
        }
        Ok(match opened.await {
            Ok(true) => Some(Writer { jobs, alive }),
            _ => None,
        })
    }

    /// Whether the thread still takes units.
    pub(super) fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// `work` on the writer's connection, after the units queued before it; skipped if
    /// its caller stopped waiting before its turn (nothing written, as a dropped call
    /// may find). A panic in `work` answers as a crashed worker (the thread then undoes
    /// what `work` left open and goes on); so does a writer whose thread is gone.
    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> T + Send + 'static,
    ) -> Result<T, sqlx::Error> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |db| {
            if reply.is_closed() {
                return;
            }
            if let Ok(done) = catch_unwind(AssertUnwindSafe(|| work(&mut *db))) {
                let _ = reply.send(done);
            }
        });
        self.jobs
            .send(job)
            .map_err(|_| sqlx::Error::WorkerCrashed)?;
        answer.await.map_err(|_| sqlx::Error::WorkerCrashed)
    }

    /// The apply-first writes of `requests`, of distinct entities, as one unit on the
    /// writer's connection (`BEGIN IMMEDIATE`, then the statements of
    /// [`UnitStatements`](super::units::UnitStatements): the update of every entity at its
    /// request's source state whose request is not recorded, returning the new versions;
    /// the history rows of those moved; their outbox rows), committed if any request
    /// applied. A request whose event has several source states is `NotTried`. `None` if
    /// a row met a unique key: nothing is left written, and the caller writes the requests
    /// one by one. Any other failure is undone and returned.
    pub(super) async fn write_unit(
        &self,
        sql: Arc<super::transitions::Sql>,
        requests: &[Request<'_>],
    ) -> Result<Option<Vec<FirstWrite>>, sqlx::Error> {
        let tried: Vec<Owned> = requests
            .iter()
            .enumerate()
            .filter_map(|(index, r)| match (r.from_states, r.to_states) {
                ([from], [to]) => Some(Owned::new(index, r, from, to)),
                _ => None,
            })
            .collect();
        let count = requests.len();
        let moved = self
            .run(move |db| write_unit(db, &sql.units, &tried).map(|m| m.map(|m| (m, tried))))
            .await?
            .map_err(driver_error)?;
        let Some((moved, tried)) = moved else {
            return Ok(None);
        };
        let mut written = vec![FirstWrite::NotTried; count];
        for t in &tried {
            written[t.index] = match moved.iter().find(|(id, _)| *id == t.order_id) {
                Some(&(_, version)) => FirstWrite::Applied {
                    from: t.from.to_string(),
                    to: t.to.to_string(),
                    version,
                },
                None => FirstWrite::NotApplied,
            };
        }
        Ok(Some(written))
    }
}

/// One request of one edge, owned, for the writer's thread.
struct Owned {
    index: usize,
    order_id: i64,
    from: &'static str,
    to: &'static str,
    event: &'static str,
    ref_id: String,
    payload_hash: Option<String>,
    payload: Option<String>,
    write_id: i64,
    actor: Option<String>,
    reason: Option<String>,
    machine: &'static str,
    emits: Option<&'static str>,
    body: Option<String>,
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl Owned {
    fn new(index: usize, r: &Request<'_>, from: &'static str, to: &'static str) -> Self {
        Owned {
            index,
            order_id: r.key.order_id,
            from,
            to,
            event: r.key.event,
            ref_id: r.key.ref_id.to_owned(),
            payload_hash: r.payload_hash.map(str::to_owned),
            payload: r.payload.map(str::to_owned),
            write_id: r.write_id,
            actor: r.audit.actor.map(str::to_owned),
            reason: r.audit.reason.map(str::to_owned),
            machine: r.machine,
            emits: r.emits.first().copied().flatten(),
            body: r.event_body.map(str::to_owned),
            traceparent: r.traceparent().map(str::to_owned),
            tracestate: r.tracestate().map(str::to_owned),
        }
    }
}

/// The unit of [`Writer::write_unit`] on `db`: the `(id, version)` of the entities moved,
/// `None` if a row met a unique key. Whatever does not commit is rolled back.
fn write_unit(
    db: &mut Connection,
    sql: &UnitStatements,
    tried: &[Owned],
) -> Result<Option<Vec<(i64, i64)>>, rusqlite::Error> {
    db.execute_batch("BEGIN IMMEDIATE")?;
    let written = statements(db, sql, tried).and_then(|moved| match moved {
        Some(moved) if !moved.is_empty() => db.execute_batch("COMMIT").map(|()| Some(moved)),
        nothing => Ok(nothing),
    });
    // Still open: nothing moved, a unique key met, a statement failed, or a `COMMIT`
    // that failed and left the transaction open (SQLite ends it on most failures).
    if !db.is_autocommit()
        && let Err(undone) = db.execute_batch("ROLLBACK")
    {
        return Err(written.err().unwrap_or(undone));
    }
    written
}

/// The three statements of a unit, in its open transaction.
fn statements(
    db: &Connection,
    sql: &UnitStatements,
    tried: &[Owned],
) -> Result<Option<Vec<(i64, i64)>>, rusqlite::Error> {
    let mut moved = Vec::with_capacity(tried.len());
    {
        let mut update = prepared(db, &sql.update.get(tried.len()))?;
        let mut at = 0;
        for t in tried {
            bind(&mut update, &mut at, &t.order_id)?;
            bind(&mut update, &mut at, &t.from)?;
            bind(&mut update, &mut at, &t.to)?;
            bind(&mut update, &mut at, &t.event)?;
            bind(&mut update, &mut at, &t.ref_id)?;
        }
        let mut rows = update.raw_query();
        while let Some(row) = rows.next()? {
            moved.push((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?));
        }
    }
    let moved_of = |t: &Owned| moved.iter().find(|(id, _)| *id == t.order_id).map(|m| m.1);
    let applied: Vec<(&Owned, i64)> = tried
        .iter()
        .filter_map(|t| Some((t, moved_of(t)?)))
        .collect();
    if applied.is_empty() {
        return Ok(Some(moved));
    }
    let mut insert = prepared(db, &sql.record.get(applied.len()))?;
    let mut at = 0;
    for (t, version) in &applied {
        bind(&mut insert, &mut at, &t.order_id)?;
        bind(&mut insert, &mut at, version)?;
        bind(&mut insert, &mut at, &t.from)?;
        bind(&mut insert, &mut at, &t.to)?;
        bind(&mut insert, &mut at, &t.event)?;
        bind(&mut insert, &mut at, &t.ref_id)?;
        bind(&mut insert, &mut at, &t.payload_hash)?;
        bind(&mut insert, &mut at, &t.payload)?;
        bind(&mut insert, &mut at, &t.write_id)?;
        bind(&mut insert, &mut at, &t.actor)?;
        bind(&mut insert, &mut at, &t.reason)?;
    }
    if unique_met(insert.raw_execute())? {
        return Ok(None);
    }
    let emitting: Vec<(&Owned, i64, &'static str)> = applied
        .iter()
        .filter_map(|&(t, version)| Some((t, version, t.emits?)))
        .collect();
    if !emitting.is_empty() {
        let mut insert = prepared(db, &sql.emit.get(emitting.len()))?;
        let mut at = 0;
        for (t, version, event) in &emitting {
            bind(&mut insert, &mut at, &t.machine)?;
            bind(&mut insert, &mut at, &t.order_id)?;
            bind(&mut insert, &mut at, version)?;
            bind(&mut insert, &mut at, event)?;
            bind(&mut insert, &mut at, &t.event)?;
            bind(&mut insert, &mut at, &t.from)?;
            bind(&mut insert, &mut at, &t.to)?;
            bind(&mut insert, &mut at, &t.ref_id)?;
            bind(&mut insert, &mut at, &t.body)?;
            bind(&mut insert, &mut at, &t.traceparent)?;
            bind(&mut insert, &mut at, &t.tracestate)?;
        }
        if unique_met(insert.raw_execute())? {
            return Ok(None);
        }
    }
    Ok(Some(moved))
}

/// The statement `sql` from the connection's cache, prepared on its first use.
fn prepared<'c>(db: &'c Connection, sql: &SqlStr) -> Result<CachedStatement<'c>, rusqlite::Error> {
    db.prepare_cached(sql.as_str())
}

/// Binds `value` to the next parameter of `statement` (numbered from 1).
fn bind(
    statement: &mut CachedStatement<'_>,
    at: &mut usize,
    value: &dyn ToSql,
) -> Result<(), rusqlite::Error> {
    *at += 1;
    statement.raw_bind_parameter(*at, value)
}

/// Whether an insert met a unique key (any other failure is returned).
fn unique_met(inserted: Result<usize, rusqlite::Error>) -> Result<bool, rusqlite::Error> {
    match inserted {
        Ok(_) => Ok(false),
        Err(e) if matches!(e.sqlite_error(), Some(f) if matches!(f.extended_code, SQLITE_UNIQUE | SQLITE_PRIMARY_KEY)) => {
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// The writer's connection: the file, read and write (it exists: the pool has it open),
/// with the pool's settings and a statement cache large enough for every size of unit
/// statement in use, once the statements of `check` prepare.
fn open(settings: &Settings, check: &[SqlStr]) -> Result<Connection, rusqlite::Error> {
    let db = Connection::open_with_flags(
        &settings.file,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    db.busy_timeout(Duration::from_millis(
        u64::try_from(settings.busy_timeout_ms).unwrap_or(0),
    ))?;
    db.execute_batch(&format!(
        "PRAGMA synchronous = {}; PRAGMA foreign_keys = {}",
        settings.synchronous, settings.foreign_keys
    ))?;
    db.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    for sql in check {
        db.prepare(sql.as_str())?;
    }
    Ok(db)
}

/// The writer's statement cache: three statements for each unit size up to the largest
/// coalesced unit (64 requests), with room.
const STATEMENT_CACHE: usize = 256;

/// Whether the pool opens the file as the writer's plain connection does: not read-only,
/// not immutable, through SQLite's default VFS (a pool on another VFS, `unix-dotfile`
/// say, locks the file where the writer's connection would not see it). sqlx has no
/// getters for these options; its derived `Debug` names them, and anything other than
/// the defaults there, field names included, starts no writer.
pub(super) fn plain_options(options: &sqlx::sqlite::SqliteConnectOptions) -> bool {
    let shown = format!("{options:?}");
    shown.contains("read_only: false")
        && shown.contains("immutable: false")
        && shown.contains("vfs: None")
}

/// A value of a pragma that answers with one integer.
async fn pragma(conn: &mut SqliteConnection, sql: &'static str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(sql).fetch_one(conn).await
}

/// A failure of the writer's connection as the driver's error: SQLite's own failures as a
/// database error with SQLite's extended code (classified as sqlx's are), anything else
/// (a value of an unexpected type) as a decoding error.
fn driver_error(e: rusqlite::Error) -> sqlx::Error {
    match e {
        rusqlite::Error::SqliteFailure(failure, message) => {
            sqlx::Error::Database(Box::new(WriterError {
                code: failure.extended_code,
                message: message.unwrap_or_else(|| failure.to_string()),
            }))
        }
        other => sqlx::Error::Decode(Box::new(other)),
    }
}
