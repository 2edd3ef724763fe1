//! PostgreSQL's SQLSTATEs, classified.

use crate::backend::errors::classify_common;
use crate::store::ErrorClass;

/// PostgreSQL's SQLSTATEs: serialization failure, deadlock and lock timeout are
/// retryable; an administrator's shutdown or termination and the connection exceptions
/// (class 08) lose the connection.
pub(crate) fn classify(err: &sqlx::Error) -> ErrorClass {
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
