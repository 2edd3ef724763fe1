-- The timers whose due time is no time (a row written by hand, or corrupted), found
-- by the timer job's claim on two ranges of this index rather than by reading every
-- pending timer.
ALTER TABLE orderly_timers ADD INDEX IF NOT EXISTS timers_no_time (machine, status, due_at);
