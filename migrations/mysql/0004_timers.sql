-- Timers: one row per armed timer, fired once by the timer job. The operators'
-- actions, one row each.
CREATE TABLE IF NOT EXISTS orderly_timers (
  id BIGINT NOT NULL AUTO_INCREMENT,
  machine varchar(64) NOT NULL,
  entity_id BIGINT NOT NULL,
  event varchar(64) NOT NULL,
  ref_id varchar(255) NOT NULL,
  state varchar(64) NULL,
  version BIGINT NULL,
  due_at BIGINT NOT NULL,
  next_at BIGINT NOT NULL,
  status varchar(16) NOT NULL DEFAULT 'PENDING',
  outcome varchar(16) NULL,
  attempts INT NOT NULL DEFAULT 0,
  owner_token varchar(64) NULL,
  lease_until BIGINT NOT NULL DEFAULT 0,
  last_error text NULL,
  fired_at BIGINT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY timers_identity (machine,entity_id,event,ref_id),
  KEY timers_due (status,next_at),
  KEY timers_entity (machine,entity_id,status,due_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

CREATE TABLE IF NOT EXISTS orderly_audit (
  id BIGINT NOT NULL AUTO_INCREMENT,
  at_ms BIGINT NOT NULL,
  who varchar(255) NOT NULL,
  action varchar(64) NOT NULL,
  target text NOT NULL,
  affected BIGINT NOT NULL,
  PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
