#!/usr/bin/env bash
# Counts the instructions Redis executes per decision of take.lua, with
# valgrind's callgrind: unlike CPU time, the count repeats within a few
# percent from run to run, whatever else the machine is doing (three runs
# of one version: 20,532, 20,704 and 20,808), so it compares two versions
# of the script over a few runs each. It runs BenchmarkScript/n=N (script calls of N Takes each,
# GCRA, 1,000 keys) against a redis-server under callgrind twice, with 200
# and 400 calls, and divides the difference by 200 × N, which leaves out
# Redis's start and the benchmark's set-up.
#
#	store/redis/testdata/script-cost.sh [N]    # N = 25 by default
set -euo pipefail
command -v valgrind >/dev/null || { echo "script-cost.sh needs valgrind (apt-get install valgrind)" >&2; exit 1; }
n=${1:-25}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go test -c -o "$work/redis.test" .
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

count() { # calls -> instructions
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.$1" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$work/valgrind.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  (cd "$work" && SLUICE_BENCH_REDIS_ADDR=127.0.0.1:$port ./redis.test -test.run '^$' \
    -test.bench "BenchmarkScript/n=$n\$" -test.benchtime "${1}x" >/dev/null)
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  awk '/^summary:/ {print $2}' "$work/cg.$1"
}
a=$(count 200)
b=$(count 400)
echo "take.lua, $n Takes per call: $(( (b - a) / (200 * n) )) instructions per decision in Redis"
