#!/usr/bin/env bash
# Guarded transitions on PostgreSQL, driven by pgbench (a C client, so that the server's
# side is what is compared): each in a unit of its own (what orderly does), against eight
# in one unit with a savepoint each (the alternative for coalesced units). Tables of its
# own (pgb_*) in the bench database; each run starts from fresh orders.
#   bash bench/pgbench-guarded.sh        (DB=orderly_bench, SECONDS_PER_RUN=5)
set -euo pipefail
cd "$(dirname "$0")"
DB=${DB:-orderly_bench}
export PGSSLMODE=${PGSSLMODE:-disable}
export PGOPTIONS="-c client_min_messages=warning"
PSQL=(psql -h 127.0.0.1 -U postgres -d "$DB" -qAt)
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
ORDERS=${ORDERS:-600000}
reset() {
  "${PSQL[@]}" -c "DROP TABLE IF EXISTS pgb_orders, pgb_due, pgb_ledger, pgb_history" \
    -c "CREATE TABLE pgb_orders (id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL)" \
    -c "CREATE TABLE pgb_due (id BIGINT PRIMARY KEY, due BIGINT NOT NULL)" \
    -c "CREATE TABLE pgb_ledger (order_id BIGINT PRIMARY KEY, amount BIGINT NOT NULL)" \
    -c "CREATE TABLE pgb_history (order_id BIGINT, seq BIGINT, event TEXT, ref_id TEXT, PRIMARY KEY (order_id, seq), UNIQUE (order_id, event, ref_id))" \
    -c "INSERT INTO pgb_orders SELECT i, 'Created', 0 FROM generate_series(1, $ORDERS) i" \
    -c "INSERT INTO pgb_due SELECT i, 100 FROM generate_series(1, $ORDERS) i" \
    -c "DROP SEQUENCE IF EXISTS pgb_ids" -c "CREATE SEQUENCE pgb_ids" \
    -c "VACUUM ANALYZE pgb_orders, pgb_due"
}
for c in 8 32; do
  for form in alone savepoints; do
    reset
    pgbench -h 127.0.0.1 -U postgres -n -M prepared -f "guarded-$form.pgbench" -c "$c" -j 2 \
      -T "$SECONDS_PER_RUN" "$DB" > /dev/null 2>&1
    applied=$("${PSQL[@]}" -c "SELECT count(*) FROM pgb_history h JOIN pgb_orders o ON o.id = h.order_id AND o.version = 1")
    echo "pgbench guarded c=$c form=$form applied=$applied per_s=$(( applied / SECONDS_PER_RUN ))"
  done
done
"${PSQL[@]}" -c "DROP TABLE IF EXISTS pgb_orders, pgb_due, pgb_ledger, pgb_history" -c "DROP SEQUENCE IF EXISTS pgb_ids"
