-- Timers: one row per armed timer, fired once by the timer job.
CREATE TABLE IF NOT EXISTS orderly.timers (
    id          BIGSERIAL PRIMARY KEY,
    machine     TEXT    NOT NULL,
    entity_id   BIGINT  NOT NULL,
    event       TEXT    NOT NULL,
    ref_id      TEXT    NOT NULL,
    state       TEXT    NULL,
    version     BIGINT  NULL,
    due_at      BIGINT  NOT NULL,
    next_at     BIGINT  NOT NULL,
    status      TEXT    NOT NULL DEFAULT 'PENDING',
    outcome     TEXT    NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    owner_token TEXT    NULL,
    lease_until BIGINT  NOT NULL DEFAULT 0,
    last_error  TEXT    NULL,
    fired_at    BIGINT  NULL,
    created_at  BIGINT  NOT NULL,
    UNIQUE (machine, entity_id, event, ref_id)
);
CREATE INDEX IF NOT EXISTS timers_due ON orderly.timers (status, next_at);
CREATE INDEX IF NOT EXISTS timers_entity ON orderly.timers (machine, entity_id, status, due_at);

-- The operators' actions, one row each.
CREATE TABLE IF NOT EXISTS orderly.audit (
    id       BIGSERIAL PRIMARY KEY,
    at_ms    BIGINT NOT NULL,
    who      TEXT   NOT NULL,
    action   TEXT   NOT NULL,
    target   TEXT   NOT NULL,
    affected BIGINT NOT NULL
);
