#!/bin/sh
# build.sh [docker build options] builds the sluice image with nothing
# pulled: rootfs.sh lays out the image's files with this machine's Go
# toolchain (in place of the Dockerfile's golang build stage), and Docker
# builds the Dockerfile's final stage, unchanged, from them.
#
#   deploy/image/build.sh -t sluice
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
"$repo/deploy/image/rootfs.sh" "$ctx/out"
{
  echo 'FROM scratch AS build'
  echo 'COPY out/ /out/'
  sed -n '/^FROM scratch$/,$p' "$repo/Dockerfile"
} >"$ctx/Dockerfile"
docker build "$@" "$ctx"
