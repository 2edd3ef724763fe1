//! [`RuleConn`] on PostgreSQL: a guard's or an effect's statements over the unit's connection.

use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Row};

use crate::backend::rule_conn::{bound, integer};
use crate::engine::{Arg, RuleConn};

impl RuleConn for PgConnection {
    async fn fetch_i64(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Option<i64>, sqlx::Error> {
        let query = bound(sqlx::query(AssertSqlSafe(numbered(sql))), args);
        let row = query.fetch_optional(self).await?;
        Ok(row.as_ref().map(integer).transpose()?.flatten())
    }

    async fn fetch_text(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<Option<String>, sqlx::Error> {
        let query = bound(sqlx::query(AssertSqlSafe(numbered(sql))), args);
        let row = query.fetch_optional(self).await?;
        Ok(row
            .map(|r| r.try_get::<Option<String>, _>(0))
            .transpose()?
            .flatten())
    }

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, sqlx::Error> {
        let query = bound(sqlx::query(AssertSqlSafe(numbered(sql))), args);
        Ok(query.execute(self).await?.rows_affected())
    }

    fn for_update(select: &str) -> String {
        format!("{select} FOR UPDATE")
    }
}

/// `sql` with its `?` placeholders numbered `$1`, `$2`, … (PostgreSQL's); a `?` inside a
/// quoted string or name (`'…'`, `"…"`, a doubled quote inside included) or a comment
/// (`-- …`, `/* … */`) is left alone.
fn numbered(sql: &str) -> String {
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        Code,
        Quote(char),
        Line,
        Block,
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let (mut n, mut at) = (0, In::Code);
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        let next = chars.peek().copied();
        match at {
            In::Code => match c {
                '\'' | '"' => at = In::Quote(c),
                '-' if next == Some('-') => at = In::Line,
                '/' if next == Some('*') => at = In::Block,
                '?' => {
                    n += 1;
                    out.push('$');
                    out.push_str(&n.to_string());
                    continue;
                }
                _ => {}
            },
            In::Quote(q) if c == q => at = In::Code,
            In::Line if c == '\n' => at = In::Code,
            In::Block if c == '*' && next == Some('/') => {
                out.push(c);
                out.push('/');
                chars.next();
                at = In::Code;
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::numbered;

    #[test]
    fn placeholders_outside_quotes_and_comments_are_numbered() {
        assert_eq!(
            numbered("SELECT qty FROM s WHERE sku = ? AND note <> '?' AND id = ?"),
            "SELECT qty FROM s WHERE sku = $1 AND note <> '?' AND id = $2"
        );
        assert_eq!(numbered(r#"SELECT "a?" FROM t"#), r#"SELECT "a?" FROM t"#);
        assert_eq!(
            numbered("SELECT 'it''s ?', ? -- don't ?\n, ? /* ? */ , ?"),
            "SELECT 'it''s ?', $1 -- don't ?\n, $2 /* ? */ , $3"
        );
    }
}
