//! The flow layer's statements whose values every backend binds alike: each backend
//! writes them in its dialect ([`FlowSql`], numbered parameters as `backend/sql.rs` reads
//! them) and [`shared_flow_statements`] writes the methods of
//! [`FlowStore`](crate::flow::FlowStore) that run them, once. A backend whose flow start
//! and recovery claim are one statement each (PostgreSQL, SQLite) writes those in
//! [`OneStatementClaims`] and takes their methods from [`one_statement_flow_claims`];
//! the others (MySQL) write those two methods themselves.

use crate::backend::sql::Arg;
use crate::flow::{Listing, StepWrite, Touch};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::flow::{NewFlow, TakeDue};

/// A backend's flow statements, each with the numbered parameters its comment lists.
pub(crate) trait FlowSql {
    /// The backend takes plain `?`s, bound in the order they stand (MySQL).
    const POSITIONAL: bool;

    /// A flow's record (a [`FlowRow`](crate::flow::FlowRow)): 1 kind, 2 key.
    fn read_flow_sql(&self) -> String;

    /// A flow's steps (each a [`StepRow`](crate::flow::StepRow)), by index, the forward
    /// phase first: 1 kind, 2 key.
    fn read_steps_sql(&self) -> String;

    /// The fenced update of a flow's record ([`Touch`](crate::flow::Touch)): 1 kind,
    /// 2 key, 3 token, 4 lease ms, 5 progress, 6 step at, 7 status, 8 park reason,
    /// 9 output, 10 last error.
    fn touch_sql(&self) -> String;

    /// The upsert of a step row ([`StepWrite`](crate::flow::StepWrite)): 1 kind, 2 key,
    /// 3 index, 4 phase, 5 name, 6 status, 7 begins, 8 downstream key, 9 token,
    /// 10 output, 11 error.
    fn record_step_sql(&self) -> String;

    /// A phase's started and failed steps marked for retry: 1 kind, 2 key, 3 phase.
    fn retry_steps_sql(&self) -> String;

    /// A parked flow handed from token 5 to token 3: 1 kind, 2 key, 3 token, 4 lease
    /// ms, 5 the parking token.
    fn unpark_sql(&self) -> String;

    /// A page of `which` flows: 1 kind and 2 key to start after, 3 limit.
    fn list_flows_sql(&self, which: Listing) -> String;
}

/// The flow start and the recovery claim, one statement each.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) trait OneStatementClaims {
    /// Inserts a flow or takes a live one over whose lease ran out, returning its
    /// attempt: 1 kind, 2 key, 3 version, 4 input hash, 5 input, 6 token, 7 lease ms.
    fn start_flow_sql(&self) -> String;

    /// Hands the due flows to a token, returning `(key, attempt)`: 1 kind, 2 version,
    /// 3 token, 4 lease ms, 5 limit.
    fn take_due_sql(&self) -> String;
}

/// The purge of finished flows as a transaction: a statement choosing a batch, then
/// each flow's steps and record deleted by key.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) trait PurgeByKeys {
    /// `(kind, key)` of up to 2 limit finished flows untouched for 1 age ms, locked where
    /// the backend locks rows.
    fn purge_choose_sql(&self) -> String;
}

/// [`FlowSql::touch_sql`]'s values.
pub(crate) fn touch_args<'a>(t: &Touch<'a>) -> [Arg<'a>; 10] {
    [
        Arg::Str(t.kind),
        Arg::Str(t.key),
        Arg::Str(t.token),
        Arg::I64(t.lease_ms),
        Arg::Bool(t.progress),
        Arg::OptI32(t.step_at),
        Arg::OptStr(t.status),
        Arg::OptStr(t.park),
        Arg::OptStr(t.output),
        Arg::OptStr(t.error),
    ]
}

/// [`FlowSql::record_step_sql`]'s values.
pub(crate) fn record_step_args<'a>(w: &StepWrite<'a>) -> [Arg<'a>; 11] {
    [
        Arg::Str(w.kind),
        Arg::Str(w.key),
        Arg::I32(w.index),
        Arg::Str(w.phase),
        Arg::Str(w.name),
        Arg::Str(w.status),
        Arg::Bool(w.begins),
        Arg::OptStr(w.downstream_key),
        Arg::Str(w.token),
        Arg::OptStr(w.output),
        Arg::OptStr(w.error),
    ]
}

/// [`OneStatementClaims::start_flow_sql`]'s values.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn start_flow_args<'a>(s: &NewFlow<'a>) -> [Arg<'a>; 7] {
    [
        Arg::Str(s.kind),
        Arg::Str(s.key),
        Arg::I32(s.version),
        Arg::Str(s.input_hash),
        Arg::Str(s.input),
        Arg::Str(s.token),
        Arg::I64(s.lease_ms),
    ]
}

/// [`OneStatementClaims::take_due_sql`]'s values.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn take_due_args<'a>(d: &TakeDue<'a>) -> [Arg<'a>; 5] {
    [
        Arg::Str(d.kind),
        Arg::I32(d.version),
        Arg::Str(d.token),
        Arg::I64(d.lease_ms),
        Arg::I64(d.limit),
    ]
}

