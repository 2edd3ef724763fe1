//! The idempotency layer's statements whose values every backend binds alike: each
//! backend writes them in its dialect ([`RecordSql`], numbered parameters as
//! `backend/sql.rs` reads them) and [`shared_record_statements`] writes the methods of
//! [`RecordStore`](crate::idempotency::RecordStore) that run them, once. A backend whose
//! claim and takeover are one statement each (PostgreSQL, SQLite) writes those in
//! [`OneStatementRecordClaims`] and takes their methods from
//! [`one_statement_record_claims`]; the others (MySQL) write those two methods
//! themselves, and every backend its own `begin`.

use crate::backend::sql::Arg;
use crate::idempotency::Finish;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::idempotency::{NewClaim, TakeOver};

/// A backend's idempotency statements, each with the numbered parameters its comment
/// lists.
pub(crate) trait RecordSql {
    /// The backend takes plain `?`s, bound in the order they stand (MySQL).
    const POSITIONAL: bool;

    /// A record as it is now (a [`RecordRow`](crate::idempotency::RecordRow)): 1 scope,
    /// 2 key.
    fn read_sql(&self) -> String;

    /// The holder's fenced write ([`Finish`]): 1 scope, 2 key, 3 token, 4 status,
    /// 5 result, 6 terminal, 7 lease ms (kept only for PROCESSING), 8 retention ms.
    fn finish_sql(&self) -> String;

    /// Records stuck in PROCESSING (each a [`StuckRow`](crate::idempotency::StuckRow)),
    /// oldest lease first: 1 scope, 2 limit.
    fn stuck_sql(&self) -> String;

    /// `(held, oldest_ms)`: the count of PROCESSING records inside their retention, and
    /// the oldest one's age (0 if none): 1 scope.
    fn held_sql(&self) -> String;

    /// The deletes of records past their retention and of expired tokens: 1 limit each.
    fn purge_sql(&self) -> [String; 2];

    /// A new one-time token: 1 scope, 2 token, 3 time to live in ms.
    fn issue_token_sql(&self) -> String;

    /// A token marked used if it is unused and unexpired: 1 scope, 2 token.
    fn consume_token_sql(&self) -> String;

    /// A token as it is now (a [`TokenRow`](crate::idempotency::TokenRow)): 1 scope,
    /// 2 token.
    fn read_token_sql(&self) -> String;
}

/// The claim and the takeover, one statement each, returning the attempt.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) trait OneStatementRecordClaims {
    /// [`NewClaim`]: 1 scope, 2 key, 3 payload hash, 4 token, 5 lease ms, 6 retention ms.
    fn claim_sql(&self) -> String;

    /// [`TakeOver`]: 1 scope, 2 key, 3 the token it was found with, 4 token, 5 lease ms,
    /// 6 retention ms.
    fn take_over_sql(&self) -> String;
}

/// [`RecordSql::finish_sql`]'s values.
pub(crate) fn finish_args<'a>(f: &Finish<'a>) -> [Arg<'a>; 8] {
    [
        Arg::Str(f.scope),
        Arg::Str(f.key),
        Arg::Str(f.token),
        Arg::Str(f.status),
        Arg::OptStr(f.result),
        Arg::Bool(f.terminal),
        Arg::I64(f.lease_ms),
        Arg::I64(f.retention_ms),
    ]
}

/// [`OneStatementRecordClaims::claim_sql`]'s values.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn claim_args<'a>(c: &NewClaim<'a>) -> [Arg<'a>; 6] {
    [
        Arg::Str(c.scope),
        Arg::Str(c.key),
        Arg::OptStr(c.payload_hash),
        Arg::Str(c.token),
        Arg::I64(c.lease_ms),
        Arg::I64(c.retention_ms),
    ]
}

/// [`OneStatementRecordClaims::take_over_sql`]'s values.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn take_over_args<'a>(t: &TakeOver<'a>) -> [Arg<'a>; 6] {
    [
        Arg::Str(t.scope),
        Arg::Str(t.key),
        Arg::Str(t.from),
        Arg::Str(t.token),
        Arg::I64(t.lease_ms),
        Arg::I64(t.retention_ms),
    ]
}

