#!/usr/bin/env bash
# Runs every test of sluice on a fresh Debian machine: installs what the
# tests need (Redis, nginx, chromium, python3) from Debian's packages when missing, starts a
# standalone Redis and a Redis Cluster on free loopback ports, runs gofmt,
# go vet, staticcheck and all tests with the race detector, and stops the servers.
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
# python3's http.server is the application of the README's recipes, which
# docs/blocks_test.go runs.
command -v python3 >/dev/null || need+=(python3)
# deploy/image's tests build the image and run it on the machine's Docker
# Engine (started before this script; they fail under CI=true without
# it), the Envoy quickstart with docker-compose, the README's Docker block
# with curl.
if command -v docker >/dev/null; then
  command -v docker-compose >/dev/null || need+=(docker-compose)
  command -v curl >/dev/null || need+=(curl)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  # Debian would start the packaged redis-server and nginx, and a package
  # whose service fails to start (port 80 or 6379 taken on the machine)
  # fails to install: the tests start their own servers, so a policy-rc.d
  # keeps the packages' from starting while they install (unless the
  # machine has a policy of its own).
  policy=/usr/sbin/policy-rc.d made_policy=0
  if [ ! -e "$policy" ]; then
    trap 'as_root rm -f "$policy"' EXIT
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod 755 "$policy"
    made_policy=1
  fi
  # A fresh machine may be running apt itself (apt-daily, unattended
  # upgrades): wait for its lock instead of failing.
  apt_opts=(-o DPkg::Lock::Timeout=600)
  as_root apt-get "${apt_opts[@]}" update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  if [ "$made_policy" = 1 ]; then
    as_root rm -f "$policy"
    trap - EXIT
  fi
  # Services a machine's own policy let start: stopped, each on its own.
  for svc in redis-server nginx; do
    as_root systemctl stop "$svc" >/dev/null 2>&1 || as_root service "$svc" stop >/dev/null 2>&1 || true
  done
fi

# Caddy, for the end-to-end test of the Caddy forward-auth recipe: built
# from the Go module proxy at the version internal/testenv names (about
# 1.5 minutes on a 2-core machine with an empty module cache).
gobin="$(go env GOPATH)/bin"
caddy_version=$(sed -n 's/^const CaddyVersion = "\(.*\)"$/\1/p' internal/testenv/caddy.go)
if ! command -v caddy >/dev/null && [ ! -x "$gobin/caddy" ]; then
  echo "building caddy $caddy_version"
  # Into $(go env GOPATH)/bin, where the tests look, whatever GOBIN says.
  GOFLAGS= GOBIN="$gobin" go install "github.com/caddyserver/caddy/v2/cmd/caddy@$caddy_version"
fi

# staticcheck, at the version the house style's checks are made with, into the
# same directory (a minute or so to build with an empty module cache).
staticcheck_version=v0.8.2
if ! "$gobin/staticcheck" -version 2>/dev/null | grep -q "(${staticcheck_version#v})"; then
  echo "installing staticcheck $staticcheck_version"
  GOFLAGS= GOBIN="$gobin" go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
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
"$gobin/staticcheck" ./...
go test -race -shuffle=on -timeout 15m "$@" ./...
# deploy/ is a module of its own, so that the Kubernetes types its tests
# decode the manifests into stay out of sluice's dependencies; its image
# tests run containers (about 3 minutes on a busy 2-core machine), its
# release test runs scripts/release.sh twice for linux/amd64 (reproducible,
# checksums, SBOM, image labels), its upgrade test builds the previous
# version from git and upgrades three servers to this one under load.
(cd deploy && go vet ./... && go test -shuffle=on "$@" ./...)
