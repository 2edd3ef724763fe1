//! What every backend's error classes share: errors about the pool or the connection
//! rather than the statement, a server's refusal to connect, a unique key met. Each
//! backend's own codes are in `backend/<dialect>/errors.rs`; a driver error from the
//! user's own statements is classified by the backend it came from in `classify.rs`.

use crate::store::ErrorClass;

/// Classification shared by all drivers: errors about the pool or the connection rather
/// than the statement. `None` for a database error, which each backend classifies by its
/// codes.
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
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(e) if e.is_unique_violation())
}
