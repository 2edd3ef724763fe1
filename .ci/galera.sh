#!/usr/bin/env bash
# A throwaway 3-node MariaDB Galera cluster on 127.0.0.1, for the test suite.
#
#   .ci/galera.sh start        bring the cluster up (idempotent) and print the client URLs
#   .ci/galera.sh stop         stop the nodes this script started (their data is kept)
#   .ci/galera.sh kill N       SIGKILL node N: a crash, not a shutdown
#   .ci/galera.sh restart N    bring node N back into the running cluster, wait for Synced
#   .ci/galera.sh status       one line per node; exit 0 only if all 3 are Synced, size 3
#   .ci/galera.sh urls         print the client URLs
#   .ci/galera.sh clean        stop, then delete $ORDERLY_GALERA_DIR
#
# Progress goes to stderr, so `urls=$(.ci/galera.sh start)` captures only the URLs.
#
# The system MariaDB (3306, /var/lib/mysql) is never touched: every node reads only its
# own --defaults-file (so /etc/mysql/my.cnf, which points at the system datadir, is never
# read), and a pid is signalled only if this script recorded it and its command line still
# names that node's defaults file (pids get reused).
#
# Environment:
#   ORDERLY_GALERA_DIR        base directory (default /tmp/orderly-galera)
#   ORDERLY_GALERA_PORT_BASE  client port of node 1; nodes 2 and 3 use +1, +2 (default 4306)
#   ORDERLY_GALERA_GCOMM_BASE Galera port of node 1; node i uses +10*(i-1), its IST port
#                             is that +1 and its SST port that +2 (default 5567)
#   ORDERLY_GALERA_TIMEOUT    seconds a node may take to reach Synced (default 120)
set -euo pipefail

BASE=${ORDERLY_GALERA_DIR:-/tmp/orderly-galera}
PORT_BASE=${ORDERLY_GALERA_PORT_BASE:-4306}
GCOMM_BASE=${ORDERLY_GALERA_GCOMM_BASE:-5567}
TIMEOUT=${ORDERLY_GALERA_TIMEOUT:-120}
NODES=(1 2 3)
MARIADBD=/usr/sbin/mariadbd
# Only a directory carrying this file is ever deleted, so a mistyped ORDERLY_GALERA_DIR
# cannot make `start` or `clean` wipe something else.
MARKER=.orderly-galera
# mariabackup SST logs into the donor over its socket as this user. It is created on the
# bootstrap node and reaches the other nodes inside the SST itself, so every node can donate.
SST_USER=orderly_sst
SST_PASS=orderly_sst

log() { printf 'galera: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

client_port() { echo $((PORT_BASE + $1 - 1)); }
gcomm_port() { echo $((GCOMM_BASE + 10 * ($1 - 1))); }
ist_port() { echo $(($(gcomm_port "$1") + 1)); }
sst_port() { echo $(($(gcomm_port "$1") + 2)); }
node_dir() { echo "$BASE/node$1"; }
url() { echo "mysql://root@127.0.0.1:$(client_port "$1")/test"; }
print_urls() { local n; for n in "${NODES[@]}"; do url "$n"; done; }

# --- packages ------------------------------------------------------------------------

galera_lib() {
  local f
  for f in /usr/lib/galera/libgalera_smm.so /usr/lib/libgalera_smm.so \
    /usr/lib/galera-4/libgalera_smm.so; do
    if [ -e "$f" ]; then echo "$f"; return 0; fi
  done
  return 1
}

# One `apt-get update` at most, and only when something is actually missing: CI machines
# are reused, so the usual run installs nothing and stays offline-fast.
ensure_packages() {
  local want=()
  [ -x "$MARIADBD" ] || want+=(mariadb-server)
  command -v mariadb >/dev/null 2>&1 || want+=(mariadb-client)
  command -v mariabackup >/dev/null 2>&1 || want+=(mariadb-backup)
  command -v socat >/dev/null 2>&1 || want+=(socat) # mariabackup SST streams over socat
  galera_lib >/dev/null || want+=(galera-4)
  if [ "${#want[@]}" -eq 0 ]; then return 0; fi
  log "installing ${want[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >&2
  galera_lib >/dev/null || die "galera-4 installed but libgalera_smm.so not found"
}

# --- processes -----------------------------------------------------------------------

# True if PID is a live mariadbd started from node N's defaults file.
is_our_node() {
  local pid=$1 n=$2 cmd
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmd == *mariadbd*"--defaults-file=$(node_dir "$n")/my.cnf"* ]]
}

