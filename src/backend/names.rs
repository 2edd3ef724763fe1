//! The names of orderly's own tables in one namespace, as one dialect's SQL writes them,
//! and the statements built from them: once per namespace a process uses.
//!
//! PostgreSQL keeps a namespace as a schema (`"orderly".outbox`); MariaDB/MySQL and SQLite
//! as a prefix (`orderly_outbox`): a database of its own on MariaDB would leave orderly's
//! rows out of a dump of the application's database, and an attached file on SQLite is
//! not committed atomically with the main one in WAL mode.

use std::sync::{Mutex, OnceLock, PoisonError};

use crate::store::DEFAULT_NAMESPACE;

/// How a dialect keeps a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// A schema (PostgreSQL).
    #[cfg(feature = "postgres")]
    Schema,
    /// A prefix of every table's name (MariaDB/MySQL, SQLite).
    #[cfg(any(feature = "sqlite", feature = "mysql"))]
    Prefix,
}

/// orderly's tables in one namespace, each name as the dialect's SQL writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Names {
    /// The namespace.
    pub namespace: String,
    style: Style,
    /// The history, unless the application named its own ([`crate::Tables::with_history`]).
    pub transitions: String,
    pub records: String,
    pub tokens: String,
    pub flows: String,
    pub flow_steps: String,
    pub outbox: String,
    pub inbox: String,
    pub timers: String,
    pub audit: String,
    /// Where orderly's migrations are recorded.
    pub migrations: String,
}

impl Names {
    /// The names in `namespace` (validated: [`crate::store::validate_namespace`]).
    pub(crate) fn new(namespace: &str, style: Style) -> Names {
        let name = |table: &str| named(namespace, style, table);
        Names {
            namespace: namespace.to_owned(),
            style,
            transitions: name("transitions"),
            records: name("idempotency_records"),
            tokens: name("one_time_tokens"),
            flows: name("flows"),
            flow_steps: name("flow_steps"),
            outbox: name("outbox"),
            inbox: name("inbox"),
            timers: name("timers"),
            audit: name("audit"),
            migrations: name("migrations"),
        }
    }

    /// How the dialect keeps the namespace.
    pub(crate) fn style(&self) -> Style {
        self.style
    }

    /// The SQL name of the table `table` (a bare name) in the namespace.
    #[cfg(any(feature = "sqlite", feature = "mysql"))]
    pub(crate) fn in_namespace(&self, table: &str) -> String {
        named(&self.namespace, self.style, table)
    }
}

fn named(namespace: &str, style: Style, table: &str) -> String {
    match style {
        #[cfg(feature = "postgres")]
        Style::Schema => format!("\"{namespace}\".{table}"),
        #[cfg(any(feature = "sqlite", feature = "mysql"))]
        Style::Prefix => format!("{namespace}_{table}"),
    }
}

/// Statements built from a namespace's [`Names`], once for each namespace the process
/// uses: the default's in a cell of their own, any other's kept for the life of the
/// process (a namespace is configuration: a process uses a handful at most).
pub(crate) struct PerNamespace<T: 'static> {
    build: fn(&Names) -> T,
    default: OnceLock<T>,
    others: Mutex<Vec<(String, &'static T)>>,
}

impl<T: Send + Sync + 'static> PerNamespace<T> {
    /// Statements `build` makes.
    pub(crate) const fn new(build: fn(&Names) -> T) -> Self {
        PerNamespace {
            build,
            default: OnceLock::new(),
            others: Mutex::new(Vec::new()),
        }
    }

    /// The statements of `names`' namespace, built at the first call.
    pub(crate) fn get(&'static self, names: &Names) -> &'static T {
        if names.namespace == DEFAULT_NAMESPACE {
            return self.default.get_or_init(|| (self.build)(names));
        }
        let mut others = self.others.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, built)) = others.iter().find(|(n, _)| *n == names.namespace) {
            return built;
        }
        let built: &'static T = Box::leak(Box::new((self.build)(names)));
        others.push((names.namespace.clone(), built));
        built
    }
}
