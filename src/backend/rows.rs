//! The judge's read as the backends decode it: one row of the entity left-joined to the
//! request's history row.

use crate::store::{Entity, Observed, Prior};

/// The judge's read as one row: the entity, left-joined to this request's history row,
/// whose columns are all NULL when it is absent.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ObservedRow {
    status: String,
    version: i64,
    from_status: Option<String>,
    to_status: Option<String>,
    payload_hash: Option<String>,
    seq: Option<i64>,
    write_id: Option<i64>,
}

impl From<ObservedRow> for Observed {
    fn from(row: ObservedRow) -> Self {
        let prior = match (row.from_status, row.to_status, row.seq) {
            (Some(from), Some(to), Some(seq)) => Some(Prior {
                seq,
                from,
                to,
                payload_hash: row.payload_hash,
                write_id: row.write_id,
            }),
            _ => None,
        };
        Observed {
            entity: Entity {
                status: row.status,
                version: row.version,
            },
            prior,
        }
    }
}
