-- The outbox: one row per event emitted by a transition, written in the same transaction
-- as the transition, so a state change without its event (or an event without its state
-- change) cannot commit. (machine, entity_id, version) is the event's identity: the
-- entity's version after the transition orders its events, and names the message.
CREATE TABLE IF NOT EXISTS outbox (
    machine      TEXT        NOT NULL,
    entity_id    INTEGER     NOT NULL,
    version      INTEGER     NOT NULL,
    -- The domain event (the edge's `emits`), and the transition that emitted it.
    event        TEXT        NOT NULL,
    transition   TEXT        NOT NULL,
    from_status  TEXT        NOT NULL,
    to_status    TEXT        NOT NULL,
    ref_id       TEXT        NOT NULL,
    -- PENDING until published.
    status       TEXT        NOT NULL DEFAULT 'PENDING',
    created_at   TEXT        NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (machine, entity_id, version)
);
