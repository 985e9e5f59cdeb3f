#!/bin/sh
# rootfs.sh DIR lays out, under DIR, every file of the sluice image: the
# static binary at /sluice and /bin/ratelimit (the name Envoy ratelimit's
# Deployments run), Debian's CA bundle (for rediss:// and TLS), a minimal
# /etc/passwd and /etc/group naming the unprivileged user sluice (65532),
# an empty /tmp, the image's settings (deploy/image/sluice.yaml) and the
# example rules. The Dockerfile's build stage runs it in golang; build.sh
# beside it runs it with the Go toolchain of the machine. VERSION, when
# set, is what `sluice version` prints.
set -eu
out=$1
cd "$(dirname "$0")/../.."
mkdir -p "$out/bin" "$out/etc/ssl/certs" "$out/etc/sluice/rules" "$out/tmp"
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION:-}" -o "$out/sluice" ./cmd/sluice
ln -sfn /sluice "$out/bin/ratelimit"
cp /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nsluice:x:65532:65532:sluice:/nonexistent:/sbin/nologin\n' >"$out/etc/passwd"
printf 'root:x:0:\nsluice:x:65532:\n' >"$out/etc/group"
cp deploy/image/sluice.yaml "$out/etc/sluice/sluice.yaml"
cp examples/rules.yaml "$out/etc/sluice/rules/rules.yaml"
chmod 1777 "$out/tmp"
chmod -R go-w,a+rX "$out/bin" "$out/etc" "$out/sluice"
