-- One-time tokens: issued by the server before a request, consumed once.
-- Times are milliseconds since the epoch, from the database clock only.
CREATE TABLE IF NOT EXISTS one_time_tokens (
    scope      VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    token      VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    -- Past this the token is rejected, and a purge may delete it.
    expires_at BIGINT      NOT NULL,
    -- When it was consumed; NULL while unused.
    used_at    BIGINT      NULL,
    created_at BIGINT      NOT NULL,
    PRIMARY KEY (scope, token),
    KEY one_time_tokens_expiry (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
