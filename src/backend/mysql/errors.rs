//! MySQL/MariaDB error numbers, classified.

use crate::backend::errors::classify_common;
use crate::store::ErrorClass;

/// MySQL/MariaDB error numbers: deadlock, lock wait timeout and a Galera node not ready
/// (1047) are retryable; a killed session, the server shutting down and the lost-link
/// errors lose the connection.
pub(crate) fn classify(err: &sqlx::Error) -> ErrorClass {
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