# The recorded pid of node N, printed only while that process is alive and ours.
node_pid() {
  local f pid
  f="$(node_dir "$1")/orderly.pid"
  [ -r "$f" ] || return 1
  pid=$(cat "$f")
  is_our_node "$pid" "$1" && echo "$pid"
}

node_alive() { node_pid "$1" >/dev/null; }

# setsid: the node must outlive this script and not share the caller's process group,
# and stdio must not hold the caller's pipes (or `$(galera.sh start)` would never return).
# setsid execs without forking here, so $! is mariadbd's own pid.
launch_node() { # launch_node N [mariadbd args...]
  local n=$1 dir
  shift
  dir=$(node_dir "$n")
  setsid "$MARIADBD" --defaults-file="$dir/my.cnf" "$@" </dev/null >>"$dir/console.log" 2>&1 &
  echo "$!" >"$dir/orderly.pid"
  log "node $n: started pid $! on port $(client_port "$n") $*"
}

wait_gone() { # wait_gone PID SECONDS
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [ -e "/proc/$1" ] || return 0
    sleep 0.1
  done
  return 1
}

# mariadbd leads its own process group (setsid), which holds only what it spawned: the
# SST script and its socat/mariabackup. Killing the group keeps an orphaned socat from
# squatting on the SST port when the node comes back.
kill_group() { kill -KILL -- "-$1" 2>/dev/null || true; }

# A clean shutdown (SIGTERM) leaves grastate.dat with a real seqno, so a later restart
# of this node can use IST. A joiner still waiting for its SST may ignore SIGTERM, hence
# the SIGKILL fallback.
stop_node() {
  local n=$1 pid
  pid=$(node_pid "$n") || return 0
  log "node $n: stopping pid $pid"
  kill -TERM "$pid"
  wait_gone "$pid" 30 || log "node $n: did not stop in 30s, sending SIGKILL"
  kill_group "$pid"
  wait_gone "$pid" 10 || die "node $n: pid $pid survived SIGKILL"
}

# Returns as soon as the process is gone, not when the survivors have noticed: they keep
# the dead node in their view until evs.suspect_timeout (5 s), which tests may want to see.
kill_node() {
  local n=$1 pid
  pid=$(node_pid "$n") || die "node $n is not running (no live recorded pid)"
  kill_group "$pid"
  wait_gone "$pid" 10 || die "node $n: pid $pid survived SIGKILL"
  log "node $n: killed pid $pid"
}

# --- queries -------------------------------------------------------------------------

sql() { # sql N STATEMENT
  mariadb -h127.0.0.1 -P"$(client_port "$1")" -uroot --connect-timeout=2 -N -B -e "$2"
}

# Prints "cluster_size cluster_status state_comment", or fails if the node won't answer.
# The comment goes last because it can hold spaces ("Joining: receiving State Transfer").
wsrep_state() {
  sql "$1" "SELECT
      MAX(IF(VARIABLE_NAME='WSREP_CLUSTER_SIZE', VARIABLE_VALUE, NULL)),
      MAX(IF(VARIABLE_NAME='WSREP_CLUSTER_STATUS', VARIABLE_VALUE, NULL)),
      MAX(IF(VARIABLE_NAME='WSREP_LOCAL_STATE_COMMENT', VARIABLE_VALUE, NULL))
    FROM information_schema.GLOBAL_STATUS
    WHERE VARIABLE_NAME IN ('WSREP_CLUSTER_SIZE','WSREP_LOCAL_STATE_COMMENT',
                            'WSREP_CLUSTER_STATUS')" 2>/dev/null
}

