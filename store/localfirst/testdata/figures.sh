#!/usr/bin/env bash
# Measures, in one run on this machine, `sluice serve` over gRPC with 10,000
# users drawn from a Zipf distribution (sluice bench --zipf 1.1), a limit of
# 1,000 a minute per user (the hottest ~1% exceed it), on: the memory store,
# Redis in exact mode (near cache on, the default), Redis in lease mode
# (--sync lease) and in async mode (--sync async). For each: decisions/s and latency (sluice bench), store
# calls per decision (sluice_local_first_store_calls_total), and Redis CPU
# per decision (INFO commandstats: the µs Redis spent in commands, over the
# decisions). Runs ROUNDS rounds (default 2) of the four, alternating, on
# a redis-server of its own.
#
#   store/localfirst/testdata/figures.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds=${1:-2}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
go build -o "$dir/sluice" ./cmd/sluice
rport=$((23000 + RANDOM % 2000))
redis-server --port "$rport" --save '' --appendonly no --daemonize yes --logfile "$dir/redis.log" >/dev/null
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
cat >"$dir/rules.yaml" <<'RULES'
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
RULES
gport=$((25000 + RANDOM % 2000)); hport=$((gport + 1))
metric() { curl -s "http://127.0.0.1:$hport/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
run() { # name, store, extra flags...
  local name=$1 store=$2; shift 2
  "$dir/sluice" serve --rules "$dir/rules.yaml" --store "$store" --grpc-addr "127.0.0.1:$gport" \
    --http-addr "127.0.0.1:$hport" --store-timeout 1s --log-level warn "$@" &
  local pid=$!
  redis-cli -p "$rport" flushall >/dev/null # every mode starts from no counts
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$hport/readyz" >/dev/null && break; sleep 0.1; done
  redis-cli -p "$rport" config resetstat >/dev/null
  local out; out=$("$dir/sluice" bench --grpc-addr "127.0.0.1:$gport" --duration 10s --zipf 1.1)
  local total; total=$(echo "$out" | awk '/^decisions:/ {print $2}')
  local usec; usec=$(redis-cli -p "$rport" info commandstats | awk -F'[=,]' '/^cmdstat_/ {s += $4} END {print s+0}')
  local calls; calls=$(metric sluice_local_first_store_calls_total)
  printf '%-7s %s\n' "$name" "$(echo "$out" | tr '\n' ' ' | tr -s ' ')"
  printf '%-7s redis µs/decision: %s  store calls/decision: %s\n' "$name" \
    "$(awk -v u="$usec" -v n="$total" 'BEGIN {if (n > 0) printf "%.3f", u/n; else print "?"}')" \
    "$(awk -v c="${calls:-0}" -v n="$total" 'BEGIN {if (n > 0 && c > 0) printf "%.4f", c/n; else print "-"}')"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
for r in $(seq "$rounds"); do
  echo "round $r"
  run memory memory
  run exact "redis://127.0.0.1:$rport/0"
  run lease "redis://127.0.0.1:$rport/0" --sync lease
  run async "redis://127.0.0.1:$rport/0" --sync async
done
