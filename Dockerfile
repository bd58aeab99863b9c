# syntax=docker/dockerfile:1.7
# slinky-host with its bundled builder plugins, in one binary.
#
#   docker build -t registry.example.com/slinky-host:0.1.0 .
#   docker run --rm registry.example.com/slinky-host:0.1.0 version   # version and plugin digests
#
# Stage 1 builds the host; the plugin runtime's build script compiles the bundled plugins (plugins/*) for
# wasm32-wasip2, reproducibly (no build-machine path inside: the digests equal those of any other
# build of the same source), and embeds them in the binary. The cargo registry and the target
# directory are BuildKit cache mounts: a source change rebuilds the workspace crates and the
# plugins, not the ~400 dependencies. Stage 2 is a minimal non-root runtime: the binary is the only
# file it needs (it links only glibc, libgcc and libm, which the distroless `cc` image has).
#
# Where no image registry is reachable, `deploy/image/build-local.sh` builds the same image from
# Debian's packages with buildah: a base of libc6 and libgcc-s1 (the binary's only libraries) as
# RUNTIME_IMAGE, and the binary built outside (BUILD=prebuilt, from build/image/slinky-host).
ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG BUILD=source

FROM ${RUST_IMAGE} AS build-source
RUN rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p slinky-host \
 && install -s -m 0755 target/release/slinky-host /slinky-host \
 && /slinky-host version

# The binary `cargo build --release -p slinky-host` made outside, stripped into build/image/.
FROM ${RUNTIME_IMAGE} AS build-prebuilt
COPY build/image/slinky-host /slinky-host

FROM build-${BUILD} AS build

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="slinky-host" \
      org.opencontainers.image.description="A WebAssembly-pluggable reconciliation host for Slinky (Slurm on Kubernetes)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /slinky-host /usr/local/bin/slinky-host
# glibc's malloc: 2 arenas, not 8 per core (less fragmentation; docs/benchmarks.md, scale benchmark).
ENV MALLOC_ARENA_MAX=2
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/slinky-host"]
CMD ["run", "--leader-elect", "--http-addr", "0.0.0.0:8080"]
