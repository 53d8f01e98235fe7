#!/bin/sh
# Install OpenTofu into a directory, checked against the SHA-256 kept in this repository.
#
#   scripts/install-tofu.sh VERSION DIR [ARCH]
#
# ARCH is amd64 or arm64 (default: this machine's). The archive
# tofu_VERSION_linux_ARCH.tar.gz is downloaded from OpenTofu's releases (or TOFU_DOWNLOAD_URL,
# a mirror with the same layout) and installed as DIR/tofu only when its SHA-256 is the one
# scripts/tofu.sha256sums lists — never one downloaded beside it. A version or architecture
# without a line there is refused: add the line from the release's tofu_VERSION_SHA256SUMS.
# Used by the Dockerfile (both architectures of the image) and the pipeline's test job.
set -eu

version=${1:?usage: install-tofu.sh VERSION DIR [ARCH]}
dest=${2:?usage: install-tofu.sh VERSION DIR [ARCH]}
arch=${3:-$(uname -m)}
case "$arch" in
  x86_64 | amd64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "install-tofu: unsupported architecture $arch (amd64 or arm64)" >&2; exit 1 ;;
esac

file="tofu_${version}_linux_${arch}.tar.gz"
sums="$(dirname "$0")/tofu.sha256sums"
want=$(awk -v f="$file" '$2 == f { print $1 }' "$sums")
if [ -z "$want" ]; then
  echo "install-tofu: no SHA-256 for $file in $sums: add its line from the release's tofu_${version}_SHA256SUMS" >&2
  exit 1
fi

base=${TOFU_DOWNLOAD_URL:-https://github.com/opentofu/opentofu/releases/download}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl --fail --silent --show-error --location --output "$work/$file" "$base/v$version/$file"
if ! (cd "$work" && echo "$want  $file" | sha256sum --check --strict --status -); then
  echo "install-tofu: $file does not have the SHA-256 $sums lists ($want): refusing it" >&2
  exit 1
fi
tar -xzf "$work/$file" -C "$work" tofu
install -d "$dest"
install -m 0755 "$work/tofu" "$dest/tofu"
echo "install-tofu: $dest/tofu ($file, sha256 $want)"
