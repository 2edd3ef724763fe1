//! One way to write a guard or an effect for every backend: [`RuleConn`], the statements
//! a rule needs over the unit's connection, with `?` placeholders and a locking read, on
//! SQLite, PostgreSQL and MySQL/MariaDB alike.

use std::future::Future;

/// A value bound to a `?` of a rule's statement, in order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<'a> {
    /// A 64-bit integer.
    Int(i64),
    /// Text.
    Text(&'a str),
    /// A boolean.
    Bool(bool),
    /// SQL `NULL`, typed as an integer (PostgreSQL infers no type for it: for a `NULL`
    /// of another type, write it in the statement).
    Null,
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

impl From<i32> for Arg<'_> {
    fn from(v: i32) -> Self {
        Arg::Int(v.into())
    }
}

impl From<bool> for Arg<'_> {
    fn from(v: bool) -> Self {
        Arg::Bool(v)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(v)
    }
}

/// The unit's connection as a guard or an effect sees it, the same on every backend, so
/// that one implementation of a machine's rules (`impl<C: RuleConn> MyRules<C> for
/// Mine`) runs on SQLite in tests and on PostgreSQL or MySQL/MariaDB in production.
///
/// A statement's values are bound to `?` placeholders, in order (rewritten to `$1`, `$2`,
/// … on PostgreSQL; a `?` inside quotes or a comment is left alone; write no `?` in a
/// PostgreSQL dollar-quoted string or `E'…'` escape string). On MySQL/MariaDB the
/// statement is sent as text with its values written in as literals (strings in
/// hexadecimal), so that a call dropped inside the caller's transaction leaves the
/// connection in step with the server; a placeholder count that does not match the
/// values is `sqlx::Error::InvalidArgument`, and nothing is sent. Its SQL text is the
/// application's own, never a caller's input. Errors are the database's: `?` turns them
/// into [`Halt::Database`](super::Halt::Database), which the engine treats as its own (a
/// deadlock judges the request again).
pub trait RuleConn: Send {
    /// The first column of the first row, as an integer (a `BIGINT`, `INTEGER` or
    /// `SMALLINT` column; cast other numbers, such as a `SUM` or a `NUMERIC`, to
    /// `BIGINT`/`SIGNED` in the statement); `None` if there is no row (or it is `NULL`).
    fn fetch_i64<'a>(
        &'a mut self,
        sql: &'a str,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a;

    /// The first column of the first row, as text; `None` if there is no row (or it is
    /// `NULL`).
    fn fetch_text<'a>(
        &'a mut self,
        sql: &'a str,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send + 'a;

    /// Runs a statement that returns no rows; the number of rows it changed.
    fn execute<'a>(
        &'a mut self,
        sql: &'a str,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// `select` as a locking read: with `FOR UPDATE` where a read must lock the rows it
    /// judges by (PostgreSQL, MySQL/MariaDB: two units then never both see the last lamp),
    /// unchanged on SQLite, whose unit holds the database's write lock from its start.
    fn for_update(select: &str) -> String;
}
