#!/usr/bin/env bash
# `make image`: the relay's and the operator's images, with nothing of the test toolchain.
#
# - On a machine with Debian's package tools (Debian, Ubuntu): built here from the release
#   binaries and Debian's packages by scripts/image.py, as OCI archives in target/images/
#   (relay.oci.tar, operator.oci.tar), after installing only what the build uses
#   (scripts/install-deps.sh image). IMAGE_ROOTFS=DIR writes each image's files under
#   DIR/relay and DIR/operator instead: what the Containerfile's build stage runs.
# - Elsewhere (Fedora, macOS, ...), or with IMAGE_ENGINE=podman|docker|buildah: through the
#   Containerfile, whose Debian 12 build stage runs this same script; the images are left in
#   the engine's store as IMAGE_REGISTRY/{relay,operator}:IMAGE_TAG (podman and buildah also
#   write the OCI archives).
#
# No image is published: push the built ones to your registry (docs/deployment.md).
set -euo pipefail
registry=${IMAGE_REGISTRY:-ghcr.io/ankusa}
tag=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)}
engine=${IMAGE_ENGINE:-}
if [ -z "$engine" ] && ! { command -v dpkg-deb && command -v apt-get; } >/dev/null 2>&1; then
  for e in podman docker buildah; do
    if command -v "$e" >/dev/null 2>&1; then engine=$e; break; fi
  done
  if [ -z "$engine" ]; then
    echo "image: this machine has neither Debian's package tools (dpkg, apt) nor podman, docker or buildah;" \
      "install one of the engines and run make image again" >&2
    exit 1
  fi
fi

if [ -n "$engine" ]; then
  case "$engine" in
    buildah) build=(buildah bud --layers) ;;
    podman | docker) build=("$engine" build) ;;
    *) echo "image: IMAGE_ENGINE=$engine: expected podman, docker or buildah" >&2; exit 2 ;;
  esac
  mkdir -p target/images
  for image in relay operator; do
    ref="$registry/$image:$tag"
    echo "image: $engine builds $ref from the Containerfile (target $image)"
    "${build[@]}" -f Containerfile --target "$image" -t "$ref" .
    case "$engine" in
      podman) podman save --format oci-archive -o "target/images/$image.oci.tar" "$ref" ;;
      buildah) buildah push "$ref" "oci-archive:target/images/$image.oci.tar:$ref" ;;
    esac
  done
  exit 0
fi

bash scripts/install-deps.sh image
# One build of both: their dependencies' features unify, and RocksDB compiles once.
cargo build --release --locked -p ankusa-relay --bin ankusa-relay -p ankusa-operator --bin ankusa-operator
for image in relay operator; do
  if [ -n "${IMAGE_ROOTFS:-}" ]; then
    python3 scripts/image.py --binary "target/release/ankusa-$image" --rootfs "$IMAGE_ROOTFS/$image"
  else
    python3 scripts/image.py --binary "target/release/ankusa-$image" \
      --ref "$registry/$image:$tag" --out "target/images/$image.oci.tar"
  fi
done