/// The methods of [`RecordStore`](crate::idempotency::RecordStore) over [`RecordSql`],
/// for the backend's connection `$conn` and database `$db`.
macro_rules! shared_record_statements {
    ($conn:ty, $db:ty) => {
        async fn read(
            &self,
            conn: &mut $conn,
            scope: &str,
            key: &str,
        ) -> Result<Option<$crate::idempotency::RecordRow>, sqlx::Error> {
            use $crate::backend::{records_sql::RecordSql, sql::Arg};
            let args = [Arg::Str(scope), Arg::Str(key)];
            $crate::backend::sql::numbered!($db, Self::POSITIONAL, self.read_sql(), &args, query_as)
                .fetch_optional(conn)
                .await
        }

        async fn finish(
            &self,
            conn: &mut $conn,
            f: &$crate::idempotency::Finish<'_>,
            txn: $crate::store::Txn,
        ) -> Result<bool, sqlx::Error> {
            use sqlx::Connection;
            use $crate::backend::records_sql::{RecordSql, finish_args};
            let statement = $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.finish_sql(),
                &finish_args(f),
                query
            );
            let done = match txn {
                $crate::store::Txn::Own => statement.execute(conn).await?,
                // In a savepoint, so that a failure does not abort the caller's
                // transaction.
                $crate::store::Txn::Caller => {
                    let mut savepoint = conn.begin().await?;
                    let done = statement.execute(&mut *savepoint).await?;
                    savepoint.commit().await?;
                    done
                }
            };
            Ok(done.rows_affected() == 1)
        }

        async fn stuck(
            &self,
            conn: &mut $conn,
            scope: &str,
            limit: i64,
        ) -> Result<Vec<$crate::idempotency::StuckRow>, sqlx::Error> {
            use $crate::backend::{records_sql::RecordSql, sql::Arg};
            let args = [Arg::Str(scope), Arg::I64(limit)];
            $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.stuck_sql(),
                &args,
                query_as
            )
            .fetch_all(conn)
            .await
        }

        async fn held(&self, conn: &mut $conn, scope: &str) -> Result<(i64, i64), sqlx::Error> {
            use $crate::backend::{records_sql::RecordSql, sql::Arg};
            $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.held_sql(),
                &[Arg::Str(scope)],
                query_as
            )
            .fetch_one(conn)
            .await
        }

        async fn purge(&self, conn: &mut $conn, limit: i64) -> Result<u64, sqlx::Error> {
            use $crate::backend::{records_sql::RecordSql, sql::Arg};
            let mut gone = 0;
            for sql in self.purge_sql() {
                gone += $crate::backend::sql::numbered!(
                    $db,
                    Self::POSITIONAL,
                    sql,
                    &[Arg::I64(limit)],
                    query
                )
                .execute(&mut *conn)
                .await?
                .rows_affected();
            }
            Ok(gone)
        }

        async fn issue_token(
            &self,
            conn: &mut $conn,
            scope: &str,
            token: &str,
            ttl_ms: i64,
        ) -> Result<(), sqlx::Error> {
            use $crate::backend::{records_sql::RecordSql, sql::Arg};
            let args = [Arg::Str(scope), Arg::Str(token), Arg::I64(ttl_ms)];
            $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.issue_token_sql(),
                &args,
                query
            )
            .execute(conn)
            .await
            .map(drop)
        }

        async fn consume_token(
            &self,
            conn: &mut $conn,
            scope: &str,
            token: &str,
        ) -> Result<bool, sqlx::Error> {
            use $crate::backend::{records_sql::RecordSql, sql::Arg};
            let args = [Arg::Str(scope), Arg::Str(token)];
            let done = $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.consume_token_sql(),
                &args,
                query
            )
            .execute(conn)
            .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn read_token(
            &self,
            conn: &mut $conn,
            scope: &str,
            token: &str,
        ) -> Result<Option<$crate::idempotency::TokenRow>, sqlx::Error> {
            use $crate::backend::{records_sql::RecordSql, sql::Arg};
            let args = [Arg::Str(scope), Arg::Str(token)];
            $crate::backend::sql::numbered!(
                $db,
                Self::POSITIONAL,
                self.read_token_sql(),
                &args,
                query_as
            )
            .fetch_optional(conn)
            .await
        }
    };
}

pub(crate) use shared_record_statements;

/// [`RecordStore::claim`](crate::idempotency::RecordStore::claim) and
/// [`RecordStore::take_over`](crate::idempotency::RecordStore::take_over) over
/// [`OneStatementRecordClaims`], for a backend whose parameters are numbered.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! one_statement_record_claims {
    ($conn:ty, $db:ty) => {
        async fn claim(
            &self,
            conn: &mut $conn,
            c: &$crate::idempotency::NewClaim<'_>,
        ) -> Result<Option<i32>, sqlx::Error> {
            use $crate::backend::records_sql::{OneStatementRecordClaims, claim_args};
            $crate::backend::sql::numbered!(
                $db,
                false,
                self.claim_sql(),
                &claim_args(c),
                query_scalar
            )
            .fetch_optional(conn)
            .await
        }

        async fn take_over(
            &self,
            conn: &mut $conn,
            t: &$crate::idempotency::TakeOver<'_>,
        ) -> Result<Option<i32>, sqlx::Error> {
            use $crate::backend::records_sql::{OneStatementRecordClaims, take_over_args};
            $crate::backend::sql::numbered!(
                $db,
                false,
                self.take_over_sql(),
                &take_over_args(t),
                query_scalar
            )
            .fetch_optional(conn)
            .await
        }
    };
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use one_statement_record_claims;
