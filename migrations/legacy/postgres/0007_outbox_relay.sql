-- The relay's columns: a row is claimed by a token under a lease (milliseconds since the
-- epoch), retried at `next_at` with backoff, and ends PUBLISHED or DEAD (with its last
-- error). `body` is the request's own event body, if it attached one (JSON text).
ALTER TABLE outbox ADD COLUMN body         TEXT   NULL;
ALTER TABLE outbox ADD COLUMN attempts     INT    NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN owner_token  TEXT   NULL;
ALTER TABLE outbox ADD COLUMN lease_until  BIGINT NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN next_at      BIGINT NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN last_error   TEXT   NULL;
ALTER TABLE outbox ADD COLUMN published_at BIGINT NULL;
-- The claim's scan (pending rows that are due), and its test that no earlier event of the
-- entity is still unpublished (PENDING or DEAD).
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (status, next_at);
-- Room on each page for the claim's update (token, lease, attempts: no indexed column)
-- to stay on its page (a HOT update, no new index entries).
ALTER TABLE outbox SET (fillfactor = 70);
CREATE INDEX IF NOT EXISTS outbox_entity_status ON outbox (machine, entity_id, status, version);

-- The consumer's inbox: a message id a consumer has handled, written in the consumer's
-- own transaction, so a redelivery is recognised.
CREATE TABLE IF NOT EXISTS inbox (
    consumer    TEXT   NOT NULL,
    message_id  TEXT   NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_received ON inbox (received_at);
