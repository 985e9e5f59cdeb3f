#!/usr/bin/env bash
# Measures the per-call ceilings on the Redis at 127.0.0.1:PORT (default
# 6379): redis-benchmark running one decision per call with EVALSHA, 50
# clients pipelining 16 commands, random keys over 10,000, then Redis's µs
# per call from INFO commandstats. Two scripts: gcra-ceiling.lua, the
# smallest GCRA (TIME, GET, SET PX), and token-bucket-ceiling.lua, a token
# bucket as commonly written (TIME, HMGET, HSET, PEXPIRE).
set -euo pipefail
port=${1:-6379}
cd "$(dirname "$0")"
ceiling() { # script, args...
  local sha
  sha=$(redis-cli -p "$port" script load "$(cat "$1")")
  shift
  redis-cli -p "$port" config resetstat >/dev/null
  echo "redis-benchmark -p $port -P 16 -c 50 -n 1000000 -r 10000 -q evalsha $sha $*"
  redis-benchmark -p "$port" -P 16 -c 50 -n 1000000 -r 10000 -q evalsha "$sha" "$@" 2>&1 |
    tr '\r' '\n' | grep 'requests per second' | tail -1
  redis-cli -p "$port" info commandstats | grep cmdstat_evalsha
}
ceiling gcra-ceiling.lua 1 'g:__rand_int__' 1000 1000000
ceiling token-bucket-ceiling.lua 1 'tb:__rand_int__' 1000 1000 1
