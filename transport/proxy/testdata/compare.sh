#!/usr/bin/env bash
# compare.sh measures sluice's proxy and forward-auth against nginx's own
# limit_req in one run (issue 17): the same static nginx upstream behind
#
#   floor     nginx as a bare reverse proxy (no limit): the least a proxy costs
#   limit_req nginx as a reverse proxy with limit_req per client IP
#   sluice    sluice proxy with one limit per client IP
#   auth      nginx with auth_request to sluice serve's forward-auth
#
# with limits so high that every request passes, in alternating rounds, and
# prints for each round and configuration the requests/s and p99 latency of
# wrk (-t2 -c50) and the CPU time per request of the proxy's processes
# (nginx's master and workers, sluice's process; for auth both), then the
# medians and sluice's ratios to limit_req. Needs nginx and wrk (Debian's
# packages, as the nginx test) and go. Everything listens on 127.0.0.1.
#
#   transport/proxy/testdata/compare.sh                 # 5 rounds of 10 s
#   ROUNDS=3 DURATION=5 transport/proxy/testdata/compare.sh
#   PORT=19100 ...                                      # first of 8 ports
#   BEFORE=/path/to/old/sluice ...                      # also that binary's proxy
#
# With BEFORE, a fifth configuration, before, runs that sluice binary's
# proxy as sluice's, in the same rounds: before and after in one run.
set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
PORT=${PORT:-19000}
CONNS=${CONNS:-50}
BEFORE=${BEFORE:-}

for tool in nginx wrk go; do
	command -v "$tool" >/dev/null || { [ "$tool" = nginx ] && [ -x /usr/sbin/nginx ]; } ||
		{ echo "compare.sh: $tool not found (apt-get install nginx wrk)" >&2; exit 1; }
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

root=$(cd "$(dirname "$0")/../../.." && pwd)
dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT

up=$PORT floor=$((PORT + 1)) limit=$((PORT + 2)) auth=$((PORT + 3)) proxy=$((PORT + 4)) serve=$((PORT + 5)) grpc=$((PORT + 6)) before=$((PORT + 7))

(cd "$root" && go build -o "$dir/sluice" ./cmd/sluice)

cat >"$dir/rules.yaml" <<EOF
domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
EOF
cat >"$dir/identity.yaml" <<EOF
domain: bench
trusted_proxies: [127.0.0.1/32]
forward_auth_headers: X-Original
rate_limits:
  - actions: [{remote_address: {}}]
EOF

# nginx NAME BODY starts an nginx of its own (master and workers) with the
# http block BODY and records its master's pid in pid_NAME.
nginx_start() {
	local name=$1 body=$2 d="$dir/nginx-$1"
	mkdir -p "$d"
	cat >"$d/nginx.conf" <<EOF
worker_processes auto;
events { worker_connections 4096; }
http {
    access_log off;
    upstream app { server 127.0.0.1:$up; keepalive 64; }
    $body
}
EOF
	"$NGINX" -p "$d" -e "$d/error.log" -c "$d/nginx.conf" -g "daemon off; pid $d/nginx.pid; error_log $d/error.log warn;" &
	pids+=($!)
	eval "pid_$name=$!"
}

nginx_start upstream "server { listen 127.0.0.1:$up; location / { return 200 \"ok\n\"; } }"
proxy_to_app='proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection "";'
nginx_start floor "server { listen 127.0.0.1:$floor; location / { $proxy_to_app } }"
nginx_start limit "limit_req_zone \$binary_remote_addr zone=ip:10m rate=100000000r/s;
    server { listen 127.0.0.1:$limit; location / { limit_req zone=ip burst=100000000 nodelay; $proxy_to_app } }"
nginx_start auth "upstream sluice { server 127.0.0.1:$serve; keepalive 64; }
    server { listen 127.0.0.1:$auth;
        location / { auth_request /_sluice; $proxy_to_app }
        location = /_sluice { internal; proxy_pass http://sluice/v1/auth; proxy_http_version 1.1;
            proxy_set_header Connection \"\"; proxy_pass_request_body off; proxy_set_header Content-Length \"\";
            proxy_set_header X-Original-URI \$request_uri; proxy_set_header X-Original-Method \$request_method;
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; } }"

