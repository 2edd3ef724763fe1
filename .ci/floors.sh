#!/bin/bash
# The floors of src/, from the ground up, and the import edges that run upward: every
# `crate::` path in code (a module, or a name the crate root re-exports) in each file
# under src/, against the floor of the file's own module. Unit tests (`tests.rs`) may
# use the testing kit. Prints each upward edge; exits 1 if there is one.
#
#   1 machine, error             the graph, the error type
#   2 support                    what every layer shares (deadlines, input checks)
#   3 store                      the seam: traits, rows, table names, error classes, leases
#   4 observe, coalesce          spans and metrics; the turn, the queue, coalesced reads and claims
#   5 engine, idempotency, outbox
#   6 flow, timer                (use idempotency and the engine)
#   7 http, admin, cli, testing
#   8 backend                    the dialects, implementing every seam from above
cd "$(dirname "$0")/.."
declare -A floor=([machine]=1 [error]=1 [support]=2 [store]=3 [observe]=4 [coalesce]=4 [engine]=5 [idempotency]=5 [outbox]=5 [flow]=6 [timer]=6 [http]=7 [admin]=7 [cli]=7 [testing]=7 [backend]=8)
declare -A root=([Error]=error [Result]=error [TokenRejection]=error [StateMachine]=machine [Transition]=machine [StateTimer]=machine
  [Store]=store [Tables]=store [WriteTurn]=store
  [Engine]=engine [EngineConfig]=engine [Outcome]=engine [ReadFirst]=engine [Record]=engine [Order]=engine [TransitionRequest]=engine [CreateRequest]=engine [CoalescedWrites]=engine [DEFAULT_MAX_EVENT_BODY]=engine
  [Records]=idempotency [Claim]=idempotency [Claimed]=idempotency [CoalescedClaims]=idempotency [Done]=idempotency [Failure]=idempotency [Ran]=idempotency [Reconciled]=idempotency [Recovered]=idempotency [ScopeConfig]=idempotency [Stored]=idempotency [Stuck]=idempotency [FrontConfig]=idempotency [RedisFront]=idempotency
  [Timers]=timer [TimersConfig]=timer [TimerStore]=store
  [Flows]=flow [Definition]=flow [FlowConfig]=flow [FlowOutcome]=flow [Resume]=flow [Started]=flow [StepError]=flow
  [PgStore]=backend [MySqlStore]=backend [SqliteStore]=backend)
# Code only: doc comments and comments are not imports.
grep -rnE '\$?crate::' src --include=*.rs --exclude=tests.rs | grep -vE '^[^:]+:[0-9]+: *//' |
  grep -oE '^[^:]+:[0-9]+:|\$?crate::(\{[A-Za-z_, ]*\}|[A-Za-z_]+)' | awk '/:$/{p=$0; next} {print p $0}' |
while IFS=: read -r file line ref; do
  from=$(echo "$file" | sed -E 's#^src/([a-z_]+).*#\1#; s#\.rs$##')
  [ -n "${floor[$from]}" ] || continue
  for name in $(echo "${ref#*crate::}" | tr -d '{}' | tr ',' ' '); do
    to=${floor[$name]:+$name}; to=${to:-${root[$name]}}
    [ -n "$to" ] || continue
    if [ "${floor[$to]}" -gt "${floor[$from]}" ]; then echo "$file:$line $from -> $to ($name)"; fi
  done
done > /tmp/orderly-floors.$$
n=$(wc -l < /tmp/orderly-floors.$$)
cat /tmp/orderly-floors.$$; rm -f /tmp/orderly-floors.$$
echo "import edges running upward: $n"
[ "$n" = 0 ]
