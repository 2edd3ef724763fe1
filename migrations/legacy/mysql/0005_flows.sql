-- Flows: one row per (kind, flow_key), and one row per step execution and per
-- compensation. Times are milliseconds since the epoch, from the database clock only.
-- Kinds, keys, statuses and tokens compare byte for byte (a binary NO PAD collation).
CREATE TABLE IF NOT EXISTS flows (
    kind         VARCHAR(64)  NOT NULL,
    flow_key     VARCHAR(255) NOT NULL,
    -- The definition's version: a runner that does not know it leaves the flow alone.
    version      INT          NOT NULL,
    input_hash   CHAR(64)     NOT NULL,
    -- The input, JSON text, read back by whoever resumes the flow.
    input        LONGTEXT     NOT NULL,
    -- RUNNING, COMPENSATING, COMPLETED or COMPENSATED.
    status       VARCHAR(16)  NOT NULL,
    -- Set while the flow is parked (NEEDS_RECONCILIATION, COMPENSATION_FAILED,
    -- ATTEMPTS_EXHAUSTED, FAILED_PAST_PIVOT): nothing runs it until an operator resumes it.
    park_reason  VARCHAR(32)  NULL,
    -- The step being run (RUNNING), or the step that failed (COMPENSATING).
    step_at      INT          NOT NULL,
    -- The holder's token; every write of a runner is conditional on it.
    owner_token  VARCHAR(64)  NOT NULL,
    -- Claims since the flow last made progress.
    attempt      INT          NOT NULL,
    -- The lease, and the next run time: past it, the recovery job claims the flow.
    lease_until  BIGINT       NOT NULL,
    -- COMPLETED: the steps' outputs; COMPENSATED: the failed step and its error (JSON).
    output       LONGTEXT     NULL,
    last_error   TEXT         NULL,
    created_at   BIGINT       NOT NULL,
    updated_at   BIGINT       NOT NULL,
    PRIMARY KEY (kind, flow_key),
    KEY flows_due (kind, version, lease_until)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

CREATE TABLE IF NOT EXISTS flow_steps (
    kind           VARCHAR(64)  NOT NULL,
    flow_key       VARCHAR(255) NOT NULL,
    step_index     INT          NOT NULL,
    -- F: the step's forward action; C: its compensation.
    phase          CHAR(1)      NOT NULL,
    name           VARCHAR(64)  NOT NULL,
    -- STARTED (its effect may be under way), RETRY (failed, to be run again), SUCCEEDED,
    -- FAILED (given up).
    status         VARCHAR(16)  NOT NULL,
    attempt        INT          NOT NULL,
    -- The idempotency key a keyed or unsafe call was made with.
    downstream_key VARCHAR(400) NULL,
    -- The token of the runner that wrote the row last.
    owner_token    VARCHAR(64)  NOT NULL,
    output         LONGTEXT     NULL,
    error          TEXT         NULL,
    started_at     BIGINT       NOT NULL,
    finished_at    BIGINT       NULL,
    PRIMARY KEY (kind, flow_key, step_index, phase)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
