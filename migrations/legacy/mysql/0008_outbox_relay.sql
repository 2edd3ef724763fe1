-- The relay's columns: a row is claimed by a token under a lease (milliseconds since the
-- epoch), retried at `next_at` with backoff, and ends PUBLISHED or DEAD (with its last
-- error). `body` is the request's own event body, if it attached one (JSON text).
ALTER TABLE outbox
    ADD COLUMN body         MEDIUMTEXT   NULL,
    ADD COLUMN attempts     INT          NOT NULL DEFAULT 0,
    ADD COLUMN owner_token  VARCHAR(64)  NULL,
    ADD COLUMN lease_until  BIGINT       NOT NULL DEFAULT 0,
    ADD COLUMN next_at      BIGINT       NOT NULL DEFAULT 0,
    ADD COLUMN last_error   TEXT         NULL,
    ADD COLUMN published_at BIGINT       NULL;
-- The claim's scan (pending rows that are due), and its test that no earlier event of the
-- entity is still unpublished (PENDING or DEAD).
CREATE INDEX outbox_due ON outbox (status, next_at);
CREATE INDEX outbox_entity_status ON outbox (machine, entity_id, status, version);

-- The consumer's inbox: a message id a consumer has handled, written in the consumer's
-- own transaction, so a redelivery is recognised.
CREATE TABLE IF NOT EXISTS inbox (
    consumer    VARCHAR(128) NOT NULL,
    message_id  VARCHAR(255) NOT NULL,
    received_at BIGINT       NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY inbox_received (received_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
