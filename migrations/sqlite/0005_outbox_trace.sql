-- The trace context (W3C traceparent and tracestate) of the request whose transition
-- wrote the event, written in the same statement, for the relay to send with it.
ALTER TABLE orderly_outbox ADD COLUMN traceparent TEXT NULL;
ALTER TABLE orderly_outbox ADD COLUMN tracestate TEXT NULL;
