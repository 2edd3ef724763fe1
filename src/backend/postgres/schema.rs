//! The tables [`PgStore`] drives, as statements in its dialect.

use super::PgStore;
use crate::store::Schema;

impl Schema for PgStore {
    fn table_name(&self, history: bool) -> String {
        self.tables.name(&self.names, history)
    }

    fn create_tables_sql(&self) -> Vec<String> {
        let (orders, history) = self.tables.quoted('"', &self.names);
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {orders} (id BIGINT PRIMARY KEY, status TEXT NOT NULL, \
                 version BIGINT NOT NULL DEFAULT 0, created_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {history} (order_id BIGINT NOT NULL, seq BIGINT NOT NULL, \
                 from_status TEXT NOT NULL, to_status TEXT NOT NULL, event TEXT NOT NULL, \
                 ref_id TEXT NOT NULL, payload_hash TEXT NULL, payload JSONB NULL, \
                 write_id BIGINT NULL, actor TEXT NULL, reason TEXT NULL, \
                 created_at TIMESTAMPTZ NOT NULL DEFAULT now(), \
                 PRIMARY KEY (order_id, seq), UNIQUE (order_id, event, ref_id))"
            ),
        ]
    }

    fn add_column_sql(&self, history: bool, column: &str) -> String {
        let ty = match column {
            "version" => "BIGINT NOT NULL DEFAULT 0",
            "id" | "order_id" | "seq" => "BIGINT NOT NULL",
            "payload" => "JSONB NULL",
            "write_id" => "BIGINT NULL",
            "payload_hash" | "actor" | "reason" => "TEXT NULL",
            "created_at" => "TIMESTAMPTZ NOT NULL DEFAULT now()",
            _ => "TEXT NOT NULL",
        };
        self.tables
            .add_column_sql('"', &self.names, history, column, ty)
    }

    fn probe_sql(&self, history: bool, columns: &[&'static str]) -> String {
        self.tables.probe_sql('"', &self.names, history, columns)
    }
}
