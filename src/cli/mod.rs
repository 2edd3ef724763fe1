//! The command line (feature `cli`): the admin page's reads and actions against a
//! database, for scripts and for people without the page, with tables for people,
//! `--json` for scripts, progress for long bulk actions and exit codes that mean
//! something ([`Exit`]).
//!
//! Run it from the application's own binary, over the same [`Admin`] the service
//! mounts, so that its machines (graphs), flows (resume) and record scopes (release)
//! are known:
//!
//! ```rust,no_run
//! # use orderly::admin::Admin;
//! # use orderly::cli::Cli;
//! # use orderly::{Engine, Flows, Records, SqliteStore};
//! # orderly::state_machine! { pub OrderMachine { states: OrderState { Created, Paid } events: OrderEvent { Pay } initial: Created; terminal: [Paid]; transitions: { Created + Pay => Paid, } } }
//! # async fn cli(store: SqliteStore, engine: Engine<OrderMachine, SqliteStore>, flows: Flows<SqliteStore>, records: Records<SqliteStore>) {
//! let admin = Admin::new(store.clone()).machine(engine).flows(flows).records(records);
//! std::process::exit(Cli::new(admin).main().await);
//! # }
//! ```
//!
//! The `orderly` binary of this crate is the same command line with nothing
//! registered: every read, requeue, timer action and audit, no resume or release.
//! The commands are described in `docs/admin.md`.

mod acts;
mod args;
mod commands;
mod out;
mod table;

use std::io::Write;

use clap::Parser;

use self::args::Args;
use self::out::Out;
use crate::admin::{Admin, AdminStore};

pub use args::Exit;

/// The command line over an [`Admin`]'s store and registrations.
pub struct Cli<S: AdminStore> {
    admin: Admin<S>,
}

impl<S: AdminStore> std::fmt::Debug for Cli<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cli").field("admin", &self.admin).finish()
    }
}

impl<S: AdminStore> Cli<S> {
    /// The command line over `admin`'s store, machines, flows and records.
    pub fn new(admin: Admin<S>) -> Self {
        Cli { admin }
    }

    /// Runs the command of this process's arguments, printing to stdout (and progress
    /// and errors to stderr); the exit code to end the process with.
    pub async fn main(self) -> i32 {
        let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
        self.run(std::env::args_os(), &mut out, &mut err).await as i32
    }

    /// Runs the command of `args` (the program's name first), printing to `out` (and
    /// progress and errors to `err`).
    pub async fn run<I, T>(
        &self,
        args: I,
        out: &mut (dyn Write + Send),
        err: &mut (dyn Write + Send),
    ) -> Exit
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let args = match Args::try_parse_from(args) {
            Ok(args) => args,
            Err(e) => {
                let printed = e.render().to_string();
                if e.use_stderr() {
                    let _ = write!(err, "{printed}");
                    return Exit::Usage;
                }
                // --help, --version
                let _ = write!(out, "{printed}");
                return Exit::Ok;
            }
        };
        let who = args.who.clone().unwrap_or_else(default_who);
        let mut out = Out {
            json: args.json,
            out,
            err,
        };
        self.command(args.command, &who, &mut out).await
    }
}

/// Who runs the command, when `--who` does not say: the login name, or `cli`.
fn default_who() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_default();
    if user.is_empty() {
        "cli".to_string()
    } else {
        format!("cli:{user}")
    }
}
