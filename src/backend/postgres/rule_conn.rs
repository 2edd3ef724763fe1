//! [`RuleConn`] on PostgreSQL: a guard's or an effect's statements over the unit's connection.

use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Row};

use crate::backend::rule_conn::bound;
use crate::engine::{Arg, RuleConn};

impl RuleConn for PgConnection {
    async fn fetch_i64(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Option<i64>, sqlx::Error> {
        let query = bound(sqlx::query(AssertSqlSafe(numbered(sql))), args);
        let row = query.fetch_optional(self).await?;
        Ok(row
            .map(|r| r.try_get::<Option<i64>, _>(0))
            .transpose()?
            .flatten())
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

/// `sql` with its `?` placeholders (outside quotes) numbered `$1`, `$2`, … (PostgreSQL's).
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let (mut n, mut quote) = (0, None);
    for c in sql.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                out.push(c);
            }
            (Some(q), _) if c == q => {
                quote = None;
                out.push(c);
            }
            (None, '?') => {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::numbered;

    #[test]
    fn placeholders_outside_quotes_are_numbered() {
        assert_eq!(
            numbered("SELECT qty FROM s WHERE sku = ? AND note <> '?' AND id = ?"),
            "SELECT qty FROM s WHERE sku = $1 AND note <> '?' AND id = $2"
        );
        assert_eq!(numbered(r#"SELECT "a?" FROM t"#), r#"SELECT "a?" FROM t"#);
    }
}
