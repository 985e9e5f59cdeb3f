#!/usr/bin/env bash
# Measures, in one run, the store's throughput against the per-call
# ceiling, on a redis-server of its own (a free loopback port):
#
#  1. the ceilings: redis-benchmark running one decision per call with
#     EVALSHA, 50 clients pipelining 16 commands, random keys over 10,000,
#     and Redis's µs per call from INFO commandstats. Two scripts:
#     gcra-ceiling.lua, the smallest GCRA (TIME, GET, SET PX), and
#     token-bucket-ceiling.lua, a token bucket as commonly written (TIME,
#     HMGET, HSET, PEXPIRE);
#  2. BenchmarkTake/default: the store driven by 64 goroutines over 10,000
#     keys, COUNT runs (decisions/s, decisions per script call, Redis µs per
#     decision), and the ratio of its median to the GCRA ceiling;
#  3. BenchmarkLatency: one decision at a time, p50 and p99.
#
# On a machine of two CPUs or more, Redis runs on the first and the client
# (redis-benchmark, then the Go benchmark, with GOMAXPROCS 1) on the second,
# so that each side has one CPU, as Redis and its clients have on separate
# hosts; unpinned, the 64 goroutines and Redis take turns on the same CPUs
# and Redis's µs per call grow with the Go side's load. PIN=0 leaves both
# unpinned.
#
#	store/redis/testdata/bench.sh [COUNT]    # COUNT = 8 by default
set -euo pipefail
count=${1:-8}
cd "$(dirname "$0")"
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
server=() client=()
if [ "${PIN:-1}" != 0 ] && [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  server=(taskset -c 0) client=(taskset -c 1)
  echo "redis-server on CPU 0, clients on CPU 1"
fi
(cd .. && go test -c -o "$work/redis.test" .)
"${server[@]}" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize yes --logfile "$work/redis.log" >/dev/null
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

ceiling() { # script, args... -> prints the line; sets rate
  local sha out
  sha=$(redis-cli -p "$port" script load "$(cat "$1")")
  shift
  redis-cli -p "$port" config resetstat >/dev/null
  out=$("${client[@]}" redis-benchmark -p "$port" -P 16 -c 50 -n 1000000 -r 10000 -q evalsha "$sha" "$@" 2>&1 |
    tr '\r' '\n' | grep 'requests per second' | tail -1)
  rate=$(sed -E 's/.*: ([0-9.]+) requests per second.*/\1/' <<<"$out")
  echo "  $rate calls/s, Redis $(redis-cli -p "$port" info commandstats | grep cmdstat_evalsha | grep -o 'usec_per_call=[0-9.]*' | cut -d= -f2) µs per call"
}
echo "ceiling: redis-benchmark -P 16 -c 50 -n 1000000 -r 10000 evalsha, one decision per call"
echo " gcra-ceiling.lua"
ceiling gcra-ceiling.lua 1 'g:__rand_int__' 1000 1000000
gcra=$rate
echo " token-bucket-ceiling.lua"
ceiling token-bucket-ceiling.lua 1 'tb:__rand_int__' 1000 1000 1
bucket=$rate
redis-cli -p "$port" flushall >/dev/null

echo "store: BenchmarkTake/default -benchtime 400000x -count $count"
(cd "$work" && SLUICE_BENCH_REDIS_ADDR=127.0.0.1:$port "${client[@]}" ./redis.test -test.run '^$' \
  -test.bench 'BenchmarkTake/default$' -test.benchtime 400000x -test.count "$count") | tee "$work/take.txt" | grep '^Benchmark'
median=$(grep -o '[0-9.]* decisions/s' "$work/take.txt" | awk '{print $1}' | sort -n |
  awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}')
awk -v m="$median" -v g="$gcra" -v b="$bucket" 'BEGIN {
  printf "median %.0f decisions/s: %.2f x the GCRA ceiling, %.2f x the token-bucket ceiling\n", m, m/g, m/b }'

echo "latency: BenchmarkLatency -benchtime 20000x"
(cd "$work" && SLUICE_BENCH_REDIS_ADDR=127.0.0.1:$port "${client[@]}" ./redis.test -test.run '^$' \
  -test.bench 'BenchmarkLatency' -test.benchtime 20000x) | grep '^Benchmark'
