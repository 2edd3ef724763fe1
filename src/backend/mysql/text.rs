//! Statements sent as text (`COM_QUERY`), their arguments written into them as literals.
//!
//! sqlx's MySQL driver prepares every statement made with `sqlx::query` (with or
//! without values bound) the first time a connection runs it, and a query future dropped while that `COM_STMT_PREPARE` is answered leaves
//! the connection out of step with the server: the next statement, whoever's it is,
//! fails on packets meant for the prepare or waits for an answer that never comes. A
//! caller who drops a `.within` call (a timeout around it) would find its own
//! transaction's connection wedged. A text statement is one command and one answer,
//! which sqlx drains on the connection's next use when its future was dropped, so every
//! statement of the transition layer, and every statement a guard or an effect runs
//! through [`RuleConn`](crate::engine::RuleConn), goes as text.
//!
//! Literals: integers in decimal, strings as `_utf8mb4 X'…'` (hexadecimal, so no byte of
//! the value is ever read as SQL and no server mode changes its meaning), `NULL`, each
//! with a space either side. The placeholders are found under the server's default
//! quoting (backslash escapes, `"…"` a string); a `?` missed or miscounted is an error
//! from the server or from [`inline`], never a value in another place.

use std::fmt::Write;

use sqlx::mysql::{MySqlConnection, MySqlQueryResult, MySqlRow};
use sqlx::{AssertSqlSafe, FromRow};

/// A value written into a text statement.
pub(crate) enum Lit<'a> {
    Int(i64),
    Text(&'a str),
    Null,
}

impl From<i64> for Lit<'_> {
    fn from(v: i64) -> Self {
        Lit::Int(v)
    }
}

impl From<bool> for Lit<'_> {
    fn from(v: bool) -> Self {
        Lit::Int(i64::from(v))
    }
}

impl<'a> From<&'a str> for Lit<'a> {
    fn from(v: &'a str) -> Self {
        Lit::Text(v)
    }
}

impl<'a> From<&'a String> for Lit<'a> {
    fn from(v: &'a String) -> Self {
        Lit::Text(v)
    }
}

impl<'a, T: Into<Lit<'a>>> From<Option<T>> for Lit<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Lit::Null, Into::into)
    }
}

/// A statement with `?` placeholders and the values they stand for, in order.
pub(crate) struct Text<'a> {
    sql: &'a str,
    args: Vec<Lit<'a>>,
}

/// `sql` (with `?` placeholders) to be sent as text.
pub(crate) fn text<S: AsRef<str> + ?Sized>(sql: &S) -> Text<'_> {
    Text {
        sql: sql.as_ref(),
        args: Vec::new(),
    }
}

impl<'a> Text<'a> {
    /// The next placeholder's value.
    pub(crate) fn bind(mut self, v: impl Into<Lit<'a>>) -> Self {
        self.args.push(v.into());
        self
    }

    /// The statement with its values written in; an error if the placeholders and the
    /// values do not pair up.
    pub(crate) fn sql(&self) -> Result<String, sqlx::Error> {
        inline(self.sql, &self.args)
    }

    pub(crate) async fn execute(
        self,
        conn: &mut MySqlConnection,
    ) -> Result<MySqlQueryResult, sqlx::Error> {
        sqlx::raw_sql(AssertSqlSafe(self.sql()?))
            .execute(conn)
            .await
    }

    pub(crate) async fn fetch_optional(
        self,
        conn: &mut MySqlConnection,
    ) -> Result<Option<MySqlRow>, sqlx::Error> {
        sqlx::raw_sql(AssertSqlSafe(self.sql()?))
            .fetch_optional(conn)
            .await
    }

    pub(crate) async fn fetch_all(
        self,
        conn: &mut MySqlConnection,
    ) -> Result<Vec<MySqlRow>, sqlx::Error> {
        sqlx::raw_sql(AssertSqlSafe(self.sql()?))
            .fetch_all(conn)
            .await
    }

    /// The first row, if any, as `T`.
    pub(crate) async fn optional_as<T: for<'r> FromRow<'r, MySqlRow>>(
        self,
        conn: &mut MySqlConnection,
    ) -> Result<Option<T>, sqlx::Error> {
        self.fetch_optional(conn)
            .await?
            .map(|row| T::from_row(&row))
            .transpose()
    }

