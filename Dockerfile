# syntax=docker/dockerfile:1
# A small static image of the payments service (and the card processor
# simulator, procsim, that docker-compose.yml runs beside it for development):
# docker build -t payments .
# The build context leaves out what .dockerignore lists (.git, bin/, docs/, ...).
# No HEALTHCHECK here: migrate and consume run this image too, without a server;
# docker-compose.yml gives the payments service one (payments healthcheck).

FROM golang:1.26 AS build
WORKDIR /src
# The service's module alone, with the Go client its replace names: the
# context has no go.work (it lists the lab too, which the image leaves out).
COPY go.mod go.sum ./
COPY client/go.mod client/go.sum client/
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# What `payments version` and payments_build_info report. The context has no
# .git, so go build stamps no commit: pass them as make image does,
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg COMMIT=$(git rev-parse HEAD) -t payments .
# Unset, the binary says "(devel)" and "unknown"; BUILD_TIME defaults to now.
ARG VERSION=""
ARG COMMIT=""
ARG BUILD_TIME=""
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath \
      -ldflags="-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.buildTime=${BUILD_TIME:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}" \
      -o /out/payments ./cmd/payments && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/procsim ./cmd/procsim

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/payments /usr/local/bin/payments
# The card processor simulator (docs/processors.md), for development stacks.
COPY --from=build /out/procsim /usr/local/bin/procsim
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/payments"]
CMD ["serve"]
