#!/usr/bin/env bash
# Runs the weather suite's full matrix (package weather/, issue 31): every
# weather, one sluice server and three on one Redis, every flag at its
# default, and prints its markdown table (docs/stores.md, "Weather").
# Needs redis-server and taskset; about 6 minutes. The table is also left
# in the file given as the first argument, if any.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp)}
status=0
go test -count=1 -timeout 30m -run 'TestWeather$' ./weather -weather.full -weather.out "$out" >&2 || status=$?
cat "$out"
exit $status
