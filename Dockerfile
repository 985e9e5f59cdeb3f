# syntax=docker/dockerfile:1
#
# The sluice image: a static binary (CGO_ENABLED=0: no libc, no /etc files
# needed) on distroless/static, which adds only CA certificates (for
# rediss://), time zones and an unprivileged user, run as that user
# (nonroot, 65532). deploy/image/sluice.yaml makes it listen on all
# interfaces; flags, SLUICE_ variables and Envoy ratelimit's variables win
# over it. cmd/sluice's TestStaticBinary runs the same build the way this
# image runs it.
#
#   docker build -t sluice --build-arg VERSION=v1.0.0 .
#   docker run --rm -p 8080:8080 -p 8081:8081 sluice

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/sluice ./cmd/sluice
# Envoy ratelimit's image runs /bin/ratelimit, and Deployments name it in
# their command: run as "ratelimit" without arguments, sluice serves.
RUN mkdir -p /out/bin && ln -s /sluice /out/bin/ratelimit

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sluice /sluice
COPY --from=build /out/bin/ /bin/
COPY deploy/image/sluice.yaml /etc/sluice/sluice.yaml
COPY examples/rules.yaml /etc/sluice/rules/rules.yaml
ENV SLUICE_CONFIG=/etc/sluice/sluice.yaml
USER 65532:65532
# 8080: HTTP API, /healthz, /readyz, /healthcheck, /metrics; 8081: Envoy's gRPC rate limit API.
EXPOSE 8080 8081
ENTRYPOINT ["/sluice"]
CMD ["serve"]
