#!/usr/bin/env bash
# A throwaway PostgreSQL 15 high-availability pair on 127.0.0.1, for the failover suite:
# one etcd, two PostgreSQL instances under Patroni with synchronous replication, and one
# HAProxy endpoint that follows the primary through Patroni's REST check.
#
#   .ci/patroni.sh start            bring it all up (idempotent), print the endpoint's URL
#   .ci/patroni.sh stop             stop what this script started (data is kept)
#   .ci/patroni.sh primary          the name of the node that holds the leader lock (n1, n2)
#   .ci/patroni.sh kill-postgres N  SIGKILL node N's postmaster and its backends
#   .ci/patroni.sh kill-node N      SIGKILL node N's Patroni, then its postmaster
#   .ci/patroni.sh restart N        start node N's Patroni again, wait until it streams
#   .ci/patroni.sh status           Patroni's view of the cluster (JSON); exit 0 only with a
#                                   running leader and a running sync standby
#   .ci/patroni.sh diagnose         print the cluster's view and the end of every log (stderr)
#   .ci/patroni.sh url              print the endpoint's URL
#   .ci/patroni.sh clean            stop, then delete $ORDERLY_PATRONI_DIR
#
# Progress goes to stderr, so `url=$(.ci/patroni.sh start)` captures only the URL.
#
# The system PostgreSQL (5432) is never touched: the nodes have their own data
# directories, ports and sockets. A pid is signalled only if this script recorded it and
# its command line still names this cluster's files (pids get reused). Patroni runs as
# the `postgres` user (initdb and postgres refuse root).
#
# Environment:
#   ORDERLY_PATRONI_DIR   base directory (default /tmp/orderly-patroni)
#   ORDERLY_PATRONI_PORT  the endpoint's port (default 15430); node N's PostgreSQL listens
#                         on +N, its REST API on 18007+N; etcd on 23790 and 23800. All
#                         below the kernel's ephemeral range (32768-60999): a port in it
#                         can be taken by any outgoing connection of an earlier step (the
#                         Galera cluster's left HAProxy unable to bind once)
#   ORDERLY_PATRONI_TIMEOUT  seconds to wait for the cluster (default 90)
set -euo pipefail

BASE=${ORDERLY_PATRONI_DIR:-/tmp/orderly-patroni}
PORT=${ORDERLY_PATRONI_PORT:-15430}
TIMEOUT=${ORDERLY_PATRONI_TIMEOUT:-90}
ETCD_CLIENT=23790
ETCD_PEER=23800
BIN=/usr/lib/postgresql/15/bin
MARKER=.orderly-patroni
NODES=(1 2)

