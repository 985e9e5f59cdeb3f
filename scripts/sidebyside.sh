#!/usr/bin/env bash
# sidebyside.sh measures, in one run and alternating rounds, what a decision
# costs in each of sluice's modes against the least a gRPC rate limit service
# can cost (issue 25):
#
#   floor   internal/rlsfloor: answers OK without reading the request (grpc-go's own cost)
#   memory  sluice serve --store memory
#   exact   sluice serve on Redis (every decision a script call; near cache on, the default)
#   lease   sluice serve on Redis, --sync lease
#   async   sluice serve on Redis, --sync async
#
# each loaded by sluice bench over gRPC (CONCURRENCY callers, USERS users drawn
# uniformly and from a Zipf law of exponent ZIPF) under one rule, `user` at
# LIMIT a UNIT (fixed window); RATE, when set, paces the callers to that many
# decisions a second in all (sluice bench --rate: an open load, so that every
# mode is offered the same calls and admitted shares compare). For every round, workload and mode it prints the
# decisions/s and p99 latency, the admitted share (OK of all answers) and the answers denied, the server's CPU µs per
# decision (utime+stime of /proc/PID/stat over the load) and its ratio to the
# floor's in the same round, Redis's CPU µs per decision (INFO cpu,
# used_cpu_sys+used_cpu_user), the store calls per decision (INFO
# commandstats: the calls of EVAL, EVALSHA and FCALL) and the Redis commands per
# decision (every command's calls, the scripts' own included), then the medians
# and ranges over the rounds. It starts its own redis-server on a free port and flushes it before
# each mode. Needs go, redis-server and redis-cli.
#
#   scripts/sidebyside.sh                          # 3 rounds of 5 s per mode and workload
#   ROUNDS=5 DURATION=10 scripts/sidebyside.sh
#   MODES="floor exact" DISTS=zipf scripts/sidebyside.sh
#   BEFORE=/path/to/old/sluice scripts/sidebyside.sh   # also that binary, as memory@before, exact@before, ...
#   SERVE_FLAGS="--lease-lifetime 1s" scripts/sidebyside.sh   # more flags for every sluice serve
#   RATE=3000 MODES="exact lease async" DISTS=zipf scripts/sidebyside.sh   # 3,000 decisions/s offered to each
#   RATE=20000 USERS=400 MODES=async DISTS=uniform scripts/sidebyside.sh   # users at half their limit: none denied
#
# The machine's speed drifts between runs: compare rows of one run, a mode
# against the floor and against exact in the same round.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
USERS=${USERS:-10000}
ZIPF=${ZIPF:-1.1}
CONCURRENCY=${CONCURRENCY:-50}
LIMIT=${LIMIT:-100}
UNIT=${UNIT:-second}
MODES=${MODES:-floor memory exact lease async}
DISTS=${DISTS:-uniform zipf}
BEFORE=${BEFORE:-}
SERVE_FLAGS=${SERVE_FLAGS:-}
RATE=${RATE:-0} # decisions/s offered in all; 0: each caller calls again as soon as answered

for tool in go redis-server redis-cli curl; do
	command -v "$tool" >/dev/null || { echo "sidebyside.sh: $tool not found" >&2; exit 1; }
done
if [ -n "$BEFORE" ] && [ ! -x "$BEFORE" ]; then
	echo "sidebyside.sh: BEFORE=$BEFORE is not an executable" >&2
	exit 1
fi

