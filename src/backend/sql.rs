//! Statements whose values every backend binds alike: each backend writes its statement
//! with numbered parameters (PostgreSQL `$1`, SQLite and MySQL `?1`), a number naming a
//! value's place in the list the shared code binds; MySQL's `?1`s become the plain `?`s
//! its protocol takes, with the values bound in the order they stand.

#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
use std::sync::{Mutex, PoisonError};

use sqlx::error::BoxDynError;
use sqlx::query::{Query, QueryAs};
use sqlx::{
    Arguments, AssertSqlSafe, Database, Encode, FromRow, IntoArguments, SqlSafeStr, SqlStr, Type,
};

/// A value bound to a statement.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Str(&'a str),
    OptStr(Option<&'a str>),
    I64(i64),
    I32(i32),
    OptI32(Option<i32>),
    OptI64(Option<i64>),
    Bool(bool),
}

/// A statement built once: its text as its backend sends it, and which value of the
/// call's list each of its parameters binds. Numbered parameters (PostgreSQL's `$N`,
/// SQLite's `?N`) bind the whole list in its order; MySQL's `?N`s are made plain `?`s
/// once, here, and bind the values they named in the order they stand.
#[derive(Debug, Clone)]
pub(crate) struct Statement {
    sql: SqlStr,
    order: Order,
}

#[derive(Debug, Clone)]
enum Order {
    /// Every value, in its order.
    All,
    /// The values the `?`s named, in the order they stand.
    Picked(Vec<usize>),
    /// A text whose parameters could not be read (an orderly bug): every call fails
    /// with this message, nothing is sent.
    Unreadable(String),
}

/// How a backend writes a statement's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Params {
    /// `$1`, `$2`, … (PostgreSQL).
    #[cfg(feature = "postgres")]
    Dollar,
    /// `?1`, `?2`, … (SQLite).
    #[cfg(feature = "sqlite")]
    Numbered,
    /// Plain `?`s, bound in the order they stand (MySQL).
    #[cfg(feature = "mysql")]
    Plain,
}

impl Statement {
    /// `sql`, a statement every backend shares, written with `?N` parameters, in the form
    /// `params` says.
    pub(crate) fn shared(sql: String, params: Params) -> Self {
        match params {
            #[cfg(feature = "sqlite")]
            Params::Numbered => Statement::new(sql, false),
            #[cfg(feature = "mysql")]
            Params::Plain => Statement::new(sql, true),
            #[cfg(feature = "postgres")]
            Params::Dollar => match positional_form(&sql) {
                Ok(_) => Statement::new(dollar_form(&sql), false),
                Err(message) => Statement {
                    sql: AssertSqlSafe(sql).into_sql_str(),
                    order: Order::Unreadable(message),
                },
            },
        }
    }

    /// `sql` as the backend takes it: with numbered parameters, or, where the backend
    /// takes plain `?`s (`positional`: MySQL), with its `?N`s made so.
    pub(crate) fn new(sql: String, positional: bool) -> Self {
        if !positional {
            return Statement {
                sql: AssertSqlSafe(sql).into_sql_str(),
                order: Order::All,
            };
        }
        match positional_form(&sql) {
            Ok((plain, order)) => Statement {
                sql: AssertSqlSafe(plain).into_sql_str(),
                order: Order::Picked(order),
            },
            Err(message) => Statement {
                sql: AssertSqlSafe(sql).into_sql_str(),
                order: Order::Unreadable(message),
            },
        }
    }

    /// A query running the statement with `values` bound as its backend takes them; an
    /// error, with nothing sent, if a value cannot be encoded or the text names a value
    /// the list lacks.
    pub(crate) fn query<DB: Binds>(
        &self,
        values: &[Arg<'_>],
    ) -> Result<Query<'static, DB, DB::Arguments>, sqlx::Error> {
        Ok(sqlx::query_with(self.sql.clone(), self.bind::<DB>(values)?))
    }

