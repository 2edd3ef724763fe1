//! The operators' lookups on PostgreSQL.

use sqlx::postgres::{PgConnection, Postgres};

use super::PgStore;
use crate::backend::sql::Params;

crate::backend::lookup_sql::lookup_store!(PgStore, Postgres, PgConnection, Params::Dollar);