root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
rport=
cleanup() {
	for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	[ -n "$rport" ] && redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap cleanup EXIT

# freeport prints a TCP port on 127.0.0.1 that nothing listens on.
freeport() {
	local p
	while :; do
		p=$((20000 + RANDOM % 20000))
		(echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
	done
}

(cd "$root" && go build -o "$dir/sluice" ./cmd/sluice && go build -o "$dir/floor" ./internal/rlsfloor)

rport=$(freeport)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
	--logfile "$dir/redis.log" >/dev/null
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$rport" ping >/dev/null

cat >"$dir/rules.yaml" <<EOF
domain: api
descriptors:
  - key: user
    rate_limit: {unit: $UNIT, requests_per_unit: $LIMIT}
EOF

tck=$(getconf CLK_TCK)
# cpu_ticks prints a process's utime+stime in clock ticks.
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
# redis_stats prints Redis's CPU seconds (user+sys), its commands' calls (the
# scripts' own commands included) and its script calls (EVAL, EVALSHA, FCALL) so far.
redis_stats() {
	redis-cli -p "$rport" info cpu commandstats | tr -d '\r' | awk -F'[:=,]' '
		/^used_cpu_(sys|user):/ {cpu += $2}
		/^cmdstat_/ {calls += $3}
		/^cmdstat_(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro):/ {scripts += $3}
		END {printf "%.6f %d %d\n", cpu, calls, scripts}'
}

# measure NAME DIST BINARY MODE: one row of results.
measure() {
	local name=$1 dist=$2 bin=$3 mode=$4 gport hport pid
	local onredis=1 attempt
	# A port free when picked may be taken before the server binds it: then
	# the server exits, and it starts again on other ports.
	for attempt in 1 2 3; do
		gport=$(freeport)
		hport=$(freeport)
		while [ "$hport" = "$gport" ]; do hport=$(freeport); done
		case $mode in
		floor)
			onredis=0
			"$dir/floor" --addr "127.0.0.1:$gport" &
			pid=$!
			for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; (echo >"/dev/tcp/127.0.0.1/$gport") 2>/dev/null && break; sleep 0.1; done
			;;
		*)
			local store=redis://127.0.0.1:$rport/0 sync=()
			case $mode in
			memory) store=memory onredis=0 ;;
			lease | async) sync=(--sync "$mode") ;;
			esac
			redis-cli -p "$rport" flushall >/dev/null # every mode starts from no counts
			# shellcheck disable=SC2086 # SERVE_FLAGS is a list of flags
			"$bin" serve --rules "$dir/rules.yaml" --store "$store" "${sync[@]}" --grpc-addr "127.0.0.1:$gport" \
				--http-addr "127.0.0.1:$hport" --store-timeout 1s --log-level warn $SERVE_FLAGS &
			pid=$!
			for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; curl -sf "http://127.0.0.1:$hport/readyz" >/dev/null && break; sleep 0.1; done
			;;
		esac
		kill -0 "$pid" 2>/dev/null && break
		wait "$pid" 2>/dev/null || true
		[ "$attempt" = 3 ] && { echo "sidebyside.sh: $name did not start" >&2; exit 1; }
	done
	local zipf=()
	[ "$dist" = zipf ] && zipf=(--zipf "$ZIPF")
	local t0 r0 t1 r1 out
	t0=$(cpu_ticks "$pid")
	r0=$(redis_stats)
	out=$("$dir/sluice" bench --grpc-addr "127.0.0.1:$gport" --duration "${DURATION}s" --users "$USERS" \
		--concurrency "$CONCURRENCY" --rate "$RATE" "${zipf[@]}")
	t1=$(cpu_ticks "$pid")
	r1=$(redis_stats)
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	# decisions:   N (OK a, OVER_LIMIT b, errors c) / rate:        R decisions/s
	echo "$out" | awk -v name="$name" -v dist="$dist" -v round="$round" -v onredis="$onredis" -v tck="$tck" \
		-v t0="$t0" -v t1="$t1" -v r0="$r0" -v r1="$r1" '
		/^decisions:/ {n = $2; ok = $4 + 0; over = $6 + 0; errs = $8 + 0}
		/^rate:/ {rate = $2}
		/^latency:/ {p50 = ms($3); p99 = ms($7)}
		function ms(d) { return d ~ /ms$/ ? d + 0 : d ~ /µs$/ ? d / 1000 : d ~ /ns$/ ? d / 1e6 : d * 1000 }
		END {
			split(r0, a, " "); split(r1, b, " ")
			srv = n > 0 ? (t1 - t0) / tck * 1e6 / n : -1
			rcpu = onredis && n > 0 ? (b[1] - a[1]) * 1e6 / n : -1
			calls = onredis && n > 0 ? (b[3] - a[3]) / n : -1
			cmds = onredis && n > 0 ? (b[2] - a[2] - 1) / n : -1 # less the INFO that read them
			adm = n > 0 ? ok / n : 0
			printf "%s %s %s %d %.4f %.1f %.2f %.4f %d %.4f %.3f %.3f %d\n", round, dist, name, rate, adm, srv, rcpu, calls, errs, cmds, p50, p99, over
		}' >>"$dir/results"
	tail -n 1 "$dir/results" | awk '{
		printf "round %s  %-7s  %-14s  %7d/s  p50 %.2f p99 %.2f ms  admitted %5.1f%% (denied %d)  server %6.1f µs  redis %s µs  calls %s  commands %s%s\n",
			$1, $2, $3, $4, $11, $12, $5 * 100, $13, $6, $7 < 0 ? "-" : sprintf("%.2f", $7), $8 < 0 ? "-" : sprintf("%.4f", $8),
			$10 < 0 ? "-" : sprintf("%.3f", $10),
			($9 > 0) ? "  ERRORS " $9 : ""}'
}

