//! Statements whose values every backend binds alike: each backend writes its statement
//! with numbered parameters (PostgreSQL `$1`, SQLite and MySQL `?1`), a number naming a
//! value's place in the list the shared code binds; MySQL's `?1`s become the plain `?`s
//! its protocol takes, with the values bound in the order they stand.

use sqlx::{Arguments, Database, Encode, Type};

/// A value bound to a statement.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Str(&'a str),
    OptStr(Option<&'a str>),
    I64(i64),
    I32(i32),
    OptI32(Option<i32>),
    Bool(bool),
}

/// `sql` in the form its backend sends, and `values` bound in the order it takes them:
/// all of them, in their order, where the backend numbers its parameters; where it
/// does not (`positional`), one for each `?N` as it stands.
pub(crate) fn bound<DB>(
    sql: &str,
    positional: bool,
    values: &[Arg<'_>],
) -> Result<(String, DB::Arguments), sqlx::Error>
where
    DB: Database,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> Option<&'t str>: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
    for<'t> i32: Encode<'t, DB> + Type<DB>,
    for<'t> Option<i32>: Encode<'t, DB> + Type<DB>,
    for<'t> bool: Encode<'t, DB> + Type<DB>,
{
    let (sql, order) = if positional {
        positional_form(sql)?
    } else {
        (sql.to_string(), (0..values.len()).collect())
    };
    let mut args = DB::Arguments::default();
    for i in order {
        let Some(value) = values.get(i) else {
            return Err(sqlx::Error::Protocol(format!(
                "statement names parameter {} of {}",
                i + 1,
                values.len()
            )));
        };
        match *value {
            Arg::Str(v) => args.add(v),
            Arg::OptStr(v) => args.add(v),
            Arg::I64(v) => args.add(v),
            Arg::I32(v) => args.add(v),
            Arg::OptI32(v) => args.add(v),
            Arg::Bool(v) => args.add(v),
        }
        .map_err(sqlx::Error::Encode)?;
    }
    Ok((sql, args))
}

/// A query of `$db` (`query`, `query_as` or `query_scalar`: `$run`) running `$sql`, a
/// statement with numbered parameters, with `$values` (a slice of [`Arg`]) bound as the
/// backend takes them (`$positional`: MySQL); `?` on a value that cannot be encoded.
macro_rules! numbered {
    ($db:ty, $positional:expr, $sql:expr, $values:expr, $run:ident) => {{
        let (sql, args) = $crate::backend::sql::bound::<$db>(&$sql, $positional, $values)?;
        $crate::backend::sql::numbered!(@$run sql, args)
    }};
    (@query $sql:ident, $args:ident) => {
        sqlx::query_with(sqlx::AssertSqlSafe($sql), $args)
    };
    (@query_as $sql:ident, $args:ident) => {
        sqlx::query_as_with(sqlx::AssertSqlSafe($sql), $args)
    };
    (@query_scalar $sql:ident, $args:ident) => {
        sqlx::query_scalar_with(sqlx::AssertSqlSafe($sql), $args)
    };
}

pub(crate) use numbered;

/// `sql` with each `?N` made a plain `?`, and the N - 1s in the order they stood. A `?`
/// inside a quoted string or name is text; a `?` with no number (or `?0`) is an error.
fn positional_form(sql: &str) -> Result<(String, Vec<usize>), sqlx::Error> {
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
                    return Err(sqlx::Error::Protocol(format!(
                        "a parameter without its number in {sql:?}"
                    )));
                }
                order.push(n - 1);
            }
            (None, _) => {}
        }
    }
    Ok((out, order))
}

#[cfg(test)]
mod tests {
    use super::positional_form;

    #[test]
    fn numbered_parameters_become_positional_in_the_order_they_stand() {
        let (sql, order) =
            positional_form("SET a = ?3, b = ?1 WHERE c = ?12 AND d = ?3 AND e = 'x?1'").unwrap();
        assert_eq!(sql, "SET a = ?, b = ? WHERE c = ? AND d = ? AND e = 'x?1'");
        assert_eq!(order, [2, 0, 11, 2]);
        assert!(positional_form("a = ?").is_err());
        assert!(positional_form("a = ?0").is_err());
    }
}
