#!/usr/bin/env bash
# Measures what three `sluice serve` on one Redis admit on one hot key with
# a limit of LIMIT (default 1000) an hour of ALGORITHM (default
# fixed_window; a bucket's burst is LIMIT), each loaded by its own
# `sluice bench` (one user, 50 callers) for SECONDS (default 10), in each of
# MODES (default "exact lease async"): the admitted count against the
# limit, the over- or under-admission, and async mode's stated bound with
# --async-nodes 3 and the default --sync-interval of 100 ms: a window's
# 3 × max(⌊LIMIT/150⌋, 1); a bucket's LIMIT × SECONDS / 1 h (the refill
# over the run, which an exact bucket admits too) + max(LIMIT/50 + LIMIT ×
# 100 ms / 1 h, 3). EXTRA adds flags to the servers.
#
#   store/localfirst/testdata/overshoot.sh [LIMIT] [SECONDS] [MODES] [ALGORITHM]
set -euo pipefail
cd "$(dirname "$0")/../../.."
limit=${1:-1000} secs=${2:-10} modes=${3:-exact lease async} alg=${4:-fixed_window}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
go build -o "$dir/sluice" ./cmd/sluice
rport=$((23000 + RANDOM % 2000))
redis-server --port "$rport" --save '' --appendonly no --daemonize yes --logfile "$dir/redis.log" >/dev/null
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
cat >"$dir/rules.yaml" <<RULES
domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: $limit, algorithm: $alg}
RULES
case $alg in
  token_bucket | leaky_bucket | gcra)
    bound=$(awk -v l="$limit" -v s="$secs" 'BEGIN {r = l * s / 3600; o = l / 50 + l * 0.1 / 3600; if (o < 3) o = 3; printf "+%.1f refill +%.1f", r, o}') ;;
  *) bound="+$((3 * (limit / 150 > 1 ? limit / 150 : 1)))" ;;
esac
base=$((25000 + RANDOM % 2000))
for mode in $modes; do
  redis-cli -p "$rport" flushall >/dev/null
  pids=()
  for i in 0 1 2; do
    "$dir/sluice" serve --rules "$dir/rules.yaml" --store "redis://127.0.0.1:$rport/0" --sync "$mode" \
      --async-nodes 3 --store-timeout 1s --fail closed ${EXTRA:-} --grpc-addr "127.0.0.1:$((base + 2 * i))" \
      --http-addr "127.0.0.1:$((base + 2 * i + 1))" --log-level error &
    pids+=($!)
  done
  for i in 0 1 2; do
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$((base + 2 * i + 1))/readyz" >/dev/null && break; sleep 0.1; done
  done
  hour=$(date -u +%H)
  for i in 0 1 2; do
    "$dir/sluice" bench --grpc-addr "127.0.0.1:$((base + 2 * i))" --users 1 --duration "${secs}s" >"$dir/bench$i.txt" &
  done
  wait $(jobs -p | grep -v -e "${pids[0]}" -e "${pids[1]}" -e "${pids[2]}") 2>/dev/null || true
  # sluice bench makes one call before it counts, admitted: 3 more.
  ok=$(awk '/^decisions:/ {gsub(/[(,]/, " "); for (i = 1; i <= NF; i++) if ($i == "OK") s += $(i+1)} END {print s+3}' "$dir"/bench*.txt)
  all=$(awk '/^decisions:/ {s += $2} END {print s+0}' "$dir"/bench*.txt)
  errs=$(awk '/^decisions:/ {gsub(/[(,)]/, " "); for (i = 1; i <= NF; i++) if ($i == "errors") s += $(i+1)} END {print s+0}' "$dir"/bench*.txt)
  [ "$(date -u +%H)" = "$hour" ] || echo "$mode: the hour turned during the run; inconclusive"
  echo "$mode: $all decisions ($errs errors), $ok admitted of $limit: $((ok - limit)) ($(awk -v o="$ok" -v l="$limit" 'BEGIN {printf "%+.2f%%", 100 * (o - l) / l}')); async bound $bound"
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
done
