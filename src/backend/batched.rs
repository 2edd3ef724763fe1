//! Batched reads of requests' history rows: the statement for a batch's size, and the
//! answers put back in the order asked.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::store::{PositionedPrior, Prior};

/// The most requests one batched read of PostgreSQL or MySQL/MariaDB reads.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const BATCH_READ_MAX: usize = 64;

/// A store's batched read in each size: 1, 2, 4, … [`BATCH_READ_MAX`] requests. Powers of two,
/// so that a handful of prepared statements serve every batch; the unused places are
/// bound as NULLs, which match nothing.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug, Clone)]
pub(crate) struct BatchReads(std::sync::Arc<[sqlx::SqlStr]>);

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl BatchReads {
    /// The statements, from the backend's SQL for `n` requests.
    pub(crate) fn new(sql_for: impl Fn(usize) -> String) -> Self {
        use sqlx::SqlSafeStr;
        let sizes = std::iter::successors(Some(1), |n| (*n < BATCH_READ_MAX).then_some(n * 2));
        BatchReads(
            sizes
                .map(|n| sqlx::AssertSqlSafe(sql_for(n)).into_sql_str())
                .collect(),
        )
    }

    /// The statement for `n` requests (`n` rounded up to a power of two; at most
    /// [`BATCH_READ_MAX`]), and how many places are left over, to be bound as NULLs.
    pub(crate) fn sql(&self, n: usize) -> (&sqlx::SqlStr, usize) {
        let size = n.clamp(1, BATCH_READ_MAX).next_power_of_two();
        (
            &self.0[size.trailing_zeros() as usize],
            size.saturating_sub(n),
        )
    }
}

/// The answers of a batched read of `n` requests, in the order asked. A position out of
/// range would be a server fault; its row is left out rather than misplaced.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn in_place(n: usize, rows: Vec<PositionedPrior>) -> Vec<Option<Prior>> {
    let mut answers = vec![None; n];
    for row in rows {
        if let Some(answer) = usize::try_from(row.i).ok().and_then(|i| answers.get_mut(i)) {
            *answer = Some(row.prior);
        }
    }
    answers
}
