-- Idempotency records: one row per (scope, idem_key), claimed, completed or failed.
-- Times are milliseconds since the epoch, from the database clock only. Scopes, keys,
-- statuses and tokens compare byte for byte (a binary NO PAD collation).
CREATE TABLE IF NOT EXISTS idempotency_records (
    scope        VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    idem_key     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    payload_hash CHAR(64)     NULL,
    -- PROCESSING (claimed, under a lease), SUCCEEDED or FAILED.
    status       VARCHAR(16)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    -- The holder's token while PROCESSING; every later write is conditional on it.
    owner_token  VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NULL,
    attempt      INT          NOT NULL,
    lease_until  BIGINT       NOT NULL,
    -- Past this the record counts as absent, and a purge may delete it.
    expires_at   BIGINT       NOT NULL,
    -- The stored result or failure, JSON text kept byte for byte.
    result       LONGTEXT     NULL,
    -- A FAILED record that is replayed rather than claimed again.
    terminal     BOOLEAN      NOT NULL DEFAULT FALSE,
    created_at   BIGINT       NOT NULL,
    updated_at   BIGINT       NOT NULL,
    PRIMARY KEY (scope, idem_key),
    KEY idempotency_records_stuck (status, lease_until),
    KEY idempotency_records_expiry (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
