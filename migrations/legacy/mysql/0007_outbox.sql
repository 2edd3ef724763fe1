-- The outbox: one row per event emitted by a transition, written in the same transaction
-- as the transition, so a state change without its event (or an event without its state
-- change) cannot commit. (machine, entity_id, version) is the event's identity: the
-- entity's version after the transition orders its events, and names the message.
CREATE TABLE IF NOT EXISTS outbox (
    machine      VARCHAR(64)  NOT NULL,
    entity_id    BIGINT       NOT NULL,
    version      BIGINT       NOT NULL,
    -- The domain event (the edge's `emits`), and the transition that emitted it.
    event        VARCHAR(64)  NOT NULL,
    transition   VARCHAR(64)  NOT NULL,
    from_status  VARCHAR(64)  NOT NULL,
    to_status    VARCHAR(64)  NOT NULL,
    ref_id       VARCHAR(255) NOT NULL,
    -- PENDING until published.
    status       VARCHAR(16)  NOT NULL DEFAULT 'PENDING',
    created_at   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (machine, entity_id, version)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
