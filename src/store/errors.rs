//! How a store's errors are classified: retryable, connection lost, or fatal: the classes
//! that do not depend on the backend, and each dialect's codes (`classify_postgres`,
//! `classify_mysql`, `classify_sqlite`), which the backends' `Store::classify` call.

use super::Store;
use crate::Error;

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

/// Wraps a driver error with the store's classification.
pub(crate) fn db_error<S: Store>(source: sqlx::Error) -> Error {
    let retryable = S::classify(&source) != ErrorClass::Fatal;
    Error::Database { source, retryable }
}

/// A driver error from your own statements (inside [`Records::run`](crate::Records::run)'s
/// work, a flow's local step, your own transaction), classified as orderly's stores
/// classify theirs: a lost connection, a deadlock, a serialization failure or a busy
/// database is [`Error::Database`] with `retryable: true`; anything else is not. So `?`
/// on a `sqlx::Error` gives the caller the same [`Error::is_retryable`] answer an
/// orderly call would.
impl From<sqlx::Error> for Error {
    fn from(source: sqlx::Error) -> Self {
        let retryable = classify_any(&source) != ErrorClass::Fatal;
        Error::Database { source, retryable }
    }
}

/// Classifies a driver error by the backend it came from: the shared classes of
/// [`classify_common`], then the codes of whichever compiled backend's error type the
/// database error is. Fatal when no backend claims it.
pub(crate) fn classify_any(err: &sqlx::Error) -> ErrorClass {
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    if let Some(class) = classify_common(err) {
        return class;
    }
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    if let sqlx::Error::Database(db) = err {
        #[cfg(feature = "postgres")]
        if db
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .is_some()
        {
            return classify_postgres(err);
        }
        #[cfg(feature = "mysql")]
        if db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some()
        {
            return classify_mysql(err);
        }
        #[cfg(feature = "sqlite")]
        if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
            || db.try_downcast_ref::<WriterError>().is_some()
        {
            return classify_sqlite(err);
        }
    }
    let _ = err;
    ErrorClass::Fatal
}

/// Classification shared by all drivers: errors about the pool or the connection rather
/// than the statement. `None` for a database error, which each backend classifies by its
/// codes.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
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

/// A server's refusal to open a connection (PostgreSQL's "database is not accepting
/// connections", "the database system is starting up", too many connections; MySQL's
/// too many connections, server shutting down), told apart by `refusal`, becomes an I/O
/// error: like a connection that failed, it is [`ErrorClass::ConnectionLost`]
/// (retryable), and a call that met it with no connection of its own answers
/// [`Error::Unavailable`]. The same code from a statement on an open connection (55000
/// on PostgreSQL is also "object not in prerequisite state") is not converted, as it
/// never passes here. The server's error stays the I/O error's source.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn refused(
    err: sqlx::Error,
    refusal: impl Fn(&dyn sqlx::error::DatabaseError) -> bool,
) -> sqlx::Error {
    match &err {
        sqlx::Error::Database(db) if refusal(db.as_ref()) => sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            err,
        )),
        _ => err,
    }
}

/// Whether `err` is a unique-key violation (a twin request's history row).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(e) if e.is_unique_violation())
}

/// PostgreSQL's SQLSTATEs: serialization failure, deadlock and lock timeout are
/// retryable; an administrator's shutdown or termination and the connection exceptions
/// (class 08) lose the connection.
#[cfg(feature = "postgres")]
pub(crate) fn classify_postgres(err: &sqlx::Error) -> ErrorClass {
    if let Some(class) = classify_common(err) {
        return class;
    }
    let code = match err {
        sqlx::Error::Database(db) => db.code(),
        _ => None,
    };
    match code.as_deref() {
        Some("40001" | "40P01" | "55P03") => ErrorClass::Retryable,
        // 25006 `read_only_sql_transaction`: the connection is on a standby (an endpoint
        // still routing to a node that is no longer the primary). Nothing was written;
        // the connection is discarded, and the next one finds the primary.
        Some("57P01" | "57P02" | "57P03" | "40003" | "25006") => ErrorClass::ConnectionLost,
        Some(c) if c.starts_with("08") => ErrorClass::ConnectionLost,
        _ => ErrorClass::Fatal,
    }
}

/// MySQL/MariaDB error numbers: deadlock, lock wait timeout and a Galera node not ready
/// (1047) are retryable; a killed session, the server shutting down and the lost-link
/// errors lose the connection.
#[cfg(feature = "mysql")]
pub(crate) fn classify_mysql(err: &sqlx::Error) -> ErrorClass {
    if let Some(class) = classify_common(err) {
        return class;
    }
    let (code, message) = match err {
        sqlx::Error::Database(db) => (
            db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .map(|e| e.number()),
            db.message(),
        ),
        _ => (None, ""),
    };
    match code {
        // 1305 for a savepoint that does not exist: the transaction that held it is gone
        // (on a Galera node another node's write set can roll a transaction back during
        // one of its reads without an error). The same number for a stored routine that
        // does not exist is not retryable.
        Some(1305) if message.starts_with("SAVEPOINT") => ErrorClass::Retryable,
        Some(1213 | 1205 | 1047) => ErrorClass::Retryable,
        Some(1927 | 1053 | 1152 | 1158..=1161 | 2006 | 2013) => ErrorClass::ConnectionLost,
        _ => ErrorClass::Fatal,
    }
}

#[cfg(feature = "sqlite")]
/// SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes such as
/// SQLITE_BUSY_SNAPSHOT (517), are retryable.
pub(crate) fn classify_sqlite(err: &sqlx::Error) -> ErrorClass {
    if let Some(class) = classify_common(err) {
        return class;
    }
    let code = match err {
        sqlx::Error::Database(db) => db.code().and_then(|c| c.parse::<i32>().ok()),
        _ => None,
    };
    match code.map(|c| c & 0xff) {
        Some(5 | 6) => ErrorClass::Retryable,
        _ => ErrorClass::Fatal,
    }
}

/// A failure SQLite reported to the SQLite store's writer thread, which reaches SQLite
/// through a direct binding rather than sqlx: classified as sqlx's own `SqliteError` is,
/// by SQLite's extended result code.
#[cfg(feature = "sqlite")]
#[derive(Debug)]
pub(crate) struct WriterError {
    /// SQLite's extended result code.
    pub(crate) code: i32,
    pub(crate) message: String,
}

#[cfg(feature = "sqlite")]
impl std::fmt::Display for WriterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(code: {}) {}", self.code, self.message)
    }
}

#[cfg(feature = "sqlite")]
impl std::error::Error for WriterError {}

#[cfg(feature = "sqlite")]
impl sqlx::error::DatabaseError for WriterError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use sqlx::error::ErrorKind;
        match self.code {
            SQLITE_UNIQUE | SQLITE_PRIMARY_KEY => ErrorKind::UniqueViolation,
            SQLITE_FOREIGN_KEY => ErrorKind::ForeignKeyViolation,
            SQLITE_NOT_NULL => ErrorKind::NotNullViolation,
            SQLITE_CHECK => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// SQLite's extended result codes for a unique key, a primary key, a foreign key, a `NOT
/// NULL` and a `CHECK` met.
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE_UNIQUE: i32 = 2067;
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE_PRIMARY_KEY: i32 = 1555;
#[cfg(feature = "sqlite")]
const SQLITE_FOREIGN_KEY: i32 = 787;
#[cfg(feature = "sqlite")]
const SQLITE_NOT_NULL: i32 = 1299;
#[cfg(feature = "sqlite")]
const SQLITE_CHECK: i32 = 275;
