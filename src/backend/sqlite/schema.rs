//! The tables [`SqliteStore`] drives, as statements in its dialect.

use super::SqliteStore;
use crate::store::Schema;

impl Schema for SqliteStore {
    fn table_name(&self, history: bool) -> String {
        self.tables.name(&self.names, history)
    }

    fn create_tables_sql(&self) -> Vec<String> {
        let (orders, history) = self.tables.quoted('"', &self.names);
        let now = "(strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))";
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {orders} (id INTEGER PRIMARY KEY, status TEXT NOT NULL, \
                 version INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL DEFAULT {now})"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {history} (order_id INTEGER NOT NULL, seq INTEGER NOT NULL, \
                 from_status TEXT NOT NULL, to_status TEXT NOT NULL, event TEXT NOT NULL, \
                 ref_id TEXT NOT NULL, payload_hash TEXT NULL, payload TEXT NULL, \
                 write_id INTEGER NULL, actor TEXT NULL, reason TEXT NULL, \
                 created_at TEXT NOT NULL DEFAULT {now}, \
                 PRIMARY KEY (order_id, seq), UNIQUE (order_id, event, ref_id))"
            ),
        ]
    }

    fn add_column_sql(&self, history: bool, column: &str) -> String {
        let ty = match column {
            "id" | "version" | "order_id" | "seq" => "INTEGER NOT NULL DEFAULT 0",
            "write_id" => "INTEGER NULL",
            "payload" | "payload_hash" | "actor" | "reason" => "TEXT NULL",
            "created_at" => "TEXT NOT NULL DEFAULT ''",
            _ => "TEXT NOT NULL DEFAULT ''",
        };
        self.tables
            .add_column_sql('"', &self.names, history, column, ty)
    }

    fn probe_sql(&self, history: bool, columns: &[&'static str]) -> String {
        // Backquoted: a double-quoted name that is no column is read as a string.
        self.tables.probe_sql('`', &self.names, history, columns)
    }
}
