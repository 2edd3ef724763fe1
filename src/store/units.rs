//! How every SQL backend ends a write unit: committed if it applied something, rolled
//! back otherwise, and rolled back after an error.

use sqlx::{Database, Transaction};

use super::FirstWrite;

/// Ends a unit of apply-first writes: committed if one of them applied, else rolled
/// back (it wrote nothing).
pub(crate) async fn end_unit<DB: Database>(
    tx: Transaction<'_, DB>,
    written: Vec<FirstWrite>,
) -> Result<Vec<FirstWrite>, sqlx::Error> {
    if written
        .iter()
        .any(|w| matches!(w, FirstWrite::Applied { .. }))
    {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(written)
}

/// Rolls a write unit back after `error`, and returns the error. A rollback that fails
/// too (on a connection already lost) adds nothing to what `error` says.
pub(crate) async fn undo<DB: Database, T>(
    tx: Transaction<'_, DB>,
    error: sqlx::Error,
) -> Result<T, sqlx::Error> {
    let _ = tx.rollback().await;
    Err(error)
}
