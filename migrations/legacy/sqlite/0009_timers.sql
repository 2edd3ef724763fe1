-- Timers: an event scheduled for an entity, fired once through the engine by the timer
-- job. A state's timer is written in the same unit as the move (or the create) that
-- entered the state, with `state` and `version` the entity's state and version after it,
-- and `ref_id` = 'timer:{state}:{version}'; one scheduled by hand has neither. Times are
-- the database's clock, in milliseconds since the epoch.
CREATE TABLE IF NOT EXISTS timers (
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
-- The claim's scan (pending timers that are due), and its test that no earlier timer of
-- the entity is still pending.
CREATE INDEX IF NOT EXISTS timers_due ON timers (status, next_at);
CREATE INDEX IF NOT EXISTS timers_entity ON timers (machine, entity_id, status, due_at);
