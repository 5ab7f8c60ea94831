#!/usr/bin/env bash
# Builds the Containerfile with buildah on a clean Debian 12 — no registry, none of the test
# toolchain — and checks what it made: the proof that `make image` (which the Containerfile's
# build stage runs) needs only what it installs, and that the Containerfile works.
#
#   scripts/image-clean-room.sh WORKDIR
#
# 1. WORKDIR/rootfs: Debian 12 by debootstrap (minbase), with this machine's Rust toolchain
#    copied to /usr/local/rust (what the official Rust image would bring); committed as the
#    local image localhost/ankusa-builder:bookworm, the Containerfile's BUILDER.
# 2. `buildah bud --layers` of the targets relay and operator (its build stage installs what
#    scripts/install-deps.sh image names, then runs scripts/image.sh), written as OCI
#    archives to WORKDIR/{relay,operator}.oci.tar.
# 3. Each image: its user, entrypoint and files; `--version` run in it (buildah run); its
#    files the same as scripts/image.py --rootfs gives from this machine's packages and
#    target/$PROFILE/ (debug by default: build it first).
# Needs root, debootstrap and buildah (Debian packages); a release build (~20 min on two cores).
set -euo pipefail
work=$(realpath -m "${1:?usage: $0 WORKDIR}")
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
say() { echo "clean-room: [$SECONDS s] $*"; }
export BUILDAH_ISOLATION=chroot

if [ ! -x "$work/rootfs/usr/local/rust/bin/cargo" ]; then
  say "debootstrap --variant=minbase bookworm"
  [ -x "$work/rootfs/bin/bash" ] || debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log"
  say "the Rust toolchain $(rustc --version) to /usr/local/rust"
  mkdir -p "$work/rootfs/usr/local/rust"
  cp -a "$(rustc --print sysroot)/." "$work/rootfs/usr/local/rust/"
fi
# This machine's own certificate authorities (a proxy's, say) go in as local ones, as a
# company's builder image would carry them: the build stage's ca-certificates takes them
# into the bundle cargo reads. The images' bundles hold only the package's certificates.
mkdir -p "$work/rootfs/usr/local/share/ca-certificates"
cp /usr/local/share/ca-certificates/*.crt "$work/rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
say "localhost/ankusa-builder:bookworm from the rootfs"
buildah rmi -f localhost/ankusa-builder:bookworm >/dev/null 2>&1 || true
{
  c=$(buildah from scratch)
  buildah copy "$c" "$work/rootfs/" / >/dev/null
  buildah config --env PATH=/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env CARGO_HOME=/usr/local/cargo "$c"
  buildah commit -q "$c" localhost/ankusa-builder:bookworm >/dev/null
  buildah rm "$c" >/dev/null
}

cd "$repo"
for image in relay operator; do
  say "buildah bud --target $image"
  buildah bud --layers --network host --build-arg BUILDER=localhost/ankusa-builder:bookworm \
    -f Containerfile --target "$image" -t "localhost/ankusa/$image:clean-room" . >"$work/bud-$image.log" 2>&1 \
    || { tail -n 40 "$work/bud-$image.log" >&2; exit 1; }
  rm -f "$work/$image.oci.tar"
  buildah push -q "localhost/ankusa/$image:clean-room" "oci-archive:$work/$image.oci.tar:localhost/ankusa/$image:clean-room"
done

for image in relay operator; do
  c=$(buildah from "localhost/ankusa/$image:clean-room")
  cfg=$(buildah inspect --type container -f '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$c")
  [ "$cfg" = "10001:10001 [/usr/local/bin/ankusa-$image]" ] || { echo "clean-room: $image: user and entrypoint $cfg" >&2; exit 1; }
  # The files as the image has them (before a run adds the runtime's mount points).
  mnt=$(buildah mount "$c")
  (cd "$mnt" && find . -mindepth 1 -not -path ./usr/local/bin/ankusa-$image -printf '%p %m %u\n' | sort) >"$work/$image.files"
  [ ! -e "$mnt/bin/sh" ] && [ ! -e "$mnt/usr/bin/apt-get" ] || { echo "clean-room: $image has a shell or apt" >&2; exit 1; }
  buildah umount "$c" >/dev/null
  version=$(buildah run "$c" -- "/usr/local/bin/ankusa-$image" --version)
  buildah rm "$c" >/dev/null
  # The same files as scripts/image.py --rootfs gives here, from this machine's packages
  # and its own build of the binary (the binary's bytes aside).
  here=$(mktemp -d)
  python3 scripts/image.py --binary "target/${PROFILE:-debug}/ankusa-$image" --rootfs "$here/fs" 2>/dev/null
  (cd "$here/fs" && find . -mindepth 1 -not -path ./usr/local/bin/ankusa-$image -printf '%p %m %u\n' | sort) >"$work/$image.files.here"
  rm -rf "$here"
  diff -u "$work/$image.files.here" "$work/$image.files" >&2 || { echo "clean-room: $image's files differ from scripts/image.py's here" >&2; exit 1; }
  say "$image: $version; user 10001:10001, entrypoint /usr/local/bin/ankusa-$image, $(wc -l <"$work/$image.files") files, no shell; $(du -h "$work/$image.oci.tar" | cut -f1) archive"
done
say "ok"
