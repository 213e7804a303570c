# Container images of the Quarry Coordinator (default target), of the
# quarry CLI (target "cli") and of the Marble injector (target
# "marble-injector"):
#
#   docker build --build-arg VERSION=v1.2.3 --build-arg COMMIT=$(git rev-parse HEAD) -t quarry-coordinator .
#   docker build --target cli -t quarry-cli .
#   docker build --target marble-injector -t quarry-marble-injector .
#
# VERSION and COMMIT are stamped into the binaries (coordinator --version,
# quarry version, marble-injector -version, the coordinator_version_info
# metric); without them a build reports the Go module's version, or
# "(devel)". The binaries are static (CGO_ENABLED=0), stripped (-s -w) and
# run as a non-root user on a distroless base without a shell. The seal
# directory is a volume. See docs/deployment.md. deploy/container's test
# checks this file and runs its go build lines.

ARG GO_VERSION=1.26
# Base image digests. NOT PINNED YET: the digests could not be looked up
# where this file was written (no registry access). Pin them for
# reproducible builds by passing, or setting here, "@sha256:<digest>" as
# printed by `docker buildx imagetools inspect golang:1.26-bookworm` and
# `... gcr.io/distroless/static-debian12:nonroot`; empty: the tags alone.
ARG GOLANG_DIGEST=
ARG DISTROLESS_DIGEST=

FROM golang:${GO_VERSION}-bookworm${GOLANG_DIGEST} AS build
ARG VERSION=
ARG COMMIT=
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
RUN go build -trimpath -ldflags="-s -w -X github.com/quarry-cc/quarry/internal/buildinfo.version=${VERSION} -X github.com/quarry-cc/quarry/internal/buildinfo.commit=${COMMIT}" -o /out/coordinator ./cmd/coordinator
RUN go build -trimpath -ldflags="-s -w -X github.com/quarry-cc/quarry/internal/buildinfo.version=${VERSION} -X github.com/quarry-cc/quarry/internal/buildinfo.commit=${COMMIT}" -o /out/quarry ./cmd/quarry
RUN go build -trimpath -ldflags="-s -w -X github.com/quarry-cc/quarry/internal/buildinfo.version=${VERSION} -X github.com/quarry-cc/quarry/internal/buildinfo.commit=${COMMIT}" -o /out/marble-injector ./cmd/marble-injector
# The seal directory, owned by the image's non-root user, so that a new
# volume mounted there starts with that owner.
RUN mkdir -m 0700 /out/data && chown 65532:65532 /out/data

# The quarry CLI: docker run --rm quarry-cli --help
FROM gcr.io/distroless/static-debian12:nonroot${DISTROLESS_DIGEST} AS cli
COPY --from=build /out/quarry /quarry
USER 65532:65532
ENTRYPOINT ["/quarry"]

# The Marble injector, the chart's mutating admission webhook
# (injector.enabled; docs/deployment.md, "Marble injector").
FROM gcr.io/distroless/static-debian12:nonroot${DISTROLESS_DIGEST} AS marble-injector
COPY --from=build /out/marble-injector /marble-injector
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/marble-injector"]

# The Coordinator (the default target, so last).
FROM gcr.io/distroless/static-debian12:nonroot${DISTROLESS_DIGEST} AS coordinator
COPY --from=build /out/coordinator /coordinator
COPY --from=build --chown=65532:65532 /out/data /data
ENV EDG_COORDINATOR_SEAL_DIR=/data \
    EDG_COORDINATOR_CLIENT_ADDR=:4433 \
    EDG_COORDINATOR_MESH_ADDR=:2001 \
    EDG_COORDINATOR_PROMETHEUS_ADDR=:9944
USER 65532:65532
VOLUME ["/data"]
# Client API (HTTPS), Marble API (gRPC over TLS), metrics and probes (HTTP).
EXPOSE 4433 2001 9944
ENTRYPOINT ["/coordinator"]
