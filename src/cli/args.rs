//! The command line's arguments (parsed by clap) and its exit codes.

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::admin::ops::Filter;
use crate::error::Error;

/// What the process's exit code says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Exit {
    /// Done: it read what was asked, or changed what it was told to.
    Ok = 0,
    /// Nothing to show or change: a search found nothing, an entity does not exist,
    /// the event was not dead, the record not stuck, the timer not re-armable.
    NotFound = 1,
    /// The command line, or a value on it, does not read, or names what cannot be acted
    /// on (a flow that is not parked, a kind or scope not registered); nothing was done.
    Usage = 2,
    /// A failure that may pass (the database unreachable, busy, a deadline): run it
    /// again.
    Retry = 3,
    /// A failure that running it again will not fix.
    Failed = 4,
    /// A bulk action stopped part-way: some things changed (the audit trail says how
    /// many), then it failed.
    Partial = 5,
}

impl Exit {
    /// The exit code of a command that failed with `e`, having changed nothing.
    pub fn of(e: &Error) -> Self {
        match e {
            Error::InvalidInput(_) | Error::FlowVersion { .. } => Exit::Usage,
            Error::NotFound { .. } => Exit::NotFound,
            e if e.is_retryable() => Exit::Retry,
            _ => Exit::Failed,
        }
    }
}

/// orderly: what is stuck in a database of orderly, and what to do about it.
#[derive(Debug, Parser)]
#[command(name = "orderly", version)]
pub(super) struct Args {
    /// Print JSON instead of tables (for scripts).
    #[arg(long, global = true)]
    pub(super) json: bool,
    /// Who runs the command, as the audit trail records its actions (default: cli:$USER).
    #[arg(long, global = true, value_name = "NAME")]
    pub(super) who: Option<String>,
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// Counts of what waits and what is stuck.
    Overview,
    /// An entity's state, history, outbox events and timers.
    History {
        /// The machine's name.
        machine: String,
        /// The entity's id.
        id: i64,
    },
    /// Everything a reference, idempotency key, flow key, message id or entity id names.
    Search {
        /// What to look for.
        term: String,
        /// Everything whose reference or key starts with the term (case counts): a read
        /// of the history table whole, as an exact search is.
        #[arg(long)]
        prefix: bool,
    },
    /// Outbox events in the dead state.
    #[command(subcommand)]
    Outbox(OutboxCmd),
    /// Flows parked for an operator.
    #[command(subcommand)]
    Flows(FlowsCmd),
    /// Idempotency records stuck in PROCESSING.
    #[command(subcommand)]
    Records(RecordsCmd),
    /// Timers that died.
    #[command(subcommand)]
    Timers(TimersCmd),
    /// A registered machine's state graph, as Mermaid text.
    Graph {
        /// The machine's name.
        machine: String,
    },
    /// The latest actions of the audit trail.
    Audit {
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

/// Which dead events.
#[derive(Debug, clap::Args)]
pub(super) struct FilterArgs {
    /// Of this machine.
    #[arg(long)]
    machine: Option<String>,
    /// Of this event.
    #[arg(long)]
    event: Option<String>,
    /// Whose last error contains this text.
    #[arg(long)]
    error: Option<String>,
    /// At least this old (30s, 10m, 2h, 1d).
    #[arg(long, value_name = "AGE", value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
}

impl FilterArgs {
    pub(super) fn filter(&self) -> Filter {
        Filter {
            machine: self.machine.clone(),
            event: self.event.clone(),
            error: self.error.clone(),
            older_than_s: self.older_than.map(|d| d.as_secs()),
        }
    }
}

#[derive(Debug, Subcommand)]
pub(super) enum OutboxCmd {
    /// List the dead events a filter matches, 500 at a time in key order.
    Dead {
        #[command(flatten)]
        filter: FilterArgs,
        /// The page after this message id (machine:entity_id:version): the last one
        /// the page before listed.
        #[arg(long, value_name = "ID")]
        after: Option<String>,
    },
    /// Put dead events back in line: one by its message id, or every one a filter
    /// matches (in batches, recorded once in the audit trail).
    Requeue {
        #[command(flatten)]
        filter: FilterArgs,
        /// One event, by its message id (machine:entity_id:version).
        #[arg(long, conflicts_with_all = ["machine", "event", "error", "older_than", "all"])]
        id: Option<String>,
        /// Every dead event (required when no filter is given).
        #[arg(long)]
        all: bool,
    },
    /// Discard dead events, by message id or every match of a filter: each deleted,
    /// never published (its entity's later events are published without it); recorded
    /// in the audit trail.
    Discard {
        #[command(flatten)]
        filter: FilterArgs,
        /// One event, by its message id (machine:entity_id:version).
        #[arg(long, conflicts_with_all = ["machine", "event", "error", "older_than", "all"])]
        id: Option<String>,
        /// Every dead event (required when no filter is given).
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum FlowsCmd {
    /// List the parked flows.
    Parked {
        /// Of this kind only.
        #[arg(long)]
        kind: Option<String>,
    },
    /// Resume a parked flow (its kind registered with this command line).
    Resume {
        /// The flow's kind.
        kind: String,
        /// The flow key.
        key: String,
        /// retry: run the step again; applied: it took effect (with --output); compensate:
        /// undo the steps before it.
        #[arg(long, value_parser = ["retry", "applied", "compensate"])]
        how: String,
        /// For applied: the step's output, JSON (default null).
        #[arg(long, value_name = "JSON")]
        output: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum RecordsCmd {
    /// List the records held past their lease.
    Stuck {
        /// Of this scope only.
        #[arg(long)]
        scope: Option<String>,
    },
    /// Release a stuck record, so that the next claim runs its request again (its
    /// scope registered with this command line).
    Release {
        /// The record's scope.
        scope: String,
        /// Its idempotency key.
        key: String,
    },
}

/// One timer, by its key.
#[derive(Debug, clap::Args)]
pub(super) struct TimerArgs {
    /// The machine.
    pub(super) machine: String,
    /// The entity.
    pub(super) entity_id: i64,
    /// The event it fires.
    pub(super) event: String,
    /// Its reference.
    pub(super) ref_id: String,
}

#[derive(Debug, Subcommand)]
pub(super) enum TimersCmd {
    /// List the dead timers.
    Dead,
    /// Re-arm a dead timer.
    Rearm(TimerArgs),
    /// Cancel a pending or dead timer no job is firing.
    Cancel(TimerArgs),
}
