# ratelimitd's image, for a machine with a container daemon:
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t ghcr.io/ratelimitd/ratelimitd:TAG .
#
# It holds what `make image` assembles without one (internal/image): a
# static binary at /bin/ratelimitd and /bin/ratelimit, the CA bundle,
# passwd and group, on scratch; user 65534:65534; nothing written at run
# time, so it runs with readOnlyRootFilesystem. internal/image's tests parse
# this file and check its user, paths, ports, build flags and labels
# against the Go-built image.

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -buildvcs=false -ldflags="-s -w" -o /out/bin/ratelimitd ./cmd/ratelimitd \
 && ln /out/bin/ratelimitd /out/bin/ratelimit \
 && mkdir -p /out/etc/ssl/certs \
 && cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt \
 && cp internal/image/rootfs/etc/passwd internal/image/rootfs/etc/group /out/etc/ \
 && chmod 0644 /out/etc/passwd /out/etc/group /out/etc/ssl/certs/ca-certificates.crt

FROM scratch
COPY --from=build /out/ /
USER 65534:65534
ENV PATH=/bin
WORKDIR /
EXPOSE 8080 8081 6070 19001
LABEL org.opencontainers.image.title="ratelimitd" \
      org.opencontainers.image.description="Envoy-compatible global rate-limit service (token buckets, Redis); a drop-in for envoyproxy/ratelimit" \
      org.opencontainers.image.source="https://github.com/ratelimitd/ratelimitd" \
      org.opencontainers.image.url="https://github.com/ratelimitd/ratelimitd"
ENTRYPOINT ["/bin/ratelimitd"]