node_healthy() { # node_healthy N SIZE
  local size status state
  node_alive "$1" || return 1
  read -r size status state < <(wsrep_state "$1") || return 1
  [ "$size" = "$2" ] && [ "$state" = Synced ] && [ "$status" = Primary ]
}

fail_node() {
  local n=$1
  log "ERROR: node $n: $2"
  log "---- last lines of $(node_dir "$n")/error.log ----"
  tail -n 40 "$(node_dir "$n")/error.log" >&2 2>/dev/null || true
  exit 1
}

# Waits until node N is Synced in a Primary component of SIZE nodes; fails fast, with
# the node's log, if the process dies instead (a failed SST usually ends that way).
wait_synced() { # wait_synced N SIZE
  local n=$1 deadline=$((SECONDS + TIMEOUT)) last
  while ! node_healthy "$n" "$2"; do
    node_alive "$n" || fail_node "$n" "mariadbd exited before reaching Synced"
    if ((SECONDS >= deadline)); then
      last=$(wsrep_state "$n" | tr '\t' ' ') || last="not answering"
      fail_node "$n" "not Synced in a cluster of $2 after ${TIMEOUT}s (now: ${last:-?})"
    fi
    sleep 0.5
  done
}

# Joiners first: they are the ones that stall (SST), so a timeout names the right node
# and shows its log rather than the bootstrap node's.
wait_all_synced() {
  local n
  for n in "$@"; do wait_synced "$n" 3; done
}

cluster_healthy() {
  local n
  for n in "${NODES[@]}"; do node_healthy "$n" 3 || return 1; done
}

# --- data directories ----------------------------------------------------------------

write_config() {
  local n=$1 dir peers i
  dir=$(node_dir "$n")
  peers=""
  for i in "${NODES[@]}"; do peers+="127.0.0.1:$(gcomm_port "$i"),"; done
  # Charset settings mirror the system server's, so the suite sees the same defaults.
  # pc.recovery=false: with it on, a crashed node reloads its old gcomm identity from
  # gvwstate.dat and, restarted before the others have evicted that identity, collides
  # with its own ghost (non-primary view, 12-20 s rejoins instead of 2-5 s). Its only use,
  # recovering a cluster where every node crashed, is one `start` never needs.
  # wsrep_sync_wait is deliberately left at Galera's default (0): the library under test
  # has to ask for causal reads itself, and the suite must notice if it doesn't.
  cat >"$dir/my.cnf" <<EOF
# Written by .ci/galera.sh on every start and restart; edits are lost.
[mysqld]
user = root
basedir = /usr
datadir = $dir/data
socket = $dir/mysqld.sock
pid-file = $dir/mysqld.pid
log-error = $dir/error.log
port = $(client_port "$n")
bind-address = 127.0.0.1
skip-name-resolve
# Room for the suites' pools and for sessions a killed node's peers keep a while (the
# default 151 ran out once in the MySQL suite on a node after the failover suites).
max_connections = 500
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
default_storage_engine = InnoDB
binlog_format = ROW
innodb_autoinc_lock_mode = 2
innodb_buffer_pool_size = 64M
innodb_log_file_size = 48M
innodb_flush_log_at_trx_commit = 2
wsrep_on = ON
wsrep_provider = $(galera_lib)
wsrep_cluster_name = orderly_galera
wsrep_cluster_address = gcomm://${peers%,}
wsrep_node_name = node$n
wsrep_node_address = 127.0.0.1:$(gcomm_port "$n")
wsrep_node_incoming_address = 127.0.0.1:$(client_port "$n")
wsrep_provider_options = "base_host=127.0.0.1;base_port=$(gcomm_port "$n");gmcast.listen_addr=tcp://127.0.0.1:$(gcomm_port "$n");ist.recv_addr=127.0.0.1:$(ist_port "$n");gcache.size=32M;pc.recovery=false"
wsrep_sst_method = mariabackup
wsrep_sst_auth = $SST_USER:$SST_PASS
wsrep_sst_receive_address = 127.0.0.1:$(sst_port "$n")

[client]
socket = $dir/mysqld.sock
EOF
}

