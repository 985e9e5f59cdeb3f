#!/bin/sh
# build.sh [docker build options] builds the sluice image with nothing
# pulled: rootfs.sh lays out the image's files with this machine's Go
# toolchain (in place of the Dockerfile's golang build stage), and Docker
# builds the Dockerfile's final stage, unchanged, from them.
#
#   deploy/image/build.sh -t sluice
#
# SOURCE_DATE_EPOCH, when set (scripts/release.sh sets the commit's time),
# is the modification time of every file of the image, so that the same
# files make the same layer (digest) in every build.
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
"$repo/deploy/image/rootfs.sh" "$ctx/out"
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
  find "$ctx/out" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
fi
{
  echo 'FROM scratch AS build'
  echo 'COPY out/ /out/'
  sed -n '/^FROM scratch$/,$p' "$repo/Dockerfile"
} >"$ctx/Dockerfile"
docker build "$@" "$ctx"
