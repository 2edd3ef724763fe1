-- The history: one row per applied transition. seq is the entity's version after the
-- change; UNIQUE (order_id, event, ref_id) is the identity of a request: a twin loses
-- here. The entity table is the application's own: no migration here creates or alters it.
CREATE TABLE IF NOT EXISTS orderly_transitions (
    order_id     INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    from_status  TEXT    NOT NULL,
    to_status    TEXT    NOT NULL,
    event        TEXT    NOT NULL,
    ref_id       TEXT    NOT NULL,
    payload_hash TEXT    NULL,
    payload      TEXT    NULL,
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    write_id INTEGER NULL,
    actor TEXT NULL,
    reason TEXT NULL,
    PRIMARY KEY (order_id, seq),
    UNIQUE (order_id, event, ref_id)
);

CREATE TABLE IF NOT EXISTS orderly_idempotency_records (
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
CREATE INDEX IF NOT EXISTS orderly_idempotency_records_stuck ON orderly_idempotency_records (status, lease_until);
CREATE INDEX IF NOT EXISTS orderly_idempotency_records_expiry ON orderly_idempotency_records (expires_at);

CREATE TABLE IF NOT EXISTS orderly_one_time_tokens (
    scope      TEXT   NOT NULL,
    token      TEXT   NOT NULL,
    -- Past this the token is rejected, and a purge may delete it.
    expires_at BIGINT NOT NULL,
    -- When it was consumed; NULL while unused.
    used_at    BIGINT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (scope, token)
);
CREATE INDEX IF NOT EXISTS orderly_one_time_tokens_expiry ON orderly_one_time_tokens (expires_at);
