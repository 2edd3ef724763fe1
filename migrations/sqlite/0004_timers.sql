-- Timers: one row per armed timer, fired once by the timer job. The operators'
-- actions, one row each.
CREATE TABLE IF NOT EXISTS orderly_timers (
    id          INTEGER PRIMARY KEY,
    machine     TEXT   NOT NULL,
    entity_id   INTEGER NOT NULL,
    event       TEXT   NOT NULL,
    ref_id      TEXT   NOT NULL,
    state       TEXT    NULL,
    version     INTEGER NULL,
    -- When it is due, and when it is next tried (later than `due_at` after a failure).
    due_at      INTEGER NOT NULL,
    next_at     INTEGER NOT NULL,
    -- PENDING until it fires (FIRED, with its outcome: applied, replayed, moot, refused),
    -- is cancelled (CANCELLED), or is set aside after failing (DEAD, with its last error).
    status      TEXT   NOT NULL DEFAULT 'PENDING',
    outcome     TEXT    NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    owner_token TEXT    NULL,
    lease_until INTEGER NOT NULL DEFAULT 0,
    last_error  TEXT    NULL,
    fired_at    INTEGER NULL,
    created_at  INTEGER NOT NULL,
    UNIQUE (machine, entity_id, event, ref_id)
);
CREATE INDEX IF NOT EXISTS orderly_timers_due ON orderly_timers (status, next_at);
CREATE INDEX IF NOT EXISTS orderly_timers_entity ON orderly_timers (machine, entity_id, status, due_at);

CREATE TABLE IF NOT EXISTS orderly_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms    INTEGER NOT NULL,
    who      TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    target   TEXT    NOT NULL,
    affected INTEGER NOT NULL
);
