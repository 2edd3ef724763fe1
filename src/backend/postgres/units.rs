//! The apply-first unit on PostgreSQL: one statement for one request, and one for a
//! batch of requests of distinct entities (arrays), each answered for itself.

use super::PgStore;
use super::transitions::is_outbox_taken;
use crate::backend::errors::is_unique_violation;
use crate::store::{FirstWrite, PositionedPrior, Prior, Request, Txn};
use sqlx::postgres::PgConnection;

impl PgStore {
    /// The apply-first statement for one request; a request recorded before comes back
    /// as the unique violation it is.
    pub(super) async fn first_write(
        &self,
        conn: &mut PgConnection,
        request: &Request<'_>,
        txn: Txn,
    ) -> Result<FirstWrite, sqlx::Error> {
        let sql = &self.transitions;
        let key = request.key;
        let emitting = request.emits_any();
        let query = match (request.from_states, request.to_states) {
            ([from], [to]) => {
                let statement = match (emitting, txn) {
                    (true, _) => &sql.apply_first_one_emitting,
                    (false, Txn::Own) => &sql.apply_first_one,
                    (false, Txn::Caller) => &sql.apply_first_in_one,
                };
                let query = sqlx::query_as(statement.clone())
                    .bind(key.order_id)
                    .bind(key.event)
                    .bind(key.ref_id)
                    .bind(request.payload_hash)
                    .bind(request.payload)
                    .bind(*from)
                    .bind(*to)
                    .bind(request.write_id);
                let query = if emitting {
                    query
                        .bind(request.emits.first().copied().flatten())
                        .bind(request.machine)
                        .bind(request.event_body)
                } else {
                    query
                }
                .bind(request.audit.actor)
                .bind(request.audit.reason);
                match emitting {
                    true => query.bind(request.traceparent()).bind(request.tracestate()),
                    false => query,
                }
            }
            (from, to) => {
                let statement = match (emitting, txn) {
                    (true, _) => &sql.apply_first_many_emitting,
                    (false, Txn::Own) => &sql.apply_first_many,
                    (false, Txn::Caller) => &sql.apply_first_in_many,
                };
                let query = sqlx::query_as(statement.clone())
                    .bind(key.order_id)
                    .bind(key.event)
                    .bind(key.ref_id)
                    .bind(request.payload_hash)
                    .bind(request.payload)
                    .bind(from)
                    .bind(to)
                    .bind(request.write_id);
                let query = if emitting {
                    query
                        .bind(request.emits)
                        .bind(request.machine)
                        .bind(request.event_body)
                } else {
                    query
                }
                .bind(request.audit.actor)
                .bind(request.audit.reason);
                match emitting {
                    true => query.bind(request.traceparent()).bind(request.tracestate()),
                    false => query,
                }
            }
        };
        Ok(match query.fetch_optional(conn).await? {
            Some(Prior { seq, from, to, .. }) => FirstWrite::Applied {
                from,
                to,
                version: seq,
            },
            None => FirstWrite::NotApplied,
        })
    }
}

impl PgStore {
    /// The apply-first unit for requests of distinct entities, one statement; `None` if
    /// one of them met the history's or the outbox's unique key (the statement was
    /// undone as a whole).
    pub(super) async fn first_writes(
        &self,
        conn: &mut PgConnection,
        requests: &[Request<'_>],
    ) -> Result<Option<Vec<FirstWrite>>, sqlx::Error> {
        let sql = &self.transitions;
        let emitting = requests.iter().any(Request::emits_any);
        let statement = if emitting {
            &sql.apply_first_batch_emitting
        } else {
            &sql.apply_first_batch
        };
        let mut edges = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in requests {
            for (i, (from, to)) in r.from_states.iter().zip(r.to_states).enumerate() {
                edges.0.push(r.key.order_id);
                edges.1.push(*from);
                edges.2.push(*to);
                edges.3.push(r.emits.get(i).copied().flatten());
            }
        }
        let query = sqlx::query_as::<_, PositionedPrior>(statement.clone())
            .bind(
                requests
                    .iter()
                    .map(|r| r.key.order_id)
                    .collect::<Vec<i64>>(),
            )
            .bind(requests.iter().map(|r| r.key.event).collect::<Vec<&str>>())
            .bind(requests.iter().map(|r| r.key.ref_id).collect::<Vec<&str>>())
            .bind(requests.iter().map(|r| r.payload_hash).collect::<Vec<_>>())
            .bind(requests.iter().map(|r| r.payload).collect::<Vec<_>>())
            .bind(requests.iter().map(|r| r.write_id).collect::<Vec<i64>>())
            .bind(requests.iter().map(|r| r.event_body).collect::<Vec<_>>())
            .bind(edges.0)
            .bind(edges.1)
            .bind(edges.2)
            .bind(edges.3);
        let query = if emitting {
            query.bind(requests.first().map(|r| r.machine))
        } else {
            query
        }
        .bind(requests.iter().map(|r| r.audit.actor).collect::<Vec<_>>())
        .bind(requests.iter().map(|r| r.audit.reason).collect::<Vec<_>>())
        .bind(
            requests
                .iter()
                .map(Request::traceparent)
                .collect::<Vec<_>>(),
        )
        .bind(requests.iter().map(Request::tracestate).collect::<Vec<_>>());
        let rows = match query.fetch_all(conn).await {
            Ok(rows) => rows,
            Err(e) if is_outbox_taken(&e) || is_unique_violation(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut written = vec![FirstWrite::NotApplied; requests.len()];
        for row in rows {
            // The row's position is its entity, which names one request of the batch.
            if let Some(i) = requests.iter().position(|r| r.key.order_id == row.i) {
                written[i] = FirstWrite::Applied {
                    from: row.prior.from,
                    to: row.prior.to,
                    version: row.prior.seq,
                };
            }
        }
        Ok(Some(written))
    }
}