log() { printf 'patroni: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# What the cluster says, and the end of every log, on stderr: what a failed start leaves
# for the reader, before a clean deletes the files.
diagnose() {
  local n f
  for n in "${NODES[@]}"; do
    log "n$n /cluster: $(rest "$n" /cluster 2>/dev/null || echo unreachable)"
  done
  for f in "$BASE"/etcd.log "$BASE"/n1.log "$BASE"/n2.log "$BASE"/haproxy.log; do
    [ -f "$f" ] || continue
    log "--- the end of $f"
    tail -n 40 "$f" >&2 || true
  done
}
fail() { log "ERROR: $*"; diagnose; exit 1; }

pg_port() { echo $((PORT + $1)); }
rest_port() { echo $((18007 + $1)); }
node_dir() { echo "$BASE/n$1"; }
url() { echo "postgres://postgres@127.0.0.1:$PORT/postgres"; }

ensure_packages() {
  local want=()
  command -v patroni >/dev/null 2>&1 || want+=(patroni)
  command -v etcd >/dev/null 2>&1 || want+=(etcd-server)
  command -v haproxy >/dev/null 2>&1 || want+=(haproxy)
  command -v curl >/dev/null 2>&1 || want+=(curl)
  command -v ss >/dev/null 2>&1 || want+=(iproute2)
  [ -x "$BIN/postgres" ] || want+=(postgresql-15)
  if [ "${#want[@]}" -eq 0 ]; then return 0; fi
  log "installing ${want[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >&2
}

# --- pids ------------------------------------------------------------------------------

# The pid recorded in $1, if that process is alive and its command line names $2.
live_pid() {
  local file=$1 needle=$2 pid
  [ -f "$file" ] || return 1
  pid=$(cat "$file")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$needle" || return 1
  echo "$pid"
}

postmaster_pid() {
  local data
  data="$(node_dir "$1")/data"
  [ -f "$data/postmaster.pid" ] || return 1
  local pid
  pid=$(head -1 "$data/postmaster.pid")
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$data" || return 1
  echo "$pid"
}

stop_pid() {
  local pid=$1 name=$2 i
  log "$name: stopping pid $pid"
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# --- configuration ---------------------------------------------------------------------

write_config() {
  local n=$1 dir
  dir=$(node_dir "$n")
  install -d -o postgres -g postgres -m 0700 "$dir"
  cat > "$BASE/n$n.yml" <<EOF
scope: orderly
namespace: /orderly/
name: n$n
restapi:
  listen: 127.0.0.1:$(rest_port "$n")
  connect_address: 127.0.0.1:$(rest_port "$n")
etcd3:
  hosts: 127.0.0.1:$ETCD_CLIENT
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    primary_start_timeout: 0
    synchronous_mode: true
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 200
  initdb:
  - encoding: UTF8
  - locale: C
  - data-checksums
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$(pg_port "$n")
  connect_address: 127.0.0.1:$(pg_port "$n")
  data_dir: $dir/data
  bin_dir: $BIN
  pgpass: $dir/pgpass
  use_pg_rewind: true
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser: {username: postgres, password: postgres}
    replication: {username: replicator, password: replicator}
    rewind: {username: rewinder, password: rewinder}
  parameters:
    unix_socket_directories: $dir
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
EOF
  chmod 0644 "$BASE/n$n.yml"
}

write_haproxy() {
  cat > "$BASE/haproxy.cfg" <<EOF
global
    maxconn 400
defaults
    mode tcp
    retries 2
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s
listen primary
    bind 127.0.0.1:$PORT
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 500ms fastinter 250ms downinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
    server n1 127.0.0.1:$(pg_port 1) maxconn 200 check port $(rest_port 1)
    server n2 127.0.0.1:$(pg_port 2) maxconn 200 check port $(rest_port 2)
EOF
}

# --- the parts -------------------------------------------------------------------------

start_etcd() {
  if live_pid "$BASE/etcd.pid" "$BASE/etcd" >/dev/null; then return 0; fi
  mkdir -p "$BASE/etcd"
  etcd --name e0 --data-dir "$BASE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "e0=http://127.0.0.1:$ETCD_PEER" --initial-cluster-state new \
    --initial-cluster-token orderly >"$BASE/etcd.log" 2>&1 &
  echo $! > "$BASE/etcd.pid"
  local i
  for i in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$ETCD_CLIENT/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  fail "etcd did not come up"
}

start_node() {
  local n=$1
  if live_pid "$BASE/n$n.pid" "$BASE/n$n.yml" >/dev/null; then return 0; fi
  write_config "$n"
  # The subshell becomes setpriv, which becomes Patroni: $! is Patroni's pid.
  (cd "$BASE" && exec env HOME=/var/lib/postgresql setpriv --reuid=postgres \
    --regid=postgres --init-groups /usr/bin/patroni "$BASE/n$n.yml" >>"$BASE/n$n.log" 2>&1) &
  echo $! > "$BASE/n$n.pid"
}

start_haproxy() {
  if live_pid "$BASE/haproxy.pid" "$BASE/haproxy.cfg" >/dev/null; then return 0; fi
  write_haproxy
  haproxy -c -q -f "$BASE/haproxy.cfg" || die "haproxy.cfg does not check"
  haproxy -f "$BASE/haproxy.cfg" -db >"$BASE/haproxy.log" 2>&1 &
  echo $! > "$BASE/haproxy.pid"
}

rest() { curl -s --max-time 2 "http://127.0.0.1:$(rest_port "$1")$2"; }

primary() {
  local n
  for n in "${NODES[@]}"; do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 \
      "http://127.0.0.1:$(rest_port "$n")/primary")" = 200 ]; then
      echo "n$n"; return 0
    fi
  done
  return 1
}

# A running leader and a running sync standby.
healthy() {
  local n json
  for n in "${NODES[@]}"; do
    json=$(rest "$n" /cluster) || continue
    python3 - "$json" <<'PY' && return 0
import json, sys
members = json.loads(sys.argv[1]).get("members", [])
roles = {m.get("role") for m in members if m.get("state") in ("running", "streaming")}
sys.exit(0 if "leader" in roles and "sync_standby" in roles else 1)
PY
  done
  return 1
}

# Several writable answers in a row through the endpoint: HAProxy answers before its
# first checks.
writable() {
  local i ok=0
  for i in $(seq 1 40); do
    if psql -X -q -At "$(url)" -c "CREATE TABLE IF NOT EXISTS orderly_ready (x int); \
      INSERT INTO orderly_ready VALUES (1)" >/dev/null 2>&1; then
      ok=$((ok + 1))
      [ "$ok" -ge 5 ] && return 0
    else
      ok=0
    fi
    sleep 0.2
  done
  return 1
}

wait_for() {
  local what=$1 i
  for i in $(seq 1 $((TIMEOUT * 2))); do
    "$what" >/dev/null && return 0
    sleep 0.5
  done
  return 1
}

cmd_start() {
  ensure_packages
  if [ -d "$BASE" ] && [ ! -f "$BASE/$MARKER" ]; then
    die "$BASE exists and is not this script's; set ORDERLY_PATRONI_DIR"
  fi
  # Nothing of this cluster running: each of its ports must be free.
  local p
  if ! live_pid "$BASE/etcd.pid" "$BASE/etcd" >/dev/null; then
    local held
    for p in "$PORT" "$(pg_port 1)" "$(pg_port 2)" "$(rest_port 1)" "$(rest_port 2)" \
      "$ETCD_CLIENT" "$ETCD_PEER"; do
      held=$(ss -Htan state listening state established "( sport = :$p )") || die "ss failed"
      [ -z "$held" ] || die "port $p is taken: $held"
    done
  fi
  mkdir -p "$BASE"
  touch "$BASE/$MARKER"
  chmod 0755 "$BASE"
  start_etcd
  start_node 1
  wait_for primary || fail "node 1 did not become primary"
  start_node 2
  wait_for healthy || fail "no sync standby"
  start_haproxy
  writable || fail "the endpoint does not take writes"
  log "up: primary $(primary), endpoint $(url)"
  url
}

cmd_stop() {
  local pid n
  if pid=$(live_pid "$BASE/haproxy.pid" "$BASE/haproxy.cfg"); then stop_pid "$pid" haproxy; fi
  for n in "${NODES[@]}"; do
    if pid=$(live_pid "$BASE/n$n.pid" "$BASE/n$n.yml"); then stop_pid "$pid" "n$n"; fi
    if pid=$(postmaster_pid "$n"); then stop_pid "$pid" "n$n postgres"; fi
  done
  if pid=$(live_pid "$BASE/etcd.pid" "$BASE/etcd"); then stop_pid "$pid" etcd; fi
  log "stopped (data kept in $BASE)"
}

node_arg() {
  case "${1:-}" in
    1 | 2) echo "$1" ;;
    primary) primary | tr -d n ;;
    *) die "a node is 1, 2 or primary" ;;
  esac
}

