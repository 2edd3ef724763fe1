//! SQLite's result codes, classified, and the error of the SQLite store's writer thread.

use crate::backend::errors::classify_common;
use crate::store::ErrorClass;

/// SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes such as
/// SQLITE_BUSY_SNAPSHOT (517), are retryable.
pub(crate) fn classify(err: &sqlx::Error) -> ErrorClass {
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
#[derive(Debug)]
pub(crate) struct WriterError {
    /// SQLite's extended result code.
    pub(crate) code: i32,
    pub(crate) message: String,
}

impl std::fmt::Display for WriterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(code: {}) {}", self.code, self.message)
    }
}

impl std::error::Error for WriterError {}

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
pub(crate) const SQLITE_UNIQUE: i32 = 2067;
pub(crate) const SQLITE_PRIMARY_KEY: i32 = 1555;
const SQLITE_FOREIGN_KEY: i32 = 787;
const SQLITE_NOT_NULL: i32 = 1299;
const SQLITE_CHECK: i32 = 275;
