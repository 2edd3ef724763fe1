-- The entity table: one row per order, moved by conditional updates on (status, version).
CREATE TABLE IF NOT EXISTS orders (
    id         BIGINT      PRIMARY KEY,
    status     TEXT        NOT NULL,
    version    BIGINT      NOT NULL DEFAULT 0,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per applied transition. seq is the order's version after the change.
-- UNIQUE (order_id, event, ref_id) is the identity of a request: a twin loses here.
CREATE TABLE IF NOT EXISTS order_transitions (
    order_id     BIGINT      NOT NULL,
    seq          BIGINT      NOT NULL,
    from_status  TEXT        NOT NULL,
    to_status    TEXT        NOT NULL,
    event        TEXT        NOT NULL,
    ref_id       TEXT        NOT NULL,
    payload_hash TEXT        NULL,
    payload      JSONB       NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, seq),
    CONSTRAINT order_transitions_request UNIQUE (order_id, event, ref_id)
);
