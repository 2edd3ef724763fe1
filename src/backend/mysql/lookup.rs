//! The operators' lookups on MySQL/MariaDB.

use sqlx::mysql::{MySql, MySqlConnection};

use super::MySqlStore;
use crate::backend::sql::Params;

crate::backend::lookup_sql::lookup_store!(MySqlStore, MySql, MySqlConnection, Params::Plain);
