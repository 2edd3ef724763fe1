-- The entity table: one row per order, moved by conditional updates on (status, version).
-- Binary collation: states, events and references compare byte for byte.
CREATE TABLE IF NOT EXISTS orders (
    id         BIGINT       NOT NULL PRIMARY KEY,
    status     VARCHAR(64)  NOT NULL,
    version    BIGINT       NOT NULL DEFAULT 0,
    created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per applied transition. seq is the order's version after the change.
-- UNIQUE (order_id, event, ref_id) is the identity of a request: a twin loses here.
CREATE TABLE IF NOT EXISTS order_transitions (
    order_id     BIGINT       NOT NULL,
    seq          BIGINT       NOT NULL,
    from_status  VARCHAR(64)  NOT NULL,
    to_status    VARCHAR(64)  NOT NULL,
    event        VARCHAR(64)  NOT NULL,
    ref_id       VARCHAR(255) NOT NULL,
    payload_hash CHAR(64)     NULL,
    payload      JSON         NULL,
    created_at   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (order_id, seq),
    UNIQUE KEY order_transitions_request (order_id, event, ref_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
