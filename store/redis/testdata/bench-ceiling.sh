#!/usr/bin/env bash
# Measures the per-call ceiling on the Redis at 127.0.0.1:PORT (default
# 6379): redis-benchmark running gcra-ceiling.lua (one GCRA decision per
# call) with EVALSHA, 50 clients pipelining 16 commands, random keys over
# 10,000; then Redis's µs per call from INFO commandstats.
set -euo pipefail
port=${1:-6379}
cd "$(dirname "$0")"
sha=$(redis-cli -p "$port" script load "$(cat gcra-ceiling.lua)")
redis-cli -p "$port" config resetstat >/dev/null
echo "redis-benchmark -p $port -P 16 -c 50 -n 1000000 -r 10000 -q evalsha $sha 1 'g:__rand_int__' 1000 1000000"
redis-benchmark -p "$port" -P 16 -c 50 -n 1000000 -r 10000 -q evalsha "$sha" 1 'g:__rand_int__' 1000 1000000 2>&1 |
  tr '\r' '\n' | grep 'requests per second' | tail -1
redis-cli -p "$port" info commandstats | grep cmdstat_evalsha
