-- The outbox: one row per event a transition emitted, written in the transition's own
-- statement. (machine, entity_id, version) is the event's identity and its order.
-- Rows are updated in place as they are claimed and published: room on each page for
-- the new versions keeps those updates on the page (HOT).
CREATE TABLE IF NOT EXISTS orderly.outbox (
    machine     TEXT        NOT NULL,
    entity_id   BIGINT      NOT NULL,
    version     BIGINT      NOT NULL,
    event       TEXT        NOT NULL,
    transition  TEXT        NOT NULL,
    from_status TEXT        NOT NULL,
    to_status   TEXT        NOT NULL,
    ref_id      TEXT        NOT NULL,
    status      TEXT        NOT NULL DEFAULT 'PENDING',
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    body        TEXT        NULL,
    attempts    INTEGER     NOT NULL DEFAULT 0,
    owner_token TEXT        NULL,
    lease_until BIGINT      NOT NULL DEFAULT 0,
    next_at     BIGINT      NOT NULL DEFAULT 0,
    last_error  TEXT        NULL,
    published_at BIGINT     NULL,
    PRIMARY KEY (machine, entity_id, version)
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS outbox_due ON orderly.outbox (status, next_at);
CREATE INDEX IF NOT EXISTS outbox_entity_status ON orderly.outbox (machine, entity_id, status, version);

-- The inbox: the messages a consumer has taken, by id.
CREATE TABLE IF NOT EXISTS orderly.inbox (
    consumer    TEXT   NOT NULL,
    message_id  TEXT   NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_received ON orderly.inbox (received_at);
