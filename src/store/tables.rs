//! Table names: validated identifiers, quoted in each backend's SQL.

use crate::error::Error;

/// The table orderly records its applied migrations in, beside the application's own
/// `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "_orderly_migrations";

/// Names of the tables orderly reads and writes, so it can drive an existing table.
///
/// The entity table needs the columns `id` (64-bit integer key), `status` (text) and
/// `version` (64-bit integer); any other columns are left alone. The history table has the
/// layout of `order_transitions` in `migrations/<backend>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    orders: String,
    history: String,
}

impl Default for Tables {
    /// `orders` and `order_transitions`, as created by the migrations.
    fn default() -> Self {
        Tables {
            orders: "orders".into(),
            history: "order_transitions".into(),
        }
    }
}

impl Tables {
    /// Custom table names. Each must be an identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most
    /// 63 bytes), optionally qualified by a schema (`schema.table`); anything else is
    /// [`Error::InvalidInput`]. Names are quoted in SQL, so reserved words work.
    pub fn new(orders: &str, history: &str) -> Result<Self, Error> {
        Ok(Tables {
            orders: validate_name(orders)?,
            history: validate_name(history)?,
        })
    }

    /// The entity table name.
    pub fn orders(&self) -> &str {
        &self.orders
    }

    /// The history table name.
    pub fn history(&self) -> &str {
        &self.history
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
