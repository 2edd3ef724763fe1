-- The entity table: one row per order, moved by conditional updates on (status, version).
CREATE TABLE IF NOT EXISTS orders (
    id         INTEGER PRIMARY KEY,
    status     TEXT    NOT NULL,
    version    INTEGER NOT NULL DEFAULT 0,
    created_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- One row per applied transition. seq is the order's version after the change.
-- UNIQUE (order_id, event, ref_id) is the identity of a request: a twin loses here.
CREATE TABLE IF NOT EXISTS order_transitions (
    order_id     INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    from_status  TEXT    NOT NULL,
    to_status    TEXT    NOT NULL,
    event        TEXT    NOT NULL,
    ref_id       TEXT    NOT NULL,
    payload_hash TEXT    NULL,
    payload      TEXT    NULL,
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (order_id, seq),
    UNIQUE (order_id, event, ref_id)
);
