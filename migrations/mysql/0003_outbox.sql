-- The outbox: one row per event a transition emitted, in the transition's own unit;
-- (machine, entity_id, version) is the event's identity and its order. The inbox: the
-- messages a consumer has taken, by id.
CREATE TABLE IF NOT EXISTS orderly_outbox (
  machine varchar(64) NOT NULL,
  entity_id BIGINT NOT NULL,
  version BIGINT NOT NULL,
  event varchar(64) NOT NULL,
  transition varchar(64) NOT NULL,
  from_status varchar(64) NOT NULL,
  to_status varchar(64) NOT NULL,
  ref_id varchar(255) NOT NULL,
  status varchar(16) NOT NULL DEFAULT 'PENDING',
  created_at timestamp(6) NOT NULL DEFAULT current_timestamp(6),
  body mediumtext NULL,
  attempts INT NOT NULL DEFAULT 0,
  owner_token varchar(64) NULL,
  lease_until BIGINT NOT NULL DEFAULT 0,
  next_at BIGINT NOT NULL DEFAULT 0,
  last_error text NULL,
  published_at BIGINT NULL,
  PRIMARY KEY (machine,entity_id,version),
  KEY outbox_due (status,next_at),
  KEY outbox_entity_status (machine,entity_id,status,version)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

CREATE TABLE IF NOT EXISTS orderly_inbox (
  consumer varchar(128) NOT NULL,
  message_id varchar(255) NOT NULL,
  received_at BIGINT NOT NULL,
  PRIMARY KEY (consumer,message_id),
  KEY inbox_received (received_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
