//! [`RuleConn`](crate::engine::RuleConn) over sqlx's connections: the binding every
//! backend shares.

use sqlx::query::Query;
use sqlx::{Database, Encode, Type};

use crate::engine::Arg;

/// `query` with `args` bound to its placeholders, in order.
pub(crate) fn bound<'q, DB: Database>(
    mut query: Query<'q, DB, <DB as Database>::Arguments>,
    args: &[Arg<'_>],
) -> Query<'q, DB, <DB as Database>::Arguments>
where
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> String: Encode<'e, DB> + Type<DB>,
    for<'e> bool: Encode<'e, DB> + Type<DB>,
    for<'e> Option<i64>: Encode<'e, DB> + Type<DB>,
{
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
