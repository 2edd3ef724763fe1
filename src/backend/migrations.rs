//! Where orderly's migrations are tracked, and where its tables live: a namespace of
//! their own, beside the application's.
//!
//! orderly's migrations (`migrations/<backend>/`) create its tables in a namespace (a
//! PostgreSQL schema, a name prefix elsewhere; see `backend/names.rs`) and record
//! themselves in a table of that namespace, so they never meet the application's own
//! migrations, tables or `_sqlx_migrations`, and either may run first. The files name
//! the default namespace (`orderly.` on PostgreSQL, `orderly_` elsewhere); another is
//! written in at load ([`in_namespace`]), the checksums staying the files'.
//!
//! A database an earlier orderly migrated holds its tables under their old names in the
//! application's namespace (`outbox`, `order_transitions`, …) and its migrations in
//! [`LEGACY_TABLE`] (or, earlier still, in `_sqlx_migrations`, recognised by version
//! *and* checksum). [`migrate_in`] finishes those old migrations, moves each old table
//! into the namespace under its new name, and records the new migrations, whose
//! statements create only what is missing. Each step is idempotent, so a crash between
//! two is repaired by the next run. The old entity table (`orders`) stays where it is:
//! it is the application's.

use sqlx::migrate::{Migrate, MigrateError, Migration, Migrator};
use sqlx::{AssertSqlSafe, Database, Executor, SqlSafeStr};

use crate::backend::names::{Names, Style};

/// sqlx's default migrations table, where an earliest orderly recorded its own.
const SHARED_TABLE: &str = "_sqlx_migrations";

/// Where an earlier orderly recorded its migrations, beside the application's tables.
pub(crate) const LEGACY_TABLE: &str = "_orderly_migrations";

/// An earlier orderly's tables, each with its name in the namespace.
const LEGACY_TABLES: [(&str, &str); 9] = [
    ("order_transitions", "transitions"),
    ("idempotency_records", "idempotency_records"),
    ("one_time_tokens", "one_time_tokens"),
    ("flows", "flows"),
    ("flow_steps", "flow_steps"),
    ("outbox", "outbox"),
    ("inbox", "inbox"),
    ("timers", "timers"),
    ("orderly_audit", "audit"),
];

/// How a dialect finds and moves tables.
pub(crate) struct Dialect {
    /// A statement returning a row when the table `{}` (a bare name, written in as a
    /// literal) exists where unqualified names resolve.
    pub(crate) exists: fn(&str) -> String,
    /// A statement returning a row when `_sqlx_migrations` exists.
    pub(crate) shared_exists: &'static str,
    /// The statements that move the old table `from` into the namespace of `names` as
    /// `to` (a bare name).
    pub(crate) moves: fn(from: &str, names: &Names, to: &str) -> Vec<String>,
    /// The old index names to drop once their tables moved (SQLite, where an index's name
    /// is the whole database's: the new migrations create them under the namespace's).
    pub(crate) old_indexes: &'static [&'static str],
}