offered="as fast as answered"
[ "$RATE" != 0 ] && offered="$RATE decisions/s offered"
echo "sidebyside: $ROUNDS rounds of ${DURATION}s, $USERS users, $CONCURRENCY callers ($offered), user at $LIMIT a $UNIT (fixed window), zipf $ZIPF"
for round in $(seq "$ROUNDS"); do
	for dist in $DISTS; do
		for mode in $MODES; do
			measure "$mode" "$dist" "$dir/sluice" "$mode"
			if [ -n "$BEFORE" ] && [ "$mode" != floor ]; then
				measure "$mode@before" "$dist" "$BEFORE" "$mode"
			fi
		done
	done
done

# The summary: per workload and mode, the median over the rounds and the
# range; × floor is the server's CPU over the floor's in the same round.
echo
echo "| users | mode | decisions/s | p99 ms | admitted | server CPU µs / decision | × floor | Redis CPU µs / decision | store calls / decision | Redis commands / decision |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
awk '
	{key = $2 SUBSEP $3; if (!(key in seen)) {seen[key] = 1; order[++k] = key}
	 rate[key, $1] = $4; p99[key, $1] = $12; adm[key, $1] = $5; srv[key, $1] = $6; red[key, $1] = $7; cal[key, $1] = $8; cmd[key, $1] = $10
	 if ($3 == "floor") floor[$2, $1] = $6; rounds[key] = rounds[key] " " $1}
	function stat(arr, key, fmt, scale,    n, i, r, v, vs, tmp, j) {
		n = split(substr(rounds[key], 2), r, " "); m = 0
		for (i = 1; i <= n; i++) { v = arr[key, r[i]]; if (v < 0) return "–"; vs[++m] = v * scale }
		for (i = 2; i <= m; i++) { tmp = vs[i]; for (j = i - 1; j >= 1 && vs[j] > tmp; j--) vs[j + 1] = vs[j]; vs[j + 1] = tmp }
		med = m % 2 ? vs[(m + 1) / 2] : (vs[m / 2] + vs[m / 2 + 1]) / 2
		if (m == 1) return sprintf(fmt, med)
		return sprintf(fmt " (" fmt "–" fmt ")", med, vs[1], vs[m])
	}
	END {
		for (i = 1; i <= k; i++) {
			key = order[i]; split(key, p, SUBSEP)
			n = split(substr(rounds[key], 2), r, " ")
			for (j = 1; j <= n; j++) ratio[key, r[j]] = (((p[1], r[j]) in floor) && floor[p[1], r[j]] > 0) ? srv[key, r[j]] / floor[p[1], r[j]] : -1
			printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p[1], p[2], stat(rate, key, "%.0f", 1), stat(p99, key, "%.1f", 1), stat(adm, key, "%.1f%%", 100),
				stat(srv, key, "%.1f", 1), p[2] == "floor" ? "1" : stat(ratio, key, "%.2f", 1), stat(red, key, "%.2f", 1), stat(cal, key, "%.3f", 1), stat(cmd, key, "%.2f", 1)
		}
	}' "$dir/results"
