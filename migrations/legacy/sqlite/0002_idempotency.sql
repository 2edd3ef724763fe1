-- Idempotency records: one row per (scope, idem_key), claimed, completed or failed.
-- Times are milliseconds since the epoch, from the database clock only.
CREATE TABLE IF NOT EXISTS idempotency_records (
    scope        TEXT    NOT NULL,
    idem_key     TEXT    NOT NULL,
    payload_hash TEXT    NULL,
    -- PROCESSING (claimed, under a lease), SUCCEEDED or FAILED.
    status       TEXT    NOT NULL,
    -- The holder's token while PROCESSING; every later write is conditional on it.
    owner_token  TEXT    NULL,
    attempt      INTEGER NOT NULL,
    lease_until  INTEGER NOT NULL,
    -- Past this the record counts as absent, and a purge may delete it.
    expires_at   INTEGER NOT NULL,
    -- The stored result or failure, JSON text kept byte for byte.
    result       TEXT    NULL,
    -- A FAILED record that is replayed rather than claimed again.
    terminal     INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (scope, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_records_stuck ON idempotency_records (status, lease_until);
CREATE INDEX IF NOT EXISTS idempotency_records_expiry ON idempotency_records (expires_at);
