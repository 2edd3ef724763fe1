//! Where orderly's migrations are tracked: a table of their own, beside the
//! application's.
//!
//! An application with sqlx migrations of its own keeps them in `_sqlx_migrations`;
//! orderly's are recorded in [`MIGRATIONS_TABLE`], so the two sets never meet and either
//! may run first. A database migrated by an earlier orderly, which recorded its
//! migrations in `_sqlx_migrations`, has those rows moved over on the next migration:
//! exactly the rows whose version *and* checksum are one of orderly's own, so an
//! application's rows stay where they are.

use sqlx::migrate::{Migrate, MigrateError, Migrator};
use sqlx::{AssertSqlSafe, Database, Executor};

use crate::store::MIGRATIONS_TABLE;

/// sqlx's default migrations table, where an earlier orderly recorded its own.
const SHARED_TABLE: &str = "_sqlx_migrations";

/// `migrator` with its bookkeeping in [`MIGRATIONS_TABLE`].
pub(crate) fn own_table(mut migrator: Migrator) -> Migrator {
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// Moves orderly's own rows out of `_sqlx_migrations` into [`MIGRATIONS_TABLE`]. Run
/// it under the backend's migration lock. `shared_exists` is the backend's query
/// returning a row when `_sqlx_migrations` exists. Idempotent, and safe to repeat after
/// a crash between its copy and its delete.
pub(crate) async fn adopt<DB>(
    conn: &mut DB::Connection,
    ours: &Migrator,
    shared_exists: &'static str,
) -> Result<(), MigrateError>
where
    DB: Database,
    DB::Connection: Migrate,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    if sqlx::raw_sql(shared_exists)
        .fetch_optional(&mut *conn)
        .await?
        .is_none()
    {
        return Ok(());
    }
    let versions: Vec<String> = conn
        .list_applied_migrations(SHARED_TABLE)
        .await?
        .into_iter()
        .filter(|applied| {
            ours.iter()
                .any(|m| m.version == applied.version && m.checksum == applied.checksum)
        })
        .map(|applied| applied.version.to_string())
        .collect();
    if versions.is_empty() {
        return Ok(());
    }
    conn.ensure_migrations_table(MIGRATIONS_TABLE).await?;
    // The versions are integers read back from the database: safe to write inline.
    let versions = versions.join(", ");
    let columns = "version, description, installed_on, success, checksum, execution_time";
    let copy = format!(
        "INSERT INTO {MIGRATIONS_TABLE} ({columns}) SELECT {columns} FROM {SHARED_TABLE} s \
         WHERE s.version IN ({versions}) \
         AND NOT EXISTS (SELECT 1 FROM {MIGRATIONS_TABLE} o WHERE o.version = s.version)"
    );
    sqlx::raw_sql(AssertSqlSafe(copy))
        .execute(&mut *conn)
        .await?;
    let delete = format!("DELETE FROM {SHARED_TABLE} WHERE version IN ({versions})");
    sqlx::raw_sql(AssertSqlSafe(delete))
        .execute(&mut *conn)
        .await?;
    Ok(())
}
