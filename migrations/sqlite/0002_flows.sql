-- Flows: one row per (kind, key), and one per step and phase it ran.
CREATE TABLE IF NOT EXISTS orderly_flows (
    kind         TEXT    NOT NULL,
    flow_key     TEXT    NOT NULL,
    -- The definition's version: a runner that does not know it leaves the flow alone.
    version      INTEGER NOT NULL,
    input_hash   TEXT    NOT NULL,
    -- The input, JSON text, read back by whoever resumes the flow.
    input        TEXT    NOT NULL,
    -- RUNNING, COMPENSATING, COMPLETED or COMPENSATED.
    status       TEXT    NOT NULL,
    -- Set while the flow is parked (NEEDS_RECONCILIATION, COMPENSATION_FAILED,
    -- ATTEMPTS_EXHAUSTED, FAILED_PAST_PIVOT): nothing runs it until an operator resumes it.
    park_reason  TEXT    NULL,
    -- The step being run (RUNNING), or the step that failed (COMPENSATING).
    step_at      INTEGER NOT NULL,
    -- The holder's token; every write of a runner is conditional on it.
    owner_token  TEXT    NOT NULL,
    -- Claims since the flow last made progress.
    attempt      INTEGER NOT NULL,
    -- The lease, and the next run time: past it, the recovery job claims the flow.
    lease_until  INTEGER NOT NULL,
    -- COMPLETED: the steps' outputs; COMPENSATED: the failed step and its error (JSON).
    output       TEXT    NULL,
    last_error   TEXT    NULL,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (kind, flow_key)
);
CREATE INDEX IF NOT EXISTS orderly_flows_due ON orderly_flows (kind, version, lease_until);

CREATE TABLE IF NOT EXISTS orderly_flow_steps (
    kind           TEXT    NOT NULL,
    flow_key       TEXT    NOT NULL,
    step_index     INTEGER NOT NULL,
    -- F: the step's forward action; C: its compensation.
    phase          TEXT    NOT NULL,
    name           TEXT    NOT NULL,
    -- STARTED (its effect may be under way), RETRY (failed, to be run again), SUCCEEDED,
    -- FAILED (given up).
    status         TEXT    NOT NULL,
    attempt        INTEGER NOT NULL,
    -- The idempotency key a keyed or unsafe call was made with.
    downstream_key TEXT    NULL,
    -- The token of the runner that wrote the row last.
    owner_token    TEXT    NOT NULL,
    output         TEXT    NULL,
    error          TEXT    NULL,
    started_at     INTEGER NOT NULL,
    finished_at    INTEGER NULL,
    PRIMARY KEY (kind, flow_key, step_index, phase)
);
