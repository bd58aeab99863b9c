# slinky-host with its bundled builder plugins, in one binary.
#
#   docker build -t registry.example.com/slinky-host:0.1.0 .
#
# Stage 1 builds the host; its build script compiles the bundled plugins (plugins/*) for
# wasm32-wasip2 and embeds them in the binary. Stage 2 is a minimal non-root runtime: the binary
# is the only file it needs (it links only glibc, libgcc and libm, which the distroless `cc` image has).
FROM docker.io/library/rust:1.95-bookworm AS build
RUN rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p slinky-host \
 && install -m 0755 target/release/slinky-host /slinky-host

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /slinky-host /usr/local/bin/slinky-host
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/slinky-host"]
CMD ["run", "--leader-elect", "--http-addr", "0.0.0.0:8080"]