    /// [`query`](Self::query), its rows decoded as `R`.
    pub(crate) fn query_as<DB: Binds, R>(
        &self,
        values: &[Arg<'_>],
    ) -> Result<QueryAs<'static, DB, R, DB::Arguments>, sqlx::Error>
    where
        R: for<'r> FromRow<'r, DB::Row>,
    {
        Ok(sqlx::query_as_with(
            self.sql.clone(),
            self.bind::<DB>(values)?,
        ))
    }

    /// [`query`](Self::query), its first column decoded as `T`.
    pub(crate) fn query_scalar<DB: Binds, T>(
        &self,
        values: &[Arg<'_>],
    ) -> Result<sqlx::query::QueryScalar<'static, DB, T, DB::Arguments>, sqlx::Error>
    where
        (T,): for<'r> FromRow<'r, DB::Row>,
    {
        Ok(sqlx::query_scalar_with(
            self.sql.clone(),
            self.bind::<DB>(values)?,
        ))
    }

    /// The statement with `values` written into its text as literals, to be sent as text
    /// (MySQL/MariaDB: `backend/mysql/text.rs` says why); the same errors as
    /// [`query`](Self::query), nothing sent.
    #[cfg(feature = "mysql")]
    pub(crate) fn text<'a>(
        &'a self,
        values: &[Arg<'a>],
    ) -> Result<crate::backend::mysql::text::Text<'a>, sqlx::Error> {
        use crate::backend::mysql::text::Lit;
        let order: Vec<usize> = match &self.order {
            Order::All => (0..values.len()).collect(),
            Order::Picked(order) => order.clone(),
            Order::Unreadable(message) => return Err(sqlx::Error::Protocol(message.clone())),
        };
        let mut query = crate::backend::mysql::text::text(self.sql.as_str());
        for i in order {
            let Some(value) = values.get(i) else {
                return Err(sqlx::Error::Protocol(format!(
                    "statement names parameter {} of {}",
                    i + 1,
                    values.len()
                )));
            };
            query = query.bind(match *value {
                Arg::Str(v) => Lit::Text(v),
                Arg::OptStr(v) => Lit::from(v),
                Arg::I64(v) => Lit::Int(v),
                Arg::I32(v) => Lit::Int(i64::from(v)),
                Arg::OptI32(v) => Lit::from(v.map(i64::from)),
                Arg::OptI64(v) => Lit::from(v),
                Arg::Bool(v) => Lit::from(v),
            });
        }
        Ok(query)
    }

    fn bind<DB: Binds>(&self, values: &[Arg<'_>]) -> Result<DB::Arguments, sqlx::Error> {
        match &self.order {
            Order::All => arguments::<DB>(values),
            Order::Picked(order) => {
                let mut args = DB::Arguments::default();
                for &i in order {
                    let Some(value) = values.get(i) else {
                        return Err(sqlx::Error::Protocol(format!(
                            "statement names parameter {} of {}",
                            i + 1,
                            values.len()
                        )));
                    };
                    DB::add(&mut args, *value).map_err(sqlx::Error::Encode)?;
                }
                Ok(args)
            }
            Order::Unreadable(message) => Err(sqlx::Error::Protocol(message.clone())),
        }
    }
}

/// A statement whose text depends on its batch's size (its rows, its keys): built the
/// first time a size is asked for and kept, so a call formats nothing. Sizes past
/// [`BySize::KEPT`] (larger than the batches orderly forms by default) are built for
/// their call, so that what is kept stays small. (PostgreSQL binds most batches as
/// arrays, in a statement of one text; a batch joined to a table goes as a `VALUES` list,
/// whose row count the planner knows.)
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub(crate) struct BySize {
    build: Box<dyn Fn(usize) -> String + Send + Sync>,
    kept: Mutex<Vec<Option<SqlStr>>>,
}

#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
impl BySize {
    /// The largest size kept.
    pub(crate) const KEPT: usize = 256;

    /// The statement `build` writes for each size.
    pub(crate) fn new(build: impl Fn(usize) -> String + Send + Sync + 'static) -> Self {
        BySize {
            build: Box::new(build),
            kept: Mutex::new(Vec::new()),
        }
    }

    /// The text for a batch of `n`.
    pub(crate) fn get(&self, n: usize) -> SqlStr {
        if n > Self::KEPT {
            return AssertSqlSafe((self.build)(n)).into_sql_str();
        }
        // A panic elsewhere while the lock was held leaves the texts as they were: each
        // entry is whole or absent.
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() <= n {
            kept.resize(n + 1, None);
        }
        kept[n]
            .get_or_insert_with(|| AssertSqlSafe((self.build)(n)).into_sql_str())
            .clone()
    }
}

#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
impl std::fmt::Debug for BySize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BySize").finish_non_exhaustive()
    }
}

