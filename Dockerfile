# Multi-stage build of the ringlimit image, for machines that can pull
# golang:1.26 (Docker Hub). The result is the same as the no-pull path
# (scripts/image.sh + deploy/Dockerfile.scratch): a static binary in
# FROM scratch, CA certificates, a non-root user, /data as a volume.
#   docker build -t ringlimit:dev .
# Not built by this repository's CI: its Docker engine has no registry.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags='-s -w' -o /out/ringlimit ./cmd/ringlimit \
 && mkdir /out/data

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY deploy/image/passwd /etc/passwd
COPY deploy/image/group /etc/group
COPY --from=build --chown=65532:65532 /out/data /data
COPY --from=build /out/ringlimit /ringlimit
USER 65532:65532
ENV RINGLIMIT_DATA_DIR=/data
VOLUME ["/data"]
WORKDIR /data
# HTTP (API, /metrics, /healthz, /readyz), Raft, data plane.
EXPOSE 8080 8081 8082
ENTRYPOINT ["/ringlimit"]
# Alone it is a single-node cluster: HTTP for everyone, Raft and the data
# plane on loopback. Members of a real cluster get their flags from
# RINGLIMIT_* (see deploy/compose, deploy/k8s).
CMD ["serve", "--http", "0.0.0.0:8080", "--advertise-host", "127.0.0.1"]
