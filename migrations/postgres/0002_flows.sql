-- Flows: one row per (kind, key), and one per step and phase it ran.
CREATE TABLE IF NOT EXISTS orderly.flows (
    kind        TEXT    NOT NULL,
    flow_key    TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    input_hash  TEXT    NOT NULL,
    input       TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    park_reason TEXT    NULL,
    step_at     INTEGER NOT NULL,
    owner_token TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    lease_until BIGINT  NOT NULL,
    output      TEXT    NULL,
    last_error  TEXT    NULL,
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL,
    PRIMARY KEY (kind, flow_key)
);
CREATE INDEX IF NOT EXISTS flows_due ON orderly.flows (kind, version, lease_until);

CREATE TABLE IF NOT EXISTS orderly.flow_steps (
    kind           TEXT    NOT NULL,
    flow_key       TEXT    NOT NULL,
    step_index     INTEGER NOT NULL,
    phase          TEXT    NOT NULL,
    name           TEXT    NOT NULL,
    status         TEXT    NOT NULL,
    attempt        INTEGER NOT NULL,
    downstream_key TEXT    NULL,
    owner_token    TEXT    NOT NULL,
    output         TEXT    NULL,
    error          TEXT    NULL,
    started_at     BIGINT  NOT NULL,
    finished_at    BIGINT  NULL,
    PRIMARY KEY (kind, flow_key, step_index, phase)
);
