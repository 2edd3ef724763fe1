//! The audit trail on SQLite.

use sqlx::sqlite::{Sqlite, SqliteConnection};

use super::SqliteStore;
use crate::backend::sql::Params;

crate::backend::audit_sql::audit_store!(SqliteStore, Sqlite, SqliteConnection, Params::Numbered);