    /// The one row, as `T`; `RowNotFound` without one.
    pub(crate) async fn one_as<T: for<'r> FromRow<'r, MySqlRow>>(
        self,
        conn: &mut MySqlConnection,
    ) -> Result<T, sqlx::Error> {
        self.optional_as(conn)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Every row, as `T`.
    pub(crate) async fn all_as<T: for<'r> FromRow<'r, MySqlRow>>(
        self,
        conn: &mut MySqlConnection,
    ) -> Result<Vec<T>, sqlx::Error> {
        self.fetch_all(conn)
            .await?
            .iter()
            .map(T::from_row)
            .collect()
    }
}

/// `sql` with each `?` placeholder replaced by the literal of its value, in order.
pub(crate) fn inline(sql: &str, args: &[Lit<'_>]) -> Result<String, sqlx::Error> {
    let pieces = pieces(sql);
    if pieces.len() != args.len() + 1 {
        return Err(sqlx::Error::InvalidArgument(format!(
            "the statement has {} placeholders and {} values were given",
            pieces.len() - 1,
            args.len()
        )));
    }
    let mut out = String::with_capacity(sql.len() + 16 * args.len());
    for (piece, value) in pieces.iter().zip(args) {
        out.push_str(piece);
        // Spaced, so that no literal runs into its neighbours (`LIMIT?`, `-?`).
        out.push(' ');
        literal(&mut out, value);
        out.push(' ');
    }
    out.push_str(pieces[pieces.len() - 1]);
    Ok(out)
}

/// `sql` cut at each `?` outside a quoted string or name (`'…'`, `"…"`, `` `…` ``, a
/// doubled or backslashed quote inside included) and outside a comment (`-- `, `#`,
/// `/* … */`).
fn pieces(sql: &str) -> Vec<&str> {
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        Code,
        Quote(u8),
        Line,
        Block,
    }
    let bytes = sql.as_bytes();
    let (mut pieces, mut start, mut at, mut i) = (Vec::new(), 0, In::Code, 0);
    while i < bytes.len() {
        let (c, next) = (bytes[i], bytes.get(i + 1).copied());
        match at {
            In::Code => match c {
                b'\'' | b'"' | b'`' => at = In::Quote(c),
                b'-' if next == Some(b'-') => at = In::Line,
                b'#' => at = In::Line,
                b'/' if next == Some(b'*') => {
                    at = In::Block;
                    i += 1;
                }
                b'?' => {
                    pieces.push(&sql[start..i]);
                    start = i + 1;
                }
                _ => {}
            },
            In::Quote(q) if c == b'\\' && q != b'`' => i += 1,
            In::Quote(q) if c == q => at = In::Code,
            In::Line if c == b'\n' => at = In::Code,
            In::Block if c == b'*' && next == Some(b'/') => {
                at = In::Code;
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    pieces.push(&sql[start..]);
    pieces
}

fn literal(out: &mut String, value: &Lit<'_>) {
    match value {
        Lit::Int(v) => {
            let _ = write!(out, "{v}");
        }
        Lit::Null => out.push_str("NULL"),
        Lit::Text(v) => {
            out.push_str("_utf8mb4 X'");
            for byte in v.bytes() {
                let _ = write!(out, "{byte:02X}");
            }
            out.push('\'');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Lit, inline};

    #[test]
    fn placeholders_outside_quotes_and_comments_are_filled() {
        let sql =
            "SELECT a FROM t WHERE id = ? AND s <> '?' AND n = ? -- ?\n AND x = ? /* ? */ # ?";
        assert_eq!(
            inline(sql, &[Lit::Int(-7), Lit::Text("it's ?"), Lit::Null]).unwrap(),
            "SELECT a FROM t WHERE id =  -7  AND s <> '?' AND n =  _utf8mb4 X'69742773203F'  -- ?\n AND x =  NULL  /* ? */ # ?"
        );
        assert_eq!(
            inline(
                r#"SELECT 'a\'?', "b?", `c?` FROM t WHERE k = ?"#,
                &[Lit::Text("")]
            )
            .unwrap(),
            r#"SELECT 'a\'?', "b?", `c?` FROM t WHERE k =  _utf8mb4 X'' "#
        );
    }

    #[test]
    fn placeholders_and_values_must_pair_up() {
        let few = inline("SELECT ?, ?", &[Lit::Int(1)]).unwrap_err();
        assert!(
            few.to_string().contains("2 placeholders and 1 values"),
            "{few}"
        );
        let many = inline("SELECT ?", &[Lit::Int(1), Lit::Int(2)]).unwrap_err();
        assert!(
            many.to_string().contains("1 placeholders and 2 values"),
            "{many}"
        );
    }
}
