//! [`RuleConn`] on MySQL/MariaDB: a guard's or an effect's statements over the unit's connection.

use sqlx::Row;
use sqlx::mysql::MySqlConnection;

use super::text::{Lit, Text, text};
use crate::backend::rule_conn::integer;
use crate::engine::{Arg, RuleConn};

/// `sql` with `args`, sent as text (`backend/mysql/text.rs` says why): a guard's
/// statement dropped with its call leaves the caller's connection answering.
fn bound<'a>(sql: &'a str, args: &[Arg<'a>]) -> Text<'a> {
    args.iter().fold(text(sql), |query, arg| {
        query.bind(match *arg {
            Arg::Int(v) => Lit::Int(v),
            Arg::Text(v) => Lit::Text(v),
            Arg::Bool(v) => Lit::from(v),
            Arg::Null => Lit::Null,
        })
    })
}

impl RuleConn for MySqlConnection {
    async fn fetch_i64(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Option<i64>, sqlx::Error> {
        let query = bound(sql, args);
        let row = query.fetch_optional(self).await?;
        Ok(row.as_ref().map(integer).transpose()?.flatten())
    }

    async fn fetch_text(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<Option<String>, sqlx::Error> {
        let query = bound(sql, args);
        let row = query.fetch_optional(self).await?;
        Ok(row
            .map(|r| r.try_get::<Option<String>, _>(0))
            .transpose()?
            .flatten())
    }

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, sqlx::Error> {
        let query = bound(sql, args);
        Ok(query.execute(self).await?.rows_affected())
    }

    fn for_update(select: &str) -> String {
        format!("{select} FOR UPDATE")
    }
}
