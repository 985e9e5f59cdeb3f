#!/usr/bin/env bash
# release.sh builds a release of the commit HEAD names into dist/, with
# nothing pulled but Go modules: a plain script over go build, tar and
# gzip rather than goreleaser v2.15.1, a large module graph to fetch and
# build for what the few settings below do, in plain sight.
#
#   scripts/release.sh                    # VERSION: the tag at HEAD, else a pseudo-version
#   VERSION=v0.1.0 scripts/release.sh
#
# dist/ then holds, for version V:
#   sluice_V_OS_ARCH.tar.gz    linux and darwin, amd64 and arm64: the
#                              binary (version, commit and date stamped in:
#                              `sluice version`), LICENSE, README.md,
#                              CHANGELOG.md, SECURITY.md
#   sluice_V_sbom.cdx.json     a CycloneDX SBOM of the module graph
#                              (cyclonedx-gomod v1.10.0, run with go run)
#   sluice_V_image.tar         the image sluice:V (deploy/image/build.sh,
#                              OCI labels version, revision, source,
#                              licenses, created), as docker save writes it
#   sluice_V_checksums.txt     SHA-256 of each file above (sha256sum -c)
#
# Reproducible: the same commit and Go toolchain give the same archives and
# SBOM, byte for byte, in any directory, with or without a build cache: the sources are the
# commit's (git archive, so uncommitted changes never leak in), built with
# -trimpath, -buildid= and no version control stamp; the date is the
# commit's; tar entries are sorted with a fixed mtime, owner and mode, and
# gzip -n leaves out the name and time. The image's files are the same too
# (its layer's digest, with every mtime the commit's), and on one machine
# Docker's build cache gives the same image again; but a build without
# that cache records its own time in the image's config, so the image
# tarball's checksum holds for the file, not across machines.
#
# Settings (environment): VERSION; PLATFORMS (default all four, as
# "linux/amd64 linux/arm64 darwin/amd64 darwin/arm64"); IMAGE=0 to leave
# out the image (no Docker Engine); IMAGE_NAME (default sluice: the image
# is IMAGE_NAME:VERSION); DIST (default dist). Needs git, GNU tar,
# gzip, sha256sum, and Docker unless IMAGE=0.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export PATH="$PATH:/usr/local/go/bin"

platforms=${PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}
dist=${DIST:-dist}
image=${IMAGE_NAME:-sluice}
cyclonedx=github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0

tar --version 2>/dev/null | grep -q 'GNU tar' || { echo "release.sh: needs GNU tar (sorted entries, fixed mtime)" >&2; exit 1; }

commit=$(git rev-parse HEAD)
epoch=$(git log -1 --format=%ct HEAD)
date=$(TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd HEAD)
if [ -z "${VERSION:-}" ]; then
  # The tag at HEAD; else a pseudo-version before CHANGELOG.md's newest
  # version, as Go names an untagged commit: v0.1.0-0.TIME-COMMIT12.
  if ! VERSION=$(git describe --tags --exact-match --match 'v[0-9]*' HEAD 2>/dev/null); then
    next=$(sed -n 's/^## \[\{0,1\}\(v[0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' CHANGELOG.md | head -1)
    VERSION="${next:-v0.0.0}-0.$(TZ=UTC git log -1 --date=format-local:%Y%m%d%H%M%S --format=%cd HEAD)-${commit:0:12}"
  fi
fi
version=$VERSION
case "$version" in
v[0-9]*) ;;
*) echo "release.sh: VERSION $version: want vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2; exit 1 ;;
esac
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "release.sh: note: uncommitted changes are not in the release; it is of commit $commit" >&2
fi

work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
src=$work/src
mkdir -p "$src"
git archive --format=tar HEAD | tar -x -C "$src"
rm -rf "$dist"
mkdir -p "$dist"
dist=$(cd "$dist" && pwd)

# The Go settings that change a binary's bytes, fixed: no cgo, the
# baseline instruction sets, modules as go.sum names them.
export CGO_ENABLED=0 GOAMD64=v1 GOARM64=v8.0 GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=local
ldflags="-s -w -buildid= -X main.version=$version -X main.commit=$commit -X main.date=$date"

for p in $platforms; do
  os=${p%/*} arch=${p#*/}
  name=sluice_${version}_${os}_${arch}
  stage=$work/stage/$name
  mkdir -p "$stage"
  echo "release.sh: building $name" >&2
  (cd "$src" && GOOS=$os GOARCH=$arch go build -trimpath -ldflags="$ldflags" -o "$stage/sluice" ./cmd/sluice)
  cp "$src/LICENSE" "$src/README.md" "$src/CHANGELOG.md" "$src/SECURITY.md" "$stage/"
  chmod 0755 "$stage" "$stage/sluice"
  chmod 0644 "$stage"/*.md "$stage/LICENSE"
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --format=pax \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$work/stage" -cf - "$name" | gzip -n -9 >"$dist/$name.tar.gz"
done

# The SBOM: every module of the graph, with the licenses found in the
# module cache; no serial number and no timestamp (they would differ at
# each run: cyclonedx-gomod takes its time from the clock).
# cyclonedx-gomod reads the main module's version from a git tag at HEAD:
# the export gets a repository of its own, one commit of fixed dates
# tagged with the version, so that it names this version.
echo "release.sh: SBOM ($cyclonedx)" >&2
(
  cd "$src"
  export GIT_AUTHOR_NAME=release GIT_AUTHOR_EMAIL=release@localhost GIT_COMMITTER_NAME=release \
    GIT_COMMITTER_EMAIL=release@localhost GIT_AUTHOR_DATE="@$epoch +0000" GIT_COMMITTER_DATE="@$epoch +0000"
  git init -q -b release . && git add -A && git commit -q --no-gpg-sign -m "$commit" && git tag "$version"
  SOURCE_DATE_EPOCH=$epoch go run "$cyclonedx" mod -json -licenses -noserial -notimestamp \
    -output "$dist/sluice_${version}_sbom.cdx.json" . 2>"$work/sbom.log" || { cat "$work/sbom.log" >&2; exit 1; }
  rm -rf .git
)

if [ "${IMAGE:-1}" != 0 ]; then
  arch=$(docker version --format '{{.Server.Arch}}')
  echo "release.sh: image $image:$version (linux/$arch)" >&2
  (cd "$src" && GOOS=linux GOARCH=$arch go build -trimpath -ldflags="$ldflags" -o "$work/image-sluice" ./cmd/sluice)
  BINARY=$work/image-sluice SOURCE_DATE_EPOCH=$epoch "$src/deploy/image/build.sh" -q -t "$image:$version" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$commit" --build-arg "CREATED=$date" >/dev/null
  docker save -o "$dist/sluice_${version}_image.tar" "$image:$version"
  chmod 0644 "$dist/sluice_${version}_image.tar"
fi

(cd "$dist" && sha256sum -- * >"$work/checksums.txt" && mv "$work/checksums.txt" "sluice_${version}_checksums.txt")
echo "release.sh: $dist/ holds sluice $version ($commit, $date):" >&2
ls -l "$dist" >&2
