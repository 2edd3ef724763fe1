-- Flows: one row per (kind, key), and one per step and phase it ran.
CREATE TABLE IF NOT EXISTS orderly_flows (
  kind varchar(64) NOT NULL,
  flow_key varchar(255) NOT NULL,
  version INT NOT NULL,
  input_hash char(64) NOT NULL,
  input longtext NOT NULL,
  status varchar(16) NOT NULL,
  park_reason varchar(32) NULL,
  step_at INT NOT NULL,
  owner_token varchar(64) NOT NULL,
  attempt INT NOT NULL,
  lease_until BIGINT NOT NULL,
  output longtext NULL,
  last_error text NULL,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (kind,flow_key),
  KEY flows_due (kind,version,lease_until)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

CREATE TABLE IF NOT EXISTS orderly_flow_steps (
  kind varchar(64) NOT NULL,
  flow_key varchar(255) NOT NULL,
  step_index INT NOT NULL,
  phase char(1) NOT NULL,
  name varchar(64) NOT NULL,
  status varchar(16) NOT NULL,
  attempt INT NOT NULL,
  downstream_key varchar(400) NULL,
  owner_token varchar(64) NOT NULL,
  output longtext NULL,
  error text NULL,
  started_at BIGINT NOT NULL,
  finished_at BIGINT NULL,
  PRIMARY KEY (kind,flow_key,step_index,phase)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
