#!/usr/bin/env bash
# The floor of one transition on PostgreSQL driven by pgbench, a C client (libpq,
# prepared statements): bench/floor.pgbench, one commit per transition, CLIENTS
# connections, TRANSITIONS in all, on orders of its own (ids from 10^12 up, above every id
# the bench's modes use) in the bench's database; then the rows it applied are counted
# and removed. The bench runs it after the engine's lanes at each concurrency (its
# `pgbench …` line); it also runs alone on a database the bench left:
#   bash bench/pgbench-floor.sh [CLIENTS [TRANSITIONS]]     (DB=orderly_bench)
# It prints one line: `pgbench_floor clients=… transitions=… tps=… applied=…`, tps being
# pgbench's own rate without its connection setup. It fails unless every transition
# applied.
set -euo pipefail
cd "$(dirname "$0")"
CLIENTS=${1:-1}
TRANSITIONS=${2:-10000}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
export PGDATABASE=${PGDATABASE:-${DB:-orderly_bench}} PGSSLMODE=${PGSSLMODE:-disable}
export PGOPTIONS="-c client_min_messages=warning"
FIRST=1000000000000
PSQL=(psql -qAt -v ON_ERROR_STOP=1)
per_client=$(( (TRANSITIONS + CLIENTS - 1) / CLIENTS ))
TRANSITIONS=$(( per_client * CLIENTS ))
clean() {
  "${PSQL[@]}" -c "DELETE FROM orderly.transitions WHERE order_id >= $FIRST" \
    -c "DELETE FROM orders WHERE id >= $FIRST" -c "DROP SEQUENCE IF EXISTS pgbench_ids"
}
clean
trap clean EXIT
"${PSQL[@]}" -c "INSERT INTO orders (id, status, version) SELECT g, 'Created', 0 FROM generate_series($FIRST, $FIRST + $TRANSITIONS - 1) g" \
  -c "CREATE SEQUENCE pgbench_ids START $FIRST" -c "ANALYZE orders"
jobs=$(( CLIENTS < 2 ? CLIENTS : 2 ))
out=$(pgbench -n -M prepared -c "$CLIENTS" -j "$jobs" -t "$per_client" -f floor.pgbench 2>&1) \
  || { echo "pgbench failed: $out" >&2; exit 1; }
tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) .*/\1/p' | head -1)
[ -n "$tps" ] || { echo "pgbench printed no rate: $out" >&2; exit 1; }
applied=$("${PSQL[@]}" -c "SELECT count(*) FROM orderly.transitions WHERE order_id >= $FIRST")
if [ "$applied" != "$TRANSITIONS" ]; then
  echo "pgbench applied $applied of $TRANSITIONS transitions" >&2
  exit 1
fi
echo "pgbench_floor clients=$CLIENTS transitions=$TRANSITIONS tps=$tps applied=$applied"