cmd_kill_postgres() {
  local n pid
  n=$(node_arg "${1:-}")
  pid=$(postmaster_pid "$n") || die "node $n has no postmaster"
  # Backends call setsid(): kill them by their parent, not by a process group.
  kill -KILL "$pid" $(pgrep -P "$pid") 2>/dev/null || true
  log "n$n: postmaster $pid killed"
}

cmd_kill_node() {
  local n pid
  n=$(node_arg "${1:-}")
  pid=$(live_pid "$BASE/n$n.pid" "$BASE/n$n.yml") || die "node $n has no patroni"
  kill -KILL "$pid"
  log "n$n: patroni $pid killed"
  cmd_kill_postgres "$n"
}

cmd_restart() {
  local n=${1:-}
  case "$n" in 1 | 2) ;; *) die "restart 1 or 2" ;; esac
  start_node "$n"
  wait_for healthy || fail "node $n did not rejoin"
  log "n$n rejoined; primary $(primary)"
}

cmd_status() {
  rest 1 /cluster || rest 2 /cluster || true
  echo
  healthy
}

cmd_clean() {
  cmd_stop
  if [ -f "$BASE/$MARKER" ]; then rm -rf "$BASE"; fi
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  primary) primary ;;
  kill-postgres) cmd_kill_postgres "${2:-}" ;;
  kill-node) cmd_kill_node "${2:-}" ;;
  restart) cmd_restart "${2:-}" ;;
  status) cmd_status ;;
  diagnose) diagnose ;;
  url) url ;;
  clean) cmd_clean ;;
  *) die "usage: $0 start|stop|primary|kill-postgres N|kill-node N|restart N|status|diagnose|url|clean" ;;
esac
