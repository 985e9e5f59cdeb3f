#!/bin/sh
# rootfs.sh DIR lays out, under DIR, every file of the sluice image: the
# static binary at /sluice and /bin/ratelimit (the name Envoy ratelimit's
# Deployments run), Debian's CA bundle (for rediss:// and TLS), a minimal
# /etc/passwd and /etc/group naming the unprivileged user sluice (65532),
# an empty /tmp, the image's settings (deploy/image/sluice.yaml) and the
# example rules. The Dockerfile's build stage runs it in golang; build.sh
# beside it runs it with the Go toolchain of the machine. VERSION, when
# set, is what `sluice version` prints. BINARY, when set, is a static
# linux binary of sluice to use instead of building one (scripts/release.sh
# gives the one it stamped with the version, commit and date).
set -eu
out=$1
cd "$(dirname "$0")/../.."
mkdir -p "$out/bin" "$out/etc/ssl/certs" "$out/etc/sluice/rules" "$out/tmp"
if [ -n "${BINARY:-}" ]; then
  cp "$BINARY" "$out/sluice"
else
  CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION:-}" -o "$out/sluice" ./cmd/sluice
fi
ln -sfn /sluice "$out/bin/ratelimit"
cp /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nsluice:x:65532:65532:sluice:/nonexistent:/sbin/nologin\n' >"$out/etc/passwd"
printf 'root:x:0:\nsluice:x:65532:\n' >"$out/etc/group"
cp deploy/image/sluice.yaml "$out/etc/sluice/sluice.yaml"
cp examples/rules.yaml "$out/etc/sluice/rules/rules.yaml"
chmod 1777 "$out/tmp"
chmod -R go-w,a+rX "$out/bin" "$out/etc" "$out/sluice"