# Only the bootstrap node needs system tables: joiners start from an empty datadir and
# receive everything, users included, by SST. "normal" root authentication gives
# root@localhost/127.0.0.1/::1 with an empty password, which is what the suite uses.
init_datadir() {
  local dir
  dir=$(node_dir "$1")
  mkdir -p "$dir/data"
  [ "$1" = 1 ] || return 0
  mariadb-install-db --no-defaults --user=root --datadir="$dir/data" \
    --auth-root-authentication-method=normal --skip-test-db --skip-name-resolve \
    --innodb-log-file-size=48M >"$dir/install-db.log" 2>&1 ||
    { tail -n 20 "$dir/install-db.log" >&2; die "mariadb-install-db failed"; }
}

# Refuses to delete a directory this script did not create.
wipe_base() {
  [ -e "$BASE" ] || return 0
  [ -e "$BASE/$MARKER" ] || [ -z "$(ls -A "$BASE")" ] ||
    die "$BASE exists but was not made by galera.sh (no $MARKER); not deleting it"
  rm -rf "$BASE"
}

# Something else on our ports would make a node fail with a confusing log; say so early.
check_ports_free() {
  local n p
  for n in "${NODES[@]}"; do
    for p in "$(client_port "$n")" "$(gcomm_port "$n")" "$(ist_port "$n")" "$(sst_port "$n")"; do
      if ss -Htln "sport = :$p" | grep -q .; then
        die "port $p is already in use by a process this script did not start"
      fi
    done
  done
}

# --- commands ------------------------------------------------------------------------

# The SST user must exist before any joiner asks for a state transfer: the donor's
# mariabackup logs in with wsrep_sst_auth, and a failed login kills the joiner.
bootstrap_node1() {
  launch_node 1 --wsrep-new-cluster
  wait_synced 1 1
  sql 1 "CREATE USER IF NOT EXISTS '$SST_USER'@'localhost' IDENTIFIED BY '$SST_PASS';
         GRANT RELOAD, PROCESS, LOCK TABLES, BINLOG MONITOR ON *.* TO '$SST_USER'@'localhost'"
}

fresh_start() {
  local n
  wipe_base
  check_ports_free
  mkdir -p "$BASE"
  touch "$BASE/$MARKER"
  for n in "${NODES[@]}"; do init_datadir "$n"; write_config "$n"; done
  bootstrap_node1
  # One joiner at a time: two joiners at once can leave one of them, after its SST, in a
  # non-primary view of its own ("Sending JOIN failed: -103"). A joiner that does not
  # reach Synced is stopped, emptied and started once more.
  join_fresh 2 2
  join_fresh 3 3
  wait_all_synced 2 3 1
}

# Starts empty node N and waits until it is Synced in a cluster of SIZE; retries once.
join_fresh() { # join_fresh N SIZE
  local n=$1 size=$2 try
  for try in 1 2; do
    launch_node "$n"
    if synced_within "$n" "$size"; then return 0; fi
    [ "$try" = 2 ] && fail_node "$n" "not Synced in a cluster of $size after two starts"
    log "node $n: not Synced after its SST; starting it again from an empty data dir"
    stop_node "$n"
    rm -rf "$(node_dir "$n")/data"
    init_datadir "$n"
  done
}

# Whether node N reaches Synced in a cluster of SIZE within the timeout (and stays up).
synced_within() { # synced_within N SIZE
  local n=$1 deadline=$((SECONDS + TIMEOUT))
  while ! node_healthy "$n" "$2"; do
    node_alive "$n" || return 1
    ((SECONDS >= deadline)) && return 1
    sleep 0.5
  done
}

node_in_primary() { # node_in_primary N
  local size status state
  read -r size status state < <(wsrep_state "$1") || return 1
  [ "$status" = Primary ]
}

any_node_primary() {
  local n size status state
  for n in "${NODES[@]}"; do
    node_alive "$n" || continue
    read -r size status state < <(wsrep_state "$n") || continue
    [ "$status" = Primary ] && return 0
  done
  return 1
}

