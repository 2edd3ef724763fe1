-- The history: one row per applied transition. seq is the entity's version after the
-- change; UNIQUE (order_id, event, ref_id) is the identity of a request: a twin loses
-- here. States, events and references compare byte for byte (a binary NO PAD collation).
-- The entity table is the application's own: no migration here creates or alters it.
CREATE TABLE IF NOT EXISTS orderly_transitions (
  order_id BIGINT NOT NULL,
  seq BIGINT NOT NULL,
  from_status varchar(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
  to_status varchar(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
  event varchar(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
  ref_id varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
  payload_hash char(64) NULL,
  payload JSON NULL,
  created_at timestamp(6) NOT NULL DEFAULT current_timestamp(6),
  write_id BIGINT NULL,
  actor varchar(255) NULL,
  reason text NULL,
  PRIMARY KEY (order_id,seq),
  UNIQUE KEY transitions_request (order_id,event,ref_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS orderly_idempotency_records (
  scope varchar(64) NOT NULL,
  idem_key varchar(255) NOT NULL,
  payload_hash char(64) NULL,
  status varchar(16) NOT NULL,
  owner_token varchar(64) NULL,
  attempt INT NOT NULL,
  lease_until BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,
  result longtext NULL,
  terminal TINYINT(1) NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (scope,idem_key),
  KEY idempotency_records_stuck (status,lease_until),
  KEY idempotency_records_expiry (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

CREATE TABLE IF NOT EXISTS orderly_one_time_tokens (
  scope varchar(64) NOT NULL,
  token varchar(64) NOT NULL,
  expires_at BIGINT NOT NULL,
  used_at BIGINT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (scope,token),
  KEY one_time_tokens_expiry (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
