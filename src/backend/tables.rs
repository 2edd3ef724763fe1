//! The SQL of the tables a store drives ([`Tables`]): names quoted in each backend's
//! identifier quote (orderly's own as [`Names`] writes them), the probe of their columns
//! and the statement that adds one.

use crate::backend::names::Names;
use crate::store::Tables;

impl Tables {
    /// The statement that selects `columns` of one table (`history`, or the entity
    /// table) from no row, names quoted with `q`: it fails if a column is missing.
    pub(crate) fn probe_sql(
        &self,
        q: char,
        names: &Names,
        history: bool,
        columns: &[&str],
    ) -> String {
        let columns: Vec<String> = columns.iter().map(|c| quote(c, q)).collect();
        format!(
            "SELECT {} FROM {} WHERE 1 = 0",
            columns.join(", "),
            self.table_sql(q, names, history)
        )
    }

    /// The statement that adds `column` of type `ty` to one table, names quoted with `q`.
    pub(crate) fn add_column_sql(
        &self,
        q: char,
        names: &Names,
        history: bool,
        column: &str,
        ty: &str,
    ) -> String {
        format!(
            "ALTER TABLE {} ADD COLUMN {} {ty}",
            self.table_sql(q, names, history),
            quote(column, q)
        )
    }

    /// One table's name, as configured (orderly's history as [`Names`] writes it).
    pub(crate) fn name(&self, names: &Names, history: bool) -> String {
        match (history, self.history()) {
            (false, _) => self.entity().to_owned(),
            (true, Some(h)) => h.to_owned(),
            (true, None) => names.transitions.clone(),
        }
    }

    /// Both names as SQL, quoted with `q` (the backend's identifier quote).
    pub(crate) fn quoted(&self, q: char, names: &Names) -> (String, String) {
        (
            self.table_sql(q, names, false),
            self.table_sql(q, names, true),
        )
    }

    fn table_sql(&self, q: char, names: &Names, history: bool) -> String {
        match (history, self.history()) {
            (false, _) => quote(self.entity(), q),
            (true, Some(h)) => quote(h, q),
            (true, None) => names.transitions.clone(),
        }
    }
}

fn quote(name: &str, q: char) -> String {
    name.split('.')
        .map(|p| format!("{q}{p}{q}"))
        .collect::<Vec<_>>()
        .join(".")
}
