//! How a store's errors are classified: retryable, connection lost, or fatal. Each
//! backend classifies its own dialect's codes (`backend/<dialect>/errors.rs`), the
//! classes every driver shares are in `backend/errors.rs`.

use super::Store;
use crate::error::Error;

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
