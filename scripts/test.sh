#!/usr/bin/env bash
# Runs every test of sluice on a fresh Debian machine: installs what the
# tests need (Redis, nginx, chromium) from Debian's packages when missing, starts a
# standalone Redis and a Redis Cluster on free loopback ports, runs gofmt,
# go vet and all tests with the race detector, and stops the servers.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin" # nginx lives in /usr/sbin

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v nginx >/dev/null || need+=(nginx)
# Debian's chromium, for the dashboard's browser test (TestDashboardBrowser).
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts the packaged services; the tests start their own.
  as_root systemctl stop redis-server nginx >/dev/null 2>&1 || as_root service redis-server stop >/dev/null 2>&1 || true
fi

# Caddy, for the end-to-end test of the Caddy forward-auth recipe: built
# from the Go module proxy at the version internal/testenv names (about
# 1.5 minutes on a 2-core machine with an empty module cache).
gobin="$(go env GOPATH)/bin"
caddy_version=$(sed -n 's/^const CaddyVersion = "\(.*\)"$/\1/p' internal/testenv/caddy.go)
if ! command -v caddy >/dev/null && [ ! -x "$gobin/caddy" ]; then
  echo "building caddy $caddy_version"
  GOFLAGS= go install "github.com/caddyserver/caddy/v2/cmd/caddy@$caddy_version"
fi

if [ -x scripts/test-env.sh ]; then
  env_out=$(scripts/test-env.sh start)
  eval "$env_out"
  trap 'scripts/test-env.sh stop' EXIT
fi

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
go vet ./...
go test -race -shuffle=on -timeout 15m "$@" ./...
# deploy/ is a module of its own, so that the Kubernetes types its tests
# decode the manifests into stay out of sluice's dependencies.
(cd deploy && go vet ./... && go test -shuffle=on "$@" ./...)
