-- The operators' audit trail: every action the admin page takes (requeue, resume,
-- rearm, cancel), who took it, on what (or which filter), how many things it changed,
-- and when (the database's clock, in milliseconds since the epoch).
CREATE TABLE IF NOT EXISTS orderly_audit (
    id       BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at_ms    BIGINT       NOT NULL,
    who      VARCHAR(255) NOT NULL,
    action   VARCHAR(64)  NOT NULL,
    target   TEXT         NOT NULL,
    affected BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
