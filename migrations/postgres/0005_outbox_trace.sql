-- The trace context (W3C traceparent and tracestate) of the request whose transition
-- wrote the event, written in the same statement, for the relay to send with it.
ALTER TABLE orderly.outbox ADD COLUMN IF NOT EXISTS traceparent TEXT NULL;
ALTER TABLE orderly.outbox ADD COLUMN IF NOT EXISTS tracestate TEXT NULL;