"$dir/sluice" proxy --upstream "http://127.0.0.1:$up" --rules "$dir/rules.yaml" --domain bench \
	--listen "127.0.0.1:$proxy" --log-level warn &
pids+=($!)
pid_sluice=$!
ports="$up $floor $limit $auth $proxy $serve"
if [ -n "$BEFORE" ]; then
	"$BEFORE" proxy --upstream "http://127.0.0.1:$up" --rules "$dir/rules.yaml" --domain bench \
		--listen "127.0.0.1:$before" --log-level warn &
	pids+=($!)
	pid_before=$!
	ports="$ports $before"
fi
"$dir/sluice" serve --rules "$dir/rules.yaml" --identity "$dir/identity.yaml" --http-addr "127.0.0.1:$serve" \
	--grpc-addr "127.0.0.1:$grpc" --log-level warn &
pids+=($!)
pid_serve=$!

for port in $ports; do
	for _ in $(seq 100); do
		curl -fs -o /dev/null "http://127.0.0.1:$port/" && break
		[ "$port" = "$serve" ] && curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break
		sleep 0.1 # a process starting: no other signal to wait on from a shell
	done
done
curl -fs -o /dev/null "http://127.0.0.1:$auth/" || { echo "compare.sh: auth_request path does not answer 200" >&2; exit 1; }

# ticks PID... prints the user+system CPU ticks of the processes and their
# children (nginx's workers).
ticks() {
	local total=0 p c
	for p in "$@"; do
		for c in "$p" $(pgrep -P "$p" || true); do
			[ -r "/proc/$c/stat" ] || continue
			total=$((total + $(awk '{print $14 + $15}' "/proc/$c/stat")))
		done
	done
	echo "$total"
}
hz=$(getconf CLK_TCK)

# run NAME PORT PIDS... runs wrk once and prints NAME rps p99 cpu-µs/req.
run() {
	local name=$1 port=$2
	shift 2
	local before after out rps p99
	before=$(ticks "$@")
	out=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$port/")
	after=$(ticks "$@")
	rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
	p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
	awk -v n="$name" -v r="$rps" -v p="$p99" -v t=$((after - before)) -v hz="$hz" -v d="$DURATION" \
		'BEGIN { printf "%-9s %10.0f %9s %8.1f\n", n, r, p, t / hz * 1e6 / (r * d) }'
}

results="$dir/results"
printf "%-9s %10s %9s %8s\n" config req/s p99 cpu-µs/req
for r in $(seq "$ROUNDS"); do
	echo "# round $r"
	run floor "$floor" "$pid_floor" | tee -a "$results"
	run limit_req "$limit" "$pid_limit" | tee -a "$results"
	run sluice "$proxy" "$pid_sluice" | tee -a "$results"
	run auth "$auth" "$pid_auth" "$pid_serve" | tee -a "$results"
	if [ -n "$BEFORE" ]; then run before "$before" "$pid_before" | tee -a "$results"; fi
done

echo "# medians over $ROUNDS rounds of ${DURATION}s"
awk '
	function median(a, n,   i, j, t) {
		for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	{ n[$1]++; rps[$1, n[$1]] = $2; cpu[$1, n[$1]] = $4 }
	END {
		split("floor limit_req sluice auth before", names, " ")
		for (k = 1; k <= 5; k++) {
			c = names[k]; delete a; delete b
			if (!n[c]) continue
			for (i = 1; i <= n[c]; i++) { a[i] = rps[c, i]; b[i] = cpu[c, i] }
			mr[c] = median(a, n[c]); mc[c] = median(b, n[c])
			printf "%-9s %10.0f %9s %8.1f\n", c, mr[c], "", mc[c]
		}
		printf "sluice proxy / limit_req: %.2f x the requests/s (issue 17: at least 0.8), %.2f x the CPU per request (at most 1.5)\n", mr["sluice"] / mr["limit_req"], mc["sluice"] / mc["limit_req"]
		printf "auth_request / limit_req: %.2f x the requests/s (issue 17: at least 0.6)\n", mr["auth"] / mr["limit_req"]
		if (n["before"]) printf "sluice proxy / before: %.2f x the requests/s, %.2f x the CPU per request\n", mr["sluice"] / mr["before"], mc["sluice"] / mc["before"]
	}' "$results"
