-- States, events and references compare byte for byte, trailing spaces included
-- (a binary NO PAD collation). Under utf8mb4_bin, which pads, 'Created ' = 'Created' and
-- 'p-1 ' = 'p-1': a corrupt status would pass the update's guard and be written over, and
-- two references would be one request here but two on every other backend.
ALTER TABLE orders
    MODIFY status VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL;

ALTER TABLE order_transitions
    MODIFY from_status VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY to_status   VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY event       VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY ref_id      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL;
