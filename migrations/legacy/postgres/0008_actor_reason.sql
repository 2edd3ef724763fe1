-- Who asked for a transition and why (support and audit), stored with its history row;
-- not part of the request's identity. NULL when the request did not say.
ALTER TABLE order_transitions
    ADD COLUMN IF NOT EXISTS actor  TEXT NULL,
    ADD COLUMN IF NOT EXISTS reason TEXT NULL;
