-- The outbox: one row per event a transition emitted, in the transition's own unit;
-- (machine, entity_id, version) is the event's identity and its order. The inbox: the
-- messages a consumer has taken, by id.
CREATE TABLE IF NOT EXISTS orderly_outbox (
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
    body         TEXT    NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    owner_token  TEXT    NULL,
    lease_until  INTEGER NOT NULL DEFAULT 0,
    next_at      INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT    NULL,
    published_at INTEGER NULL,
    PRIMARY KEY (machine, entity_id, version)
);
CREATE INDEX IF NOT EXISTS orderly_outbox_due ON orderly_outbox (status, next_at);
CREATE INDEX IF NOT EXISTS orderly_outbox_entity_status ON orderly_outbox (machine, entity_id, status, version);

CREATE TABLE IF NOT EXISTS orderly_inbox (
    consumer    TEXT    NOT NULL,
    message_id  TEXT    NOT NULL,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS orderly_inbox_received ON orderly_inbox (received_at);