/// `files` (orderly's migrations, written for the default namespace) in `names`'
/// namespace, recorded in its migrations table; each migration keeps its file's
/// checksum.
pub(crate) fn in_namespace(files: Migrator, names: &Names) -> Migrator {
    let ns = &names.namespace;
    let (default, ours) = match names.style() {
        #[cfg(feature = "postgres")]
        Style::Schema => ("orderly.".to_owned(), format!("\"{ns}\".")),
        #[cfg(any(feature = "sqlite", feature = "mysql"))]
        Style::Prefix => ("orderly_".to_owned(), format!("{ns}_")),
    };
    let migrations: Vec<Migration> = files
        .iter()
        .map(|m| Migration {
            sql: AssertSqlSafe(m.sql.as_str().replace(&default, &ours)).into_sql_str(),
            ..m.clone()
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(names.migrations.clone());
    #[cfg(feature = "postgres")]
    if names.style() == Style::Schema {
        migrator.create_schema(format!("\"{ns}\""));
    }
    migrator
}

/// An earlier orderly's migrations (`migrations/legacy/<backend>/`), recorded where it
/// recorded them ([`LEGACY_TABLE`]).
pub(crate) fn legacy(mut files: Migrator) -> Migrator {
    files.dangerous_set_table_name(LEGACY_TABLE);
    files
}

/// Whether an earlier orderly migrated this database (its rows in `_sqlx_migrations`
/// moved to [`LEGACY_TABLE`] first): then run `legacy` to its end, and
/// [`move_legacy`]. Run it under the backend's migration lock.
pub(crate) async fn has_legacy<DB>(
    conn: &mut DB::Connection,
    dialect: &Dialect,
    legacy: &Migrator,
) -> Result<bool, MigrateError>
where
    DB: Database,
    DB::Connection: Migrate,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    adopt::<DB>(conn, legacy, dialect.shared_exists).await?;
    exists::<DB>(conn, dialect, LEGACY_TABLE).await
}

/// Moves each of an earlier orderly's tables that is still outside the namespace into
/// it, under its new name, drops the old index names the new migrations replace, and
/// drops [`LEGACY_TABLE`]: the new migrations, run next, create only what is missing.
pub(crate) async fn move_legacy<DB>(
    conn: &mut DB::Connection,
    dialect: &Dialect,
    names: &Names,
) -> Result<(), MigrateError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    for (from, to) in LEGACY_TABLES {
        if exists::<DB>(conn, dialect, from).await? {
            for statement in (dialect.moves)(from, names, to) {
                execute::<DB>(conn, statement).await?;
            }
        }
    }
    for index in dialect.old_indexes {
        execute::<DB>(conn, format!("DROP INDEX IF EXISTS {index}")).await?;
    }
    execute::<DB>(conn, format!("DROP TABLE {LEGACY_TABLE}")).await
}

async fn exists<DB>(
    conn: &mut DB::Connection,
    dialect: &Dialect,
    table: &str,
) -> Result<bool, MigrateError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let sql = (dialect.exists)(table);
    Ok(sqlx::raw_sql(AssertSqlSafe(sql))
        .fetch_optional(&mut *conn)
        .await?
        .is_some())
}

async fn execute<DB>(conn: &mut DB::Connection, statement: String) -> Result<(), MigrateError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    sqlx::raw_sql(AssertSqlSafe(statement))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Moves orderly's own rows out of `_sqlx_migrations` into [`LEGACY_TABLE`], where the
/// earlier orderly that wrote [`LEGACY_TABLE`] moved them. Run it under the backend's
/// migration lock. `shared_exists` is the backend's query
/// returning a row when `_sqlx_migrations` exists. Idempotent, and safe to repeat after
/// a crash between its copy and its delete.
async fn adopt<DB>(
    conn: &mut DB::Connection,
    legacy: &Migrator,
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
            legacy
                .iter()
                .any(|m| m.version == applied.version && m.checksum == applied.checksum)
        })
        .map(|applied| applied.version.to_string())
        .collect();
    if versions.is_empty() {
        return Ok(());
    }
    conn.ensure_migrations_table(LEGACY_TABLE).await?;
    // The versions are integers read back from the database: safe to write inline.
    let versions = versions.join(", ");
    let columns = "version, description, installed_on, success, checksum, execution_time";
    let copy = format!(
        "INSERT INTO {LEGACY_TABLE} ({columns}) SELECT {columns} FROM {SHARED_TABLE} s \
         WHERE s.version IN ({versions}) \
         AND NOT EXISTS (SELECT 1 FROM {LEGACY_TABLE} o WHERE o.version = s.version)"
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

/// Runs `sql`, the statements that create the demo's tables where they do not exist
/// ([`crate::Tables::demo`]).
pub(crate) async fn create_demo<DB>(
    conn: &mut DB::Connection,
    sql: Vec<String>,
) -> Result<(), sqlx::Error>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    for statement in sql {
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}
