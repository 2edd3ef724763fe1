//! [`RuleConn`] on MySQL/MariaDB: a guard's or an effect's statements over the unit's connection.

use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Row};

use crate::backend::rule_conn::{bound, integer};
use crate::engine::{Arg, RuleConn};

impl RuleConn for MySqlConnection {
    async fn fetch_i64(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Option<i64>, sqlx::Error> {
        let query = bound(sqlx::query(AssertSqlSafe(sql)), args);
        let row = query.fetch_optional(self).await?;
        Ok(row.as_ref().map(integer).transpose()?.flatten())
    }

    async fn fetch_text(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<Option<String>, sqlx::Error> {
        let query = bound(sqlx::query(AssertSqlSafe(sql)), args);
        let row = query.fetch_optional(self).await?;
        Ok(row
            .map(|r| r.try_get::<Option<String>, _>(0))
            .transpose()?
            .flatten())
    }

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, sqlx::Error> {
        let query = bound(sqlx::query(AssertSqlSafe(sql)), args);
        Ok(query.execute(self).await?.rows_affected())
    }

    fn for_update(select: &str) -> String {
        format!("{select} FOR UPDATE")
    }
}