/// `values`, in their order, as `DB`'s arguments (for a statement whose text is built
/// per call, its size the call's).
pub(crate) fn arguments<DB: Binds>(values: &[Arg<'_>]) -> Result<DB::Arguments, sqlx::Error> {
    let mut args = DB::Arguments::default();
    for value in values {
        DB::add(&mut args, *value).map_err(sqlx::Error::Encode)?;
    }
    Ok(args)
}

/// A backend's database as the shared statements use it: it takes every kind of [`Arg`],
/// and tells how many rows a statement changed.
pub(crate) trait Binds: Database<Arguments: IntoArguments<Self>> {
    /// A statement whose text is new at each call, with `values` written in, where the
    /// backend sends such a statement as text; `None` where it prepares it (and does not
    /// keep it). MySQL's: sqlx closes a statement it does not keep with a message the
    /// server does not answer, and the next message then waits on the server's delayed
    /// acknowledgement (about 40 ms: sqlx leaves Nagle's algorithm on), which held up
    /// every timer batch's commit.
    fn once_text(
        _statement: &Statement,
        _values: &[Arg<'_>],
    ) -> Option<Result<String, sqlx::Error>> {
        None
    }

    /// Adds `value` to `args`.
    fn add(args: &mut Self::Arguments, value: Arg<'_>) -> Result<(), BoxDynError>;

    /// The rows a statement changed.
    fn rows_affected(done: &Self::QueryResult) -> u64;
}

#[cfg(feature = "postgres")]
impl Binds for sqlx::Postgres {
    fn add(args: &mut Self::Arguments, value: Arg<'_>) -> Result<(), BoxDynError> {
        add_to::<Self>(args, value)
    }

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(feature = "mysql")]
impl Binds for sqlx::MySql {
    fn once_text(statement: &Statement, values: &[Arg<'_>]) -> Option<Result<String, sqlx::Error>> {
        Some(statement.text(values).and_then(|text| text.sql()))
    }

    fn add(args: &mut Self::Arguments, value: Arg<'_>) -> Result<(), BoxDynError> {
        add_to::<Self>(args, value)
    }

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(feature = "sqlite")]
impl Binds for sqlx::Sqlite {
    fn add(args: &mut Self::Arguments, value: Arg<'_>) -> Result<(), BoxDynError> {
        add_to::<Self>(args, value)
    }

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

/// `value` added to `args`, for any database that encodes the types of [`Arg`].
fn add_to<DB>(args: &mut DB::Arguments, value: Arg<'_>) -> Result<(), BoxDynError>
where
    DB: Database,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> Option<&'t str>: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
    for<'t> i32: Encode<'t, DB> + Type<DB>,
    for<'t> Option<i32>: Encode<'t, DB> + Type<DB>,
    for<'t> Option<i64>: Encode<'t, DB> + Type<DB>,
    for<'t> bool: Encode<'t, DB> + Type<DB>,
{
    match value {
        Arg::Str(v) => args.add(v),
        Arg::OptStr(v) => args.add(v),
        Arg::I64(v) => args.add(v),
        Arg::I32(v) => args.add(v),
        Arg::OptI32(v) => args.add(v),
        Arg::OptI64(v) => args.add(v),
        Arg::Bool(v) => args.add(v),
    }
}

/// `sql` with each `?N` made a plain `?`, and the N - 1s in the order they stood. A `?`
/// inside a quoted string or name is text; a `?` with no number (or `?0`) is an error.
fn positional_form(sql: &str) -> Result<(String, Vec<usize>), String> {
    let mut out = String::with_capacity(sql.len());
    let mut order = Vec::new();
    let mut quote = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"' | '`') => quote = Some(c),
            (None, '?') => {
                let mut n = 0usize;
                while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                    n = n.saturating_mul(10).saturating_add(d as usize);
                    chars.next();
                }
                if n == 0 {
                    return Err(format!("a parameter without its number in {sql:?}"));
                }
                order.push(n - 1);
            }
            (None, _) => {}
        }
    }
    Ok((out, order))
}

/// `sql` with each `?N` made `$N` (a `?` inside a quoted string or name is text).
#[cfg(any(test, feature = "postgres"))]
fn dollar_form(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quote = None;
    for c in sql.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"' | '`') => quote = Some(c),
            (None, '?') => {
                out.push('$');
                continue;
            }
            (None, _) => {}
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
    use super::BySize;
    use super::{dollar_form, positional_form};

    #[test]
    #[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
    fn statements_by_size_are_built_once_per_size() {
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        static BUILT: AtomicUsize = AtomicUsize::new(0);
        let by_size = BySize::new(|n| {
            BUILT.fetch_add(1, Relaxed);
            format!("IN ({})", vec!["?"; n].join(", "))
        });
        assert_eq!(by_size.get(3).as_str(), "IN (?, ?, ?)");
        assert_eq!(by_size.get(1).as_str(), "IN (?)");
        assert_eq!(by_size.get(3).as_str(), "IN (?, ?, ?)");
        assert_eq!(
            BUILT.load(Relaxed),
            2,
            "a size asked for again is not built again"
        );
        let past = BySize::KEPT + 1;
        assert_eq!(by_size.get(past).as_str().matches('?').count(), past);
        assert_eq!(by_size.get(past).as_str().matches('?').count(), past);
        assert_eq!(
            BUILT.load(Relaxed),
            4,
            "a size past KEPT is built for each call"
        );
    }

    #[test]
    fn numbered_parameters_become_positional_in_the_order_they_stand() {
        let (sql, order) =
            positional_form("SET a = ?3, b = ?1 WHERE c = ?12 AND d = ?3 AND e = 'x?1'").unwrap();
        assert_eq!(sql, "SET a = ?, b = ? WHERE c = ? AND d = ? AND e = 'x?1'");
        assert_eq!(order, [2, 0, 11, 2]);
        assert_eq!(
            dollar_form("SET a = ?3, b = ?1 WHERE e = 'x?1'"),
            "SET a = $3, b = $1 WHERE e = 'x?1'"
        );
        assert!(positional_form("a = ?").is_err());
        assert!(positional_form("a = ?0").is_err());
    }
}
