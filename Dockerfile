# syntax=docker/dockerfile:1
#
# pleg-bridge container image: a static binary on distroless, nothing else.
#
#   docker build -t pleg-bridge --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg REVISION=$(git rev-parse HEAD) .
#
# .git stays out of the build context, so the binary has no VCS information
# of its own: VERSION and REVISION reach it through the linker, and
# `pleg-bridge version` and pleg_bridge_build_info report them.
#
# The image runs as the distroless "nonroot" user (UID/GID 65532) by default.
# That is right for every subcommand except "run" against a real node: the
# CRI socket (containerd's /run/containerd/containerd.sock, CRI-O's
# /run/crio/crio.sock) is usually root:root 0660, so a process can connect to
# it only as root or with the socket's group. Hence:
#   - Kubernetes (deploy/kubernetes/daemonset.yaml) runs the container as
#     UID 0 but with every capability dropped, a read-only root filesystem and
#     no privilege escalation: root only for the socket's file permissions,
#     none of root's kernel privileges.
#   - A non-root UID works where the socket's group is granted to the pod
#     (runAsGroup or supplementalGroups set to the socket's GID, e.g. after
#     `chgrp pleg /run/containerd/containerd.sock` on the node).
#   - docker-compose.yml sets user "0:0" for the same reason.
# No HEALTHCHECK: distroless has no shell or HTTP client. Probe /healthz and
# /readyz on port 9470 from outside (Kubernetes probes do).

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
ARG REVISION=unknown
WORKDIR /src
# Dependencies first, so that a source change does not download them again.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=bind,source=go.mod,target=go.mod \
    --mount=type=bind,source=go.sum,target=go.sum \
    go mod download
COPY . .
# CGO off: a static binary, which is what distroless/static expects.
# -trimpath and -s -w: reproducible paths and a smaller binary.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${REVISION}" \
        -o /out/pleg-bridge ./cmd/pleg-bridge

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="pleg-bridge" \
      org.opencontainers.image.description="Kubernetes container lifecycle events from the node's CRI runtime to NATS JetStream as CloudEvents" \
      org.opencontainers.image.source="https://github.com/pleg-bridge/pleg-bridge" \
      org.opencontainers.image.url="https://github.com/pleg-bridge/pleg-bridge" \
      org.opencontainers.image.documentation="https://github.com/pleg-bridge/pleg-bridge#readme" \
      org.opencontainers.image.vendor="pleg-bridge" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/pleg-bridge /pleg-bridge
# Non-root by default; see the note at the top for the CRI socket.
USER 65532:65532
# /metrics, /healthz and /readyz (PLEG_LISTEN_ADDRESS, default :9470).
EXPOSE 9470
ENTRYPOINT ["/pleg-bridge"]
CMD ["run"]
