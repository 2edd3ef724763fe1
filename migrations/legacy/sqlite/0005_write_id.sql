-- The write id of the call that recorded a transition: a random number chosen per call.
-- When a connection fails at or after a write, the read-back tells this call's own write
-- (`Applied`) from an earlier call's (`Replayed`) by it. NULL on rows written before.
ALTER TABLE order_transitions ADD COLUMN write_id INTEGER NULL;
