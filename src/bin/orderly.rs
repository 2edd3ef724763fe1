//! `orderly`: the command line of `orderly::cli` with nothing registered, against the
//! database at `--database-url URL` (first on the line) or `ORDERLY_DATABASE_URL`:
//! `sqlite:`, `postgres:` or `mysql:`. It migrates nothing and creates nothing.
//!
//! ```text
//! orderly --database-url postgres://… outbox dead --machine OrderMachine
//! ```

use std::ffi::OsString;
use std::io::Write;

use orderly::admin::Admin;
use orderly::backend::mysql::MySqlStore;
use orderly::backend::postgres::PgStore;
use orderly::backend::sqlite::{SqliteStore, connect_options};
use orderly::cli::{Cli, Exit};

/// How long the binary waits for a database server to answer.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (url, args) = database_url(std::env::args_os().collect());
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let code = run(url, args, &mut out, &mut err).await;
    std::process::exit(code as i32);
}

/// The database's URL (from `--database-url` first on the line, or the environment)
/// and the rest of the line.
fn database_url(mut args: Vec<OsString>) -> (Option<String>, Vec<OsString>) {
    let from_env = std::env::var("ORDERLY_DATABASE_URL").ok();
    let Some(first) = args.get(1).and_then(|a| a.to_str()).map(str::to_string) else {
        return (from_env, args);
    };
    if first == "--database-url" && args.len() > 2 {
        let url = args.remove(2).to_string_lossy().into_owned();
        args.remove(1);
        return (Some(url), args);
    }
    if let Some(url) = first.strip_prefix("--database-url=") {
        args.remove(1);
        return (Some(url.to_string()), args);
    }
    (from_env, args)
}

/// The tables the operator's database holds: the entity table `ORDERLY_ENTITY_TABLE`
/// (`orders` if unset), orderly's in the namespace `ORDERLY_NAMESPACE` (`orderly` if
/// unset), its history in `ORDERLY_HISTORY_TABLE` if set.
fn configured_tables() -> Result<orderly::Tables, orderly::Error> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut tables =
        orderly::Tables::new(&var("ORDERLY_ENTITY_TABLE").unwrap_or_else(|| "orders".into()))?;
    if let Some(history) = var("ORDERLY_HISTORY_TABLE") {
        tables = tables.with_history(&history)?;
    }
    if let Some(namespace) = var("ORDERLY_NAMESPACE") {
        tables = tables.in_namespace(&namespace)?;
    }
    Ok(tables)
}

async fn run(
    url: Option<String>,
    args: Vec<OsString>,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Exit {
    // Help needs no database: `--help` anywhere, or `help` or `--version` as the command.
    let first = args.get(1).and_then(|a| a.to_str());
    let wants_help = args.iter().skip(1).any(|a| a == "--help" || a == "-h")
        || matches!(first, Some("help" | "--version" | "-V"));
    let Some(url) = url else {
        if wants_help {
            // Help needs no database.
            let sqlite = SqliteStore::new(
                sqlx::sqlite::SqlitePool::connect_lazy("sqlite::memory:")
                    .expect("an in-memory URL reads"),
                orderly::Tables::demo(),
            );
            return Cli::new(Admin::new(sqlite)).run(args, out, err).await;
        }
        let _ = writeln!(
            err,
            "orderly: name the database: --database-url URL (first on the line), or ORDERLY_DATABASE_URL"
        );
        return Exit::Usage;
    };
    let fail = |err: &mut (dyn Write + Send), e: &dyn std::fmt::Display| {
        let _ = writeln!(err, "orderly: cannot open the database: {e}");
    };
    let tables = match configured_tables() {
        Ok(tables) => tables,
        Err(e) => {
            let _ = writeln!(err, "orderly: {e}");
            return Exit::Usage;
        }
    };
    // A server that may come back is worth another try; a wrong URL, name or password
    // is not.
    let open_failed = |e: &sqlx::Error| match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) => Exit::Retry,
        sqlx::Error::Configuration(_) => Exit::Usage,
        _ => Exit::Failed,
    };
    if url.starts_with("sqlite:") {
        let options = match connect_options(&url) {
            Ok(o) => o.create_if_missing(false),
            Err(e) => {
                fail(err, &e);
                return Exit::of(&e);
            }
        };
        match sqlx::sqlite::SqlitePool::connect_with(options).await {
            Ok(pool) => {
                Cli::new(Admin::new(SqliteStore::new(pool, tables)))
                    .run(args, out, err)
                    .await
            }
            Err(e) => {
                fail(err, &e);
                open_failed(&e)
            }
        }
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        match sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(PATIENCE)
            .connect(&url)
            .await
        {
            Ok(pool) => {
                Cli::new(Admin::new(PgStore::new(pool, tables)))
                    .run(args, out, err)
                    .await
            }
            Err(e) => {
                fail(err, &e);
                open_failed(&e)
            }
        }
    } else if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        match sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(PATIENCE)
            .connect(&url)
            .await
        {
            Ok(pool) => {
                Cli::new(Admin::new(MySqlStore::new(pool, tables)))
                    .run(args, out, err)
                    .await
            }
            Err(e) => {
                fail(err, &e);
                open_failed(&e)
            }
        }
    } else {
        let _ = writeln!(
            err,
            "orderly: a database URL begins sqlite:, postgres: or mysql:, not {url:?}"
        );
        Exit::Usage
    }
}
