//! Table names: the application's entity table, orderly's namespace, validated
//! identifiers quoted in each backend's SQL.

use crate::error::Error;

/// orderly's namespace unless configured: the PostgreSQL schema `orderly`, the prefix
/// `orderly_` on MariaDB/MySQL and SQLite.
pub const DEFAULT_NAMESPACE: &str = "orderly";

/// The entity table [`Tables::demo`] names: one no application has by accident.
pub const DEMO_TABLE: &str = "orderly_demo_orders";

/// The longest namespace: with `_` and orderly's longest table name (`idempotency_records`)
/// after it, a name stays within MySQL's 64 bytes and PostgreSQL's 63.
const NAMESPACE_MAX: usize = 40;

/// The tables a store drives: the application's entity table, named here, and orderly's
/// own tables, which live in a namespace of their own (`docs/backends.md`, "The tables
/// orderly owns").
///
/// The entity table is the application's: its migrations create it, with the columns
/// `id` (64-bit integer key), `status` (text) and `version` (64-bit integer); any other
/// columns are left alone. orderly's migrations never create or alter it
/// ([`Engine::create_tables`](crate::Engine::create_tables) creates one where none exists,
/// for a demo or a test). orderly's tables — the history, idempotency records, one-time
/// tokens, flows, the outbox and inbox, timers, the operators' audit — are created by
/// orderly's migrations in the namespace: the schema `orderly` on PostgreSQL, the prefix
/// `orderly_` on MariaDB/MySQL and SQLite, unless [`in_namespace`](Self::in_namespace)
/// names another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    entity: String,
    history: Option<String>,
    namespace: String,
}

impl Tables {
    /// The application's entity table `entity`, orderly's tables in the default namespace.
    /// The name must be an identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes),
    /// optionally qualified by a schema (`schema.table`); anything else is
    /// [`Error::InvalidInput`]. Names are quoted in SQL, so reserved words work.
    pub fn new(entity: &str) -> Result<Self, Error> {
        Ok(Tables {
            entity: validate_name(entity)?,
            history: None,
            namespace: DEFAULT_NAMESPACE.to_owned(),
        })
    }

    /// The demo's entity table, [`DEMO_TABLE`], for a quick start or a test: create it
    /// with [`Engine::create_tables`](crate::Engine::create_tables) (the stores' `demo`
    /// constructors do).
    pub fn demo() -> Self {
        Tables {
            entity: DEMO_TABLE.to_owned(),
            history: None,
            namespace: DEFAULT_NAMESPACE.to_owned(),
        }
    }

    /// The history written to `history` (a table of the application's, with the layout of
    /// orderly's `transitions` table) instead of orderly's own. Validated as [`new`](Self::new)
    /// validates.
    pub fn with_history(mut self, history: &str) -> Result<Self, Error> {
        self.history = Some(validate_name(history)?);
        Ok(self)
    }

    /// orderly's tables in the namespace `namespace` instead of `orderly`: lowercase
    /// letters, digits and `_`, starting with a letter, at most 40 bytes; anything else is
    /// [`Error::InvalidInput`]. Migrate it with the backend's `migrate_in`.
    pub fn in_namespace(mut self, namespace: &str) -> Result<Self, Error> {
        self.namespace = validate_namespace(namespace)?;
        Ok(self)
    }

    /// The entity table's name.
    pub fn entity(&self) -> &str {
        &self.entity
    }

    /// The history table's name where the application named one ([`with_history`](Self::with_history));
    /// `None`: orderly's `transitions` in the namespace.
    pub fn history(&self) -> Option<&str> {
        self.history.as_deref()
    }

    /// orderly's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
}

/// `namespace` if it is one ([`Tables::in_namespace`]), else [`Error::InvalidInput`].
pub(crate) fn validate_namespace(namespace: &str) -> Result<String, Error> {
    let mut chars = namespace.chars();
    let ok = namespace.len() <= NAMESPACE_MAX
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(namespace.to_owned())
    } else {
        Err(Error::InvalidInput(format!(
            "namespace {namespace:?} is not one: lowercase letters, digits and _, starting with a letter, at most {NAMESPACE_MAX} bytes"
        )))
    }
}

fn validate_name(name: &str) -> Result<String, Error> {
    let ok_part = |p: &str| {
        let mut chars = p.chars();
        p.len() <= 63
            && chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|p| ok_part(p)) {
        Ok(name.to_string())
    } else {
        Err(Error::InvalidInput(format!(
            "table name {name:?} is not an identifier ([A-Za-z_][A-Za-z0-9_]*, optionally schema-qualified)"
        )))
    }
}
