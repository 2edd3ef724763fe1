-- Who asked for a transition and why (support and audit), stored with its history row;
-- not part of the request's identity. NULL when the request did not say.
ALTER TABLE order_transitions
    ADD COLUMN actor  VARCHAR(255) NULL,
    ADD COLUMN reason TEXT NULL;