/// The methods of [`FlowStore`](crate::flow::FlowStore) over [`FlowSql`], for the
/// backend's connection `$conn` and database `$db`.
macro_rules! shared_flow_statements {
    ($conn:ty, $db:ty) => {
        async fn read_flow(
            &self,
            conn: &mut $conn,
            kind: &str,
            key: &str,
        ) -> Result<Option<$crate::flow::FlowRow>, sqlx::Error> {
            use $crate::backend::{flow_sql::FlowSql, sql::Arg};
            let args = [Arg::Str(kind), Arg::Str(key)];
            $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.read_flow_sql(),
                &args,
                query_as
            )
            .fetch_optional(conn)
            .await
        }

        async fn read_steps(
            &self,
            conn: &mut $conn,
            kind: &str,
            key: &str,
        ) -> Result<Vec<$crate::flow::StepRow>, sqlx::Error> {
            use $crate::backend::{flow_sql::FlowSql, sql::Arg};
            let args = [Arg::Str(kind), Arg::Str(key)];
            $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.read_steps_sql(),
                &args,
                query_as
            )
            .fetch_all(conn)
            .await
        }

        async fn touch(
            &self,
            conn: &mut $conn,
            t: &$crate::flow::Touch<'_>,
        ) -> Result<bool, sqlx::Error> {
            use $crate::backend::flow_sql::{FlowSql, touch_args};
            let done = $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.touch_sql(),
                &touch_args(t),
                query
            )
            .execute(conn)
            .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn record_step(
            &self,
            conn: &mut $conn,
            w: &$crate::flow::StepWrite<'_>,
        ) -> Result<(), sqlx::Error> {
            use $crate::backend::flow_sql::{FlowSql, record_step_args};
            $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.record_step_sql(),
                &record_step_args(w),
                query
            )
            .execute(conn)
            .await
            .map(drop)
        }

        async fn retry_steps(
            &self,
            conn: &mut $conn,
            kind: &str,
            key: &str,
            phase: &str,
        ) -> Result<(), sqlx::Error> {
            use $crate::backend::{flow_sql::FlowSql, sql::Arg};
            let args = [Arg::Str(kind), Arg::Str(key), Arg::Str(phase)];
            $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.retry_steps_sql(),
                &args,
                query
            )
            .execute(conn)
            .await
            .map(drop)
        }

        async fn unpark(
            &self,
            conn: &mut $conn,
            kind: &str,
            key: &str,
            from: &str,
            token: &str,
            lease_ms: i64,
        ) -> Result<bool, sqlx::Error> {
            use $crate::backend::{flow_sql::FlowSql, sql::Arg};
            let args = [
                Arg::Str(kind),
                Arg::Str(key),
                Arg::Str(token),
                Arg::I64(lease_ms),
                Arg::Str(from),
            ];
            let done = $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.unpark_sql(),
                &args,
                query
            )
            .execute(conn)
            .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn list_flows(
            &self,
            conn: &mut $conn,
            which: $crate::flow::Listing,
            after: Option<(&str, &str)>,
            limit: i64,
        ) -> Result<Vec<$crate::flow::FlowRow>, sqlx::Error> {
            use $crate::backend::{flow_sql::FlowSql, sql::Arg};
            let (kind, key) = after.unwrap_or(("", ""));
            let args = [Arg::Str(kind), Arg::Str(key), Arg::I64(limit)];
            $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.list_flows_sql(which),
                &args,
                query_as
            )
            .fetch_all(conn)
            .await
        }
    };
}

/// [`FlowStore::start_flow`](crate::flow::FlowStore::start_flow) and
/// [`FlowStore::take_due`](crate::flow::FlowStore::take_due) over
/// [`OneStatementClaims`], for a backend whose parameters are numbered.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! one_statement_flow_claims {
    ($conn:ty, $db:ty) => {
        async fn start_flow(
            &self,
            conn: &mut $conn,
            s: &$crate::flow::NewFlow<'_>,
        ) -> Result<Option<i32>, sqlx::Error> {
            use $crate::backend::flow_sql::{OneStatementClaims, start_flow_args};
            $crate::backend::sql::numbered!(
                $db,
                false,
                self.start_flow_sql(),
                &start_flow_args(s),
                query_scalar
            )
            .fetch_optional(conn)
            .await
        }

        async fn take_due(
            &self,
            conn: &mut $conn,
            d: &$crate::flow::TakeDue<'_>,
        ) -> Result<Vec<(String, i32)>, sqlx::Error> {
            use $crate::backend::flow_sql::{OneStatementClaims, take_due_args};
            $crate::backend::sql::numbered!(
                $db,
                false,
                self.take_due_sql(),
                &take_due_args(d),
                query_as
            )
            .fetch_all(conn)
            .await
        }
    };
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use one_statement_flow_claims;
pub(crate) use shared_flow_statements;

/// [`FlowStore::purge_flows`](crate::flow::FlowStore::purge_flows) over [`PurgeByKeys`].
#[cfg(any(feature = "sqlite", feature = "mysql"))]
macro_rules! purge_flows_by_keys {
    ($conn:ty, $db:ty) => {
        async fn purge_flows(
            &self,
            conn: &mut $conn,
            age_ms: i64,
            limit: i64,
        ) -> Result<u64, sqlx::Error> {
            use $crate::backend::flow_sql::{FlowSql, PurgeByKeys};
            use $crate::backend::sql::{Arg, numbered};
            use $crate::idempotency::RecordStore;
            let mut tx = <Self as RecordStore>::begin(conn).await?;
            let chosen = [Arg::I64(age_ms), Arg::I64(limit)];
            let keys: Vec<(String, String)> = numbered!(
                $db,
                Self::POSITIONAL,
                self.purge_choose_sql(),
                &chosen,
                query_as
            )
            .fetch_all(&mut *tx)
            .await?;
            for (kind, key) in &keys {
                for table in ["flow_steps", "flows"] {
                    let sql = format!("DELETE FROM {table} WHERE kind = ?1 AND flow_key = ?2");
                    numbered!(
                        $db,
                        Self::POSITIONAL,
                        sql,
                        &[Arg::Str(kind), Arg::Str(key)],
                        query
                    )
                    .execute(&mut *tx)
                    .await?;
                }
            }
            tx.commit().await?;
            Ok(keys.len() as u64)
        }
    };
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use purge_flows_by_keys;
