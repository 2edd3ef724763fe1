-- The application's own first migration: its refunds, with business columns.
CREATE TABLE refunds (
    id BIGINT PRIMARY KEY,
    payment_ref TEXT NOT NULL,
    amount_cents BIGINT NOT NULL,
    currency CHAR(3) NOT NULL,
    status VARCHAR(32) NOT NULL,
    version INTEGER NOT NULL
);
