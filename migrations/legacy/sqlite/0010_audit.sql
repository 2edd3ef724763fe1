-- The operators' audit trail: every action the admin page takes (requeue, resume,
-- rearm, cancel), who took it, on what (or which filter), how many things it changed,
-- and when (the database's clock, in milliseconds since the epoch).
CREATE TABLE IF NOT EXISTS orderly_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms    INTEGER NOT NULL,
    who      TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    target   TEXT    NOT NULL,
    affected INTEGER NOT NULL
);
