//! The tables [`MySqlStore`] drives, as statements in its dialect.

use super::MySqlStore;
use crate::store::Schema;

impl Schema for MySqlStore {
    fn table_name(&self, history: bool) -> String {
        self.tables.name(&self.names, history)
    }

    fn create_tables_sql(&self) -> Vec<String> {
        let (orders, history) = self.tables.quoted('`', &self.names);
        let text = |n: u32| {
            format!("VARCHAR({n}) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL")
        };
        let (short, long) = (text(64), text(255));
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {orders} (id BIGINT NOT NULL PRIMARY KEY, status {short}, \
                 version BIGINT NOT NULL DEFAULT 0, \
                 created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) \
                 ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {history} (order_id BIGINT NOT NULL, seq BIGINT NOT NULL, \
                 from_status {short}, to_status {short}, event {short}, ref_id {long}, \
                 payload_hash CHAR(64) NULL, payload JSON NULL, write_id BIGINT NULL, \
                 actor VARCHAR(255) NULL, reason TEXT NULL, \
                 created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
                 PRIMARY KEY (order_id, seq), UNIQUE KEY (order_id, event, ref_id)) \
                 ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"
            ),
        ]
    }

    fn add_column_sql(&self, history: bool, column: &str) -> String {
        let ty = match column {
            "version" => "BIGINT NOT NULL DEFAULT 0",
            "id" | "order_id" | "seq" => "BIGINT NOT NULL",
            "payload" => "JSON NULL",
            "write_id" => "BIGINT NULL",
            "payload_hash" => "CHAR(64) NULL",
            "actor" => "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
            "reason" => "TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
            "ref_id" => "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL",
            "created_at" => "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
            _ => "VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL",
        };
        self.tables
            .add_column_sql('`', &self.names, history, column, ty)
    }

    fn probe_sql(&self, history: bool, columns: &[&'static str]) -> String {
        self.tables.probe_sql('`', &self.names, history, columns)
    }
}