cmd_start() {
  local n
  ensure_packages
  if cluster_healthy; then
    log "cluster already up"
  elif any_node_primary; then
    # Part of the cluster still runs (a test killed a node): rejoin the missing ones
    # rather than throw away the state the running nodes hold.
    # A node that runs outside the Primary component (left behind in a view of its own)
    # is stopped and rejoined too.
    for n in "${NODES[@]}"; do
      if node_alive "$n" && ! node_in_primary "$n"; then stop_node "$n"; fi
      node_alive "$n" || rejoin_node "$n"
    done
    wait_all_synced 3 2 1
  else
    # Nothing usable is running: stop leftovers of ours and start from empty datadirs.
    for n in "${NODES[@]}"; do stop_node "$n"; done
    fresh_start
  fi
  sql 1 "CREATE DATABASE IF NOT EXISTS test"
  log "cluster up: 3 nodes Synced"
  print_urls
}

# After a crash grastate.dat holds seqno -1, which would force a full SST. Asking InnoDB
# for its last committed position (what the systemd unit's galera_recovery does) lets the
# node resume by IST from a donor's gcache instead. Prints nothing if recovery fails, and
# the node then falls back to SST.
recovered_position() {
  local dir
  dir=$(node_dir "$1")
  grep -q '^seqno: *-1' "$dir/data/grastate.dat" 2>/dev/null || return 0
  "$MARIADBD" --defaults-file="$dir/my.cnf" --wsrep-recover \
    --log-error="$dir/recover.log" >/dev/null 2>&1 || return 0
  sed -n 's/.*WSREP: Recovered position: *\([^ ]*:[0-9-]*\).*/\1/p' "$dir/recover.log" | tail -n 1
}

# Never --wsrep-new-cluster here, for node 1 neither: it must join the running
# component through its peers, or it would found a second, split-brain cluster.
rejoin_node() {
  local n=$1 pos
  [ -d "$(node_dir "$n")/data" ] || die "node $n has no data dir; run '$0 start' first"
  write_config "$n"
  pos=$(recovered_position "$n")
  if [ -n "$pos" ]; then
    launch_node "$n" --wsrep-start-position="$pos"
  else
    launch_node "$n"
  fi
}

cmd_restart() {
  local n=$1
  any_node_primary || die "no running node is in a Primary component to rejoin; use '$0 start'"
  stop_node "$n"
  rejoin_node "$n"
  wait_all_synced "$n" "${NODES[@]}"
  log "node $n rejoined: 3 nodes Synced"
}

cmd_stop() {
  local n
  # Node 1 last: a clean shutdown marks the last node down safe_to_bootstrap, so anyone
  # reviving the kept data by hand finds the flag on the node that bootstrapped it.
  for n in 3 2 1; do stop_node "$n"; done
  log "stopped (data kept in $BASE)"
}

cmd_status() {
  local n pid state rc=0
  for n in "${NODES[@]}"; do
    if pid=$(node_pid "$n"); then
      state=$(wsrep_state "$n" | tr '\t' ' ') || state="not answering"
    else
      pid="-" state="not running"
    fi
    printf 'node %s  pid %-8s %-32s %s\n' "$n" "$pid" "$(url "$n")" "${state:-not answering}"
  done
  cluster_healthy || rc=1
  return "$rc"
}

node_arg() {
  case "${1:-}" in
    1 | 2 | 3) echo "$1" ;;
    *) die "expected a node number 1, 2 or 3, got '${1:-}'" ;;
  esac
}

main() {
  local n
  case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    kill) n=$(node_arg "${2:-}"); kill_node "$n" ;;
    restart) n=$(node_arg "${2:-}"); ensure_packages; cmd_restart "$n" ;;
    status) cmd_status ;;
    urls) print_urls ;;
    clean) cmd_stop; wipe_base ;;
    *) die "usage: $0 start|stop|kill N|restart N|status|urls|clean" ;;
  esac
}

main "$@"
