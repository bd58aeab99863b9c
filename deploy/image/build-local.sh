#!/usr/bin/env bash
# Build the slinky-host image on a machine that reaches no image registry, from Debian's packages
# and buildah (Debian 12: `apt-get install buildah podman runc`), then push it to REGISTRY when
# given (a local `docker-registry`).
#
#   deploy/image/build-local.sh [TAG] [REGISTRY]
#   deploy/image/build-local.sh localhost/slinky-host:0.1.0 127.0.0.1:5000
#
# 1. The base: libc6 and libgcc-s1 unpacked from their Debian packages (the binary links nothing
#    else), the CA bundle of this machine (for plugins pulled from https registries), /tmp, and
#    the `nonroot` user 65532, as distroless has them. Imported as localhost/slinky-base:bookworm.
# 2. The binary: `cargo build --release --locked -p slinky-host`, stripped into build/image/.
# 3. The Dockerfile with BUILD=prebuilt and that base.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:-localhost/slinky-host:0.1.0}
registry=${2:-}
base=localhost/slinky-base:bookworm

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -qq libc6 libgcc-s1 >/dev/null)
mkdir -p "$work/rootfs"
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/rootfs"; done
rm -rf "$work/rootfs/usr/share/doc" "$work/rootfs/usr/share/lintian" "$work/rootfs/usr/share/locale"
mkdir -p "$work/rootfs/etc/ssl/certs" "$work/rootfs/tmp" "$work/rootfs/home/nonroot"
chmod 1777 "$work/rootfs/tmp"
cp /etc/ssl/certs/ca-certificates.crt "$work/rootfs/etc/ssl/certs/"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$work/rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$work/rootfs/etc/group"
chown 65532:65532 "$work/rootfs/home/nonroot"
tar -C "$work/rootfs" -c . | podman import --change 'USER 65532:65532' - "$base" >/dev/null
echo "base: $base ($(podman image inspect "$base" --format '{{.Size}}') bytes)"

cargo build --release --locked -p slinky-host
mkdir -p build/image
strip -o build/image/slinky-host target/release/slinky-host

buildah bud --layers --build-arg BUILD=prebuilt --build-arg RUNTIME_IMAGE="$base" -t "$tag" .
echo "image: $tag ($(podman image inspect "$tag" --format '{{.Size}}') bytes)"
podman run --rm "$tag" version

if [ -n "$registry" ]; then
  remote="$registry/${tag#*/}"
  podman push --tls-verify=false "$tag" "docker://$remote"
  echo "pushed: $remote"
fi
