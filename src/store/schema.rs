//! The tables a store drives, as statements: their DDL and the probes that check them.

/// The entity and history tables of a store, written as statements in the backend's
/// dialect; the store runs them ([`Store::run_sql`](super::Store::run_sql)). The
/// defaults are a store that creates and checks nothing.
pub trait Schema {
    /// The entity table's name (or, with `history`, the history table's), as configured.
    fn table_name(&self, history: bool) -> String {
        let _ = history;
        String::new()
    }

    /// The statements that create the entity and history tables under their configured
    /// names, in this version's layout, where they do not exist (see
    /// [`Engine::create_tables`](crate::Engine::create_tables)).
    fn create_tables_sql(&self) -> Vec<String> {
        Vec::new()
    }

    /// The statement that adds `column` (one orderly needs) to the entity table (or, with
    /// `history`, the history table).
    fn add_column_sql(&self, history: bool, column: &str) -> String {
        let _ = (history, column);
        String::new()
    }

    /// A statement that selects `columns` of the entity table (or, with `history`, the
    /// history table) from no row: it fails if the table lacks one (see
    /// [`Engine::check_tables`](crate::Engine::check_tables)). Empty: nothing to check.
    fn probe_sql(&self, history: bool, columns: &[&'static str]) -> String {
        let _ = (history, columns);
        String::new()
    }
}
