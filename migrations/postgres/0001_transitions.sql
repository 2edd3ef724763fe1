-- The history: one row per applied transition. seq is the entity's version after the
-- change; UNIQUE (order_id, event, ref_id) is the identity of a request: a twin loses
-- here. The entity table is the application's own: no migration here creates or alters it.
CREATE TABLE IF NOT EXISTS orderly.transitions (
    order_id     BIGINT      NOT NULL,
    seq          BIGINT      NOT NULL,
    from_status  TEXT        NOT NULL,
    to_status    TEXT        NOT NULL,
    event        TEXT        NOT NULL,
    ref_id       TEXT        NOT NULL,
    payload_hash TEXT        NULL,
    payload      JSONB       NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    write_id     BIGINT      NULL,
    actor        TEXT        NULL,
    reason       TEXT        NULL,
    PRIMARY KEY (order_id, seq),
    CONSTRAINT transitions_request UNIQUE (order_id, event, ref_id)
);

-- Idempotency records: one per (scope, key), claimed by a lease, answered from `result`.
CREATE TABLE IF NOT EXISTS orderly.idempotency_records (
    scope        TEXT    NOT NULL,
    idem_key     TEXT    NOT NULL,
    payload_hash TEXT    NULL,
    status       TEXT    NOT NULL,
    owner_token  TEXT    NULL,
    attempt      INTEGER NOT NULL,
    lease_until  BIGINT  NOT NULL,
    expires_at   BIGINT  NOT NULL,
    result       TEXT    NULL,
    terminal     BOOLEAN NOT NULL DEFAULT false,
    created_at   BIGINT  NOT NULL,
    updated_at   BIGINT  NOT NULL,
    PRIMARY KEY (scope, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_records_expiry ON orderly.idempotency_records (expires_at);
CREATE INDEX IF NOT EXISTS idempotency_records_stuck ON orderly.idempotency_records (status, lease_until);

-- One-time tokens: issued, then used once.
CREATE TABLE IF NOT EXISTS orderly.one_time_tokens (
    scope      TEXT   NOT NULL,
    token      TEXT   NOT NULL,
    expires_at BIGINT NOT NULL,
    used_at    BIGINT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (scope, token)
);
CREATE INDEX IF NOT EXISTS one_time_tokens_expiry ON orderly.one_time_tokens (expires_at);
