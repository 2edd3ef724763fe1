//! The timer job's batch on SQLite: the writes after a read of distinct entities in two
//! statements (see [`Store::apply_many_in_batch`](crate::Store::apply_many_in_batch)).

use sqlx::sqlite::SqliteConnection;

use super::SqliteStore;
use crate::store::{Apply, Written};

/// The writes after a read of distinct entities inside the job's batch transaction: one
/// update of them all, guarded by each one's state and version, then the history rows of
/// those it moved. A history row refused by its unique key comes back as the error it is
/// (the batch's owner rolls back).
pub(super) async fn apply_batch(
    store: &SqliteStore,
    conn: &mut SqliteConnection,
    applies: &[Apply<'_>],
) -> Result<Vec<Written>, sqlx::Error> {
    let sql = &store.transitions;
    let updates: Vec<serde_json::Value> = applies
        .iter()
        .map(|a| serde_json::json!([a.key.order_id, a.from, a.to, a.version]))
        .collect();
    let moved: Vec<i64> = sqlx::query_scalar(sql.update_batch.clone())
        .bind(serde_json::Value::Array(updates).to_string())
        .fetch_all(&mut *conn)
        .await?;
    let written: Vec<Written> = applies
        .iter()
        .map(|a| match moved.contains(&a.key.order_id) {
            true => Written::Applied,
            false => Written::Lost,
        })
        .collect();
    let rows: Vec<serde_json::Value> = applies
        .iter()
        .zip(&written)
        .filter(|(_, w)| **w == Written::Applied)
        .map(|(a, _)| {
            serde_json::json!([
                a.key.order_id,
                a.version + 1,
                a.from,
                a.to,
                a.key.event,
                a.key.ref_id,
                a.payload_hash,
                a.payload,
                a.write_id,
                a.audit.actor,
                a.audit.reason
            ])
        })
        .collect();
    if !rows.is_empty() {
        let recorded = sqlx::query(sql.record_batch.clone())
            .bind(serde_json::Value::Array(rows).to_string())
            .execute(&mut *conn)
            .await?;
        if recorded.rows_affected() != moved.len() as u64 {
            return Err(sqlx::Error::Protocol(format!(
                "{} entities moved and {} history rows written",
                moved.len(),
                recorded.rows_affected()
            )));
        }
    }
    Ok(written)
}
