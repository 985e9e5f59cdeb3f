#!/usr/bin/env bash
# Starts and stops the Redis servers that sluice's tests and benchmarks
# share: a standalone redis-server and a Redis Cluster of 3 masters and 3
# replicas, all on free loopback ports, in a temporary directory. It
# installs nothing (scripts/test.sh does).
#
#   eval "$(scripts/test-env.sh start)"   # prints export lines
#   scripts/test-env.sh stop [DIR]        # DIR defaults to $SLUICE_TEST_ENV_DIR
#
# start prints
#   export SLUICE_TEST_REDIS_ADDR=127.0.0.1:PORT
#   export SLUICE_TEST_REDIS_CLUSTER_ADDRS=127.0.0.1:P1,...,127.0.0.1:P6
#   export SLUICE_TEST_ENV_DIR=DIR
# and is idempotent: when $SLUICE_TEST_ENV_DIR names a running environment,
# it prints that one's lines again. stop is idempotent too. Every wait is
# bounded; nothing here hangs.
set -euo pipefail

log() { echo "test-env: $*" >&2; }
die() { log "$*"; exit 1; }

# port_free reports whether nothing listens on the loopback port $1.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port prints a free port whose cluster bus port (+10000) is free too.
# Both lie below Linux's ephemeral range (32768-60999), where an outgoing
# connection could take the bus port between the check and the bind.
# Callers start a server on it before asking for the next one.
free_port() {
  local p i
  for i in $(seq 1 200); do
    p=$((20000 + RANDOM % 2768))
    if port_free "$p" && port_free $((p + 10000)); then
      echo "$p"
      return 0
    fi
  done
  die "no free port found"
}

# wait_ping waits up to 10 s for the redis-server on port $1 to answer.
wait_ping() {
  local i
  for i in $(seq 1 100); do
    if [ "$(timeout 2 redis-cli -p "$1" ping 2>/dev/null)" = PONG ]; then return 0; fi
    sleep 0.1
  done
  die "redis-server on port $1 did not start (see $dir/$1.log)"
}

# start_server starts a redis-server on port $1 with extra arguments.
start_server() {
  local port=$1
  shift
  mkdir -p "$dir/$port"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$port" --save '' --appendonly no \
    --daemonize yes --pidfile "$dir/$port.pid" --logfile "$dir/$port.log" "$@" >/dev/null
  wait_ping "$port"
  echo "$port" >>"$dir/ports"
}

alive() {
  local d=$1 pf
  [ -f "$d/env" ] || return 1
  for pf in "$d"/*.pid; do
    [ -f "$pf" ] && kill -0 "$(cat "$pf")" 2>/dev/null || return 1
  done
}

cmd_start() {
  command -v redis-server >/dev/null || die "redis-server is not installed (scripts/test.sh installs it)"
  command -v redis-cli >/dev/null || die "redis-cli is not installed (scripts/test.sh installs it)"
  if [ -n "${SLUICE_TEST_ENV_DIR:-}" ] && alive "$SLUICE_TEST_ENV_DIR"; then
    cat "$SLUICE_TEST_ENV_DIR/env"
    return 0
  fi
  dir=$(mktemp -d "${TMPDIR:-/tmp}/sluice-test-env.XXXXXX")
  : >"$dir/ports"
  started=0
  trap '[ "$started" = 1 ] || { log "start failed; stopping what started"; [ -z "${dir:-}" ] || cmd_stop "$dir" >/dev/null 2>&1 || true; }' EXIT

  local single
  single=$(free_port)
  start_server "$single"

  local ports=() addrs=() p
  for _ in 1 2 3 4 5 6; do
    p=$(free_port)
    ports+=("$p")
    addrs+=("127.0.0.1:$p")
    # The node timeout is long enough that a loaded machine does not make
    # nodes think each other dead (failover tests start a cluster of their
    # own); replicas sync at once and may always take over.
    start_server "$p" --cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" \
      --cluster-node-timeout 5000 --repl-diskless-sync-delay 0 --cluster-replica-validity-factor 0
  done
  timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
    >"$dir/cluster-create.log" 2>&1 || die "redis-cli --cluster create failed (see $dir/cluster-create.log)"

  local ok i
  for i in $(seq 1 300); do
    ok=1
    for p in "${ports[@]}"; do
      timeout 2 redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || { ok=0; break; }
      timeout 2 redis-cli -p "$p" info replication 2>/dev/null | grep -Eq '^(role:master|master_link_status:up)' || { ok=0; break; }
    done
    [ "$ok" = 1 ] && break
    sleep 0.1
  done
  [ "$ok" = 1 ] || die "cluster did not reach cluster_state:ok with replicas in sync in 30 s"

  local cluster
  cluster=$(IFS=,; echo "${addrs[*]}")
  {
    echo "export SLUICE_TEST_REDIS_ADDR=127.0.0.1:$single"
    echo "export SLUICE_TEST_REDIS_CLUSTER_ADDRS=$cluster"
    echo "export SLUICE_TEST_ENV_DIR=$dir"
  } >"$dir/env"
  started=1
  cat "$dir/env"
}

cmd_stop() {
  local d=${1:-${SLUICE_TEST_ENV_DIR:-}}
  [ -n "$d" ] || { log "nothing to stop: no directory given and SLUICE_TEST_ENV_DIR unset"; return 0; }
  [ -d "$d" ] || return 0
  case "$(basename "$d")" in sluice-test-env.*) ;; *) die "$d is not a test-env directory" ;; esac
  local pf pid pids=()
  for pf in "$d"/*.pid; do
    [ -f "$pf" ] || continue
    pid=$(cat "$pf")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  local i
  for pid in "${pids[@]}"; do
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$d"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop "${2:-}" ;;
  *) echo "usage: $0 start | stop [DIR]" >&2; exit 2 ;;
esac
