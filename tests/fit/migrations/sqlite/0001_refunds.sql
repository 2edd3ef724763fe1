-- The application's own first migration: its refunds, with business columns.
CREATE TABLE refunds (
    id INTEGER PRIMARY KEY,
    payment_ref TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    currency TEXT NOT NULL,
    status TEXT NOT NULL,
    version INTEGER NOT NULL
);
