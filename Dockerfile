# syntax=docker/dockerfile:1
# SPDX-License-Identifier: Apache-2.0
# Copyright The ipam-dev/ipam Authors

# Build a static server binary.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /ipam-server ./cmd/server

# Run it on distroless, as the unprivileged "nonroot" user (65532). The image
# has no PostgreSQL: set IPAM_DATABASE_URL.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /ipam-server /ipam-server
LABEL org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/ipam-dev/ipam"
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/ipam-server"]
CMD ["serve"]
