//! The SQL of the tables orderly is configured with ([`Tables`]): names quoted in each
//! backend's identifier quote, the probe of their columns and the statement that adds
//! one.

use crate::store::Tables;

impl Tables {
    /// The statement that selects `columns` of one table (`history`, or the entity
    /// table) from no row, names quoted with `q`: it fails if a column is missing.
    pub(crate) fn probe_sql(&self, q: char, history: bool, columns: &[&str]) -> String {
        let table = if history {
            self.history()
        } else {
            self.orders()
        };
        let columns: Vec<String> = columns.iter().map(|c| quote(c, q)).collect();
        format!(
            "SELECT {} FROM {} WHERE 1 = 0",
            columns.join(", "),
            quote(table, q)
        )
    }

    /// The statement that adds `column` of type `ty` to one table, names quoted with `q`.
    pub(crate) fn add_column_sql(&self, q: char, history: bool, column: &str, ty: &str) -> String {
        let table = if history {
            self.history()
        } else {
            self.orders()
        };
        format!(
            "ALTER TABLE {} ADD COLUMN {} {ty}",
            quote(table, q),
            quote(column, q)
        )
    }

    /// One table's name, as configured.
    pub(crate) fn name(&self, history: bool) -> String {
        if history {
            self.history().to_owned()
        } else {
            self.orders().to_owned()
        }
    }

    /// Both names quoted with `q` (the backend's identifier quote).
    pub(crate) fn quoted(&self, q: char) -> (String, String) {
        (quote(self.orders(), q), quote(self.history(), q))
    }
}

fn quote(name: &str, q: char) -> String {
    name.split('.')
        .map(|p| format!("{q}{p}{q}"))
        .collect::<Vec<_>>()
        .join(".")
}
