-- One-time tokens: issued by the server before a request, consumed once.
-- Times are milliseconds since the epoch, from the database clock only.
CREATE TABLE IF NOT EXISTS one_time_tokens (
    scope      TEXT   NOT NULL,
    token      TEXT   NOT NULL,
    -- Past this the token is rejected, and a purge may delete it.
    expires_at BIGINT NOT NULL,
    -- When it was consumed; NULL while unused.
    used_at    BIGINT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (scope, token)
);
CREATE INDEX IF NOT EXISTS one_time_tokens_expiry ON one_time_tokens (expires_at);
