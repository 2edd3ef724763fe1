//! [`RuleConn`](crate::engine::RuleConn) over sqlx's connections: the binding every
//! backend shares.

use sqlx::Type;

/// `query` with `args` bound to its placeholders, in order (MySQL/MariaDB writes them
/// into the text instead: `backend/mysql/text.rs`).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn bound<'q, DB: sqlx::Database>(
    mut query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>,
    args: &[crate::engine::Arg<'_>],
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>
where
    for<'e> i64: sqlx::Encode<'e, DB> + Type<DB>,
    for<'e> String: sqlx::Encode<'e, DB> + Type<DB>,
    for<'e> bool: sqlx::Encode<'e, DB> + Type<DB>,
    for<'e> Option<i64>: sqlx::Encode<'e, DB> + Type<DB>,
{
    use crate::engine::Arg;
    for arg in args {
        query = match *arg {
            Arg::Int(v) => query.bind(v),
            Arg::Text(v) => query.bind(v.to_owned()),
            Arg::Bool(v) => query.bind(v),
            Arg::Null => query.bind(None::<i64>),
        };
    }
    query
}

/// The first column of `row` as an integer: a 64-bit column, or a 32- or 16-bit one
/// widened (PostgreSQL decodes `i64` from `BIGINT` only).
pub(crate) fn integer<R: sqlx::Row>(row: &R) -> Result<Option<i64>, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i32>: sqlx::Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i16>: sqlx::Decode<'r, R::Database> + Type<R::Database>,
{
    row.try_get::<Option<i64>, _>(0).or_else(|wide| {
        row.try_get::<Option<i32>, _>(0)
            .map(|v| v.map(i64::from))
            .or_else(|_| row.try_get::<Option<i16>, _>(0).map(|v| v.map(i64::from)))
            .map_err(|_| wide)
    })
}
