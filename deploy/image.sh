#!/bin/sh
# Builds dnstrace's container image from a built binary, with no network:
# the binary and what `ldd` says it links, on `scratch`.
#   deploy/image.sh BINARY TAG [ARCHIVE]
# ARCHIVE, if given, is an OCI archive of the image (`podman save`), for
# `ctr -n k8s.io images import` on a node with no registry.
set -eu
bin=$1 tag=$2 archive=${3:-}
[ -x "$bin" ] || { echo "image.sh: $bin is not a built binary (cargo build --release first)" >&2; exit 1; }
command -v podman >/dev/null || { echo "image.sh: podman is missing (apt-get install podman)" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/rootfs/usr/bin" "$ctx/rootfs/tmp" "$ctx/rootfs/var/lib/dnstrace"
chmod 1777 "$ctx/rootfs/tmp"
cp "$bin" "$ctx/rootfs/usr/bin/dnstrace"
# Each library at the path the binary's interpreter and loader look for it.
for lib in $(ldd "$bin" | awk '/=> \//{print $3} /^\t\//{print $1}'); do
    mkdir -p "$ctx/rootfs$(dirname "$lib")"
    cp -L "$lib" "$ctx/rootfs$lib"
done
cp "$here/Containerfile" "$ctx/Containerfile"
podman build --network=none --pull=never -q -t "$tag" "$ctx" >/dev/null
if [ -n "$archive" ]; then
    rm -f "$archive"
    podman save --format oci-archive -o "$archive" "$tag"
fi
echo "$tag"
