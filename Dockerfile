# Container image of the Quarry Coordinator (default target) and of the
# quarry CLI (target "cli"):
#
#   docker build -t quarry-coordinator .            (or: podman build ...)
#   docker build --target cli -t quarry-cli .
#
# Both binaries are static (CGO_ENABLED=0) and run as a non-root user on a
# distroless base without a shell. The seal directory is a volume. See
# docs/deployment.md. deploy/container's test checks this file and runs its
# go build lines.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
RUN go build -trimpath -o /out/coordinator ./cmd/coordinator
RUN go build -trimpath -o /out/quarry ./cmd/quarry
# The seal directory, owned by the image's non-root user, so that a new
# volume mounted there starts with that owner.
RUN mkdir -m 0700 /out/data && chown 65532:65532 /out/data

# The quarry CLI: docker run --rm quarry-cli --help
FROM gcr.io/distroless/static-debian12:nonroot AS cli
COPY --from=build /out/quarry /quarry
USER 65532:65532
ENTRYPOINT ["/quarry"]

# The Coordinator (the default target, so last).
FROM gcr.io/distroless/static-debian12:nonroot AS coordinator
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
