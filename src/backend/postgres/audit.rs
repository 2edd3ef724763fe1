//! The audit trail on PostgreSQL.

use sqlx::postgres::{PgConnection, Postgres};

use super::PgStore;
use crate::backend::sql::Params;

crate::backend::audit_sql::audit_store!(PgStore, Postgres, PgConnection, Params::Dollar);
