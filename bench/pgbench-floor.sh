#!/usr/bin/env bash
# Re-measures the floor with pgbench on the database the bench example leaves behind:
#   cargo run --release --all-features --example bench -- --backend postgres
#   bash bench/pgbench-floor.sh
# Each concurrency starts from all orders at Created and an empty bench history.
set -euo pipefail
cd "$(dirname "$0")"
DB=${DB:-orderly_bench}
# The bench's connections are plaintext (orderly enables no TLS backend of sqlx); libpq
# would otherwise negotiate TLS (sslmode=prefer). Compare like with like.
export PGSSLMODE=${PGSSLMODE:-disable}
PSQL=(psql -h 127.0.0.1 -U postgres -d "$DB" -qAt)
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
for c in 1 8 32; do
  "${PSQL[@]}" -c "DELETE FROM order_transitions WHERE order_id > 0" \
               -c "UPDATE orders SET status = 'Created', version = 0 WHERE version <> 0" \
               -c "DROP SEQUENCE IF EXISTS bench_ids" -c "CREATE SEQUENCE bench_ids" \
               -c "VACUUM ANALYZE orders, order_transitions"
  tps=$(pgbench -h 127.0.0.1 -U postgres -n -M prepared -f floor.pgbench -c "$c" -j "$(( c < 2 ? 1 : 2 ))" \
          -T "$SECONDS_PER_RUN" "$DB" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  applied=$("${PSQL[@]}" -c "SELECT count(*) FROM order_transitions WHERE order_id > 0")
  echo "pgbench floor c=$c tps=$tps applied=$applied"
done
