#!/bin/sh
# Builds dnstrace's container image from a built binary, with no network:
# the binary, the tools it reads kube-proxy's rules with (iptables-save in
# both backends, nft), what `ldd` says they link, and the system's CA
# roots, on `scratch`.
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
root=$ctx/rootfs
mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/tmp" "$root/var/lib/dnstrace"
chmod 1777 "$root/tmp"

# File $1 at path $2 (its own by default) in the image, with the libraries
# it links.
add() {
    dest=${2:-$1}
    mkdir -p "$root$(dirname "$dest")"
    cp -L "$1" "$root$dest"
    for lib in $(ldd "$1" 2>/dev/null | awk '/=> \//{print $3} /^\t\//{print $1}'); do
        [ -e "$root$lib" ] && continue
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}
add "$bin" /usr/bin/dnstrace
# The multi-call binaries pick their tool by the name they are run as.
for tool in iptables-nft-save ip6tables-nft-save iptables-legacy-save ip6tables-legacy-save nft; do
    path=$(command -v "$tool") || { echo "image.sh: $tool is missing (apt-get install iptables nftables)" >&2; exit 1; }
    real=$(readlink -f "$path")
    add "$real"
    [ "$real" = "$path" ] || ln -sf "$real" "$root$path"
done
# iptables-save prints matches through its extensions.
for ext in /usr/lib/*/xtables /usr/lib/xtables; do
    [ -d "$ext" ] || continue
    for so in "$ext"/*.so; do add "$so"; done
done
# The system's CA roots: an https OTLP collector with no CA named.
roots=/etc/ssl/certs/ca-certificates.crt
[ -s "$roots" ] || { echo "image.sh: $roots is missing (apt-get install ca-certificates)" >&2; exit 1; }
mkdir -p "$root/etc/ssl/certs"
cp -L "$roots" "$root$roots"
cp "$here/Containerfile" "$ctx/Containerfile"
podman build --network=none --pull=never -q -t "$tag" "$ctx" >/dev/null
if [ -n "$archive" ]; then
    rm -f "$archive"
    podman save --format oci-archive -o "$archive" "$tag"
fi
echo "$tag"
