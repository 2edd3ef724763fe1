//! The audit trail on MySQL/MariaDB.

use sqlx::mysql::{MySql, MySqlConnection};

use super::MySqlStore;
use crate::backend::sql::Params;

crate::backend::audit_sql::audit_store!(MySqlStore, MySql, MySqlConnection, Params::Plain);
