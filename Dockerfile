# The sluice image: a static binary (CGO_ENABLED=0: no libc), Debian's CA
# bundle (for rediss://), a minimal /etc/passwd naming the unprivileged
# user it runs as (sluice, 65532), /bin/ratelimit for Envoy ratelimit's
# Deployments, the example rules at /etc/sluice/rules, and
# deploy/image/sluice.yaml (SLUICE_CONFIG), which makes it listen on all
# interfaces; flags, SLUICE_ variables and Envoy ratelimit's variables win
# over it. deploy/image/rootfs.sh lays out all of these files.
#
#   docker build -t sluice --build-arg VERSION=v1.0.0 .   # builds in golang
#   deploy/image/build.sh -t sluice                       # builds with your Go: nothing pulled
#   docker run --rm -p 8080:8080 -p 8081:8081 sluice
#
# build.sh runs rootfs.sh on the machine in place of the build stage and
# builds the final stage, from its FROM line on, as it is here.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=
RUN deploy/image/rootfs.sh /out

FROM scratch
# The OCI annotations of the image: scripts/release.sh passes the version,
# the commit and its time; a plain build leaves them empty.
ARG VERSION=
ARG REVISION=
ARG CREATED=
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="A distributed rate limiter: Envoy's rate limit service, an HTTP API, a proxy" \
      org.opencontainers.image.source="https://github.com/sluicehq/sluice" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
COPY --from=build /out/ /
ENV SLUICE_CONFIG=/etc/sluice/sluice.yaml
USER 65532:65532
# 8080: HTTP API, /healthz, /readyz, /healthcheck, /metrics; 8081: Envoy's gRPC rate limit API.
EXPOSE 8080 8081
ENTRYPOINT ["/sluice"]
CMD ["serve"]
