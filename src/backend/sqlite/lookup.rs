//! The operators' lookups on SQLite.

use sqlx::sqlite::{Sqlite, SqliteConnection};

use super::SqliteStore;
use crate::backend::sql::Params;

crate::backend::lookup_sql::lookup_store!(SqliteStore, Sqlite, SqliteConnection, Params::Numbered);
