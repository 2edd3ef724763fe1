//! A driver error from the user's own statements, classified by the backend it came
//! from, as orderly's stores classify theirs.

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
use super::errors::classify_common;
use crate::error::Error;
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
            return crate::backend::postgres::errors::classify(err);
        }
        #[cfg(feature = "mysql")]
        if db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some()
        {
            return crate::backend::mysql::errors::classify(err);
        }
        #[cfg(feature = "sqlite")]
        if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
            || db
                .try_downcast_ref::<crate::backend::sqlite::errors::WriterError>()
                .is_some()
        {
            return crate::backend::sqlite::errors::classify(err);
        }
    }
    let _ = err;
    ErrorClass::Fatal
}
