-- The application's own orders, outbox and timers: the most common names there are.
-- Its orders say 'new' and 'paid', and are born 'new' at version 0.
CREATE TABLE orders (
    id           BIGINT PRIMARY KEY,
    customer     TEXT NOT NULL,
    amount_cents BIGINT NOT NULL,
    status       VARCHAR(32) NOT NULL DEFAULT 'new',
    version      BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE outbox (
    id      BIGSERIAL PRIMARY KEY,
    topic   TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE TABLE timers (
    id      BIGSERIAL PRIMARY KEY,
    name    TEXT NOT NULL,
    fire_at BIGINT NOT NULL
);
INSERT INTO outbox (topic, payload) VALUES ('newsletter', 'the application''s own event');
INSERT INTO timers (name, fire_at) VALUES ('nightly-report', 86400000);
