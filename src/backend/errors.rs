//! How driver errors are classified whatever the backend: the classes every driver
//! shares (the pool, the connection), a server's refusal to connect, a unique key met,
//! and a driver error from the user's own statements, classified by the backend it came
//! from. Each backend's own codes are in `backend/<dialect>/errors.rs`.

use crate::Error;
use crate::store::ErrorClass;

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
            return super::postgres::errors::classify(err);
        }
        #[cfg(feature = "mysql")]
        if db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some()
        {
            return super::mysql::errors::classify(err);
        }
        #[cfg(feature = "sqlite")]
        if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
            || db
                .try_downcast_ref::<super::sqlite::errors::WriterError>()
                .is_some()
        {
            return super::sqlite::errors::classify(err);
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
