#!/usr/bin/env bash
# Build one target of the Dockerfile: `deploy/image.sh cpu|gpu` (what `make image TARGET=...` runs).
#
# With a working Docker engine: `docker build`. Without one (CI, these build machines):
# buildah as root, chroot isolation, vfs storage, no daemon, from a base made by
# debootstrap (Debian bookworm with python3.11 and venv) when the Python base image
# cannot be pulled. Layers and the base are kept between runs (buildah --layers and
# the local image localhost/lu-base:py311-bookworm); images that lost their tag to a
# newer build are pruned afterwards, so the store holds one chain per target.
#
# Environment: IMAGE (default lu-service:TARGET, prefixed localhost/ under buildah),
# CUDA (12 or 13, gpu target), PYTHON_IMAGE (a base to use instead of pulling or
# debootstrapping), LU_IMAGE_ENGINE (docker or buildah, to force one).
# Prints the image name, its size and the build time on the last line: "image NAME SIZE SECONDS".
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET="${1:-${TARGET:-gpu}}"
case "$TARGET" in cpu | gpu) ;; *) echo "usage: $0 cpu|gpu" >&2 && exit 2 ;; esac
CUDA="${CUDA:-12}"
OFFICIAL_BASE="python:3.11.11-slim-bookworm"
LOCAL_BASE="localhost/lu-base:py311-bookworm"
start=$(date +%s)

engine="${LU_IMAGE_ENGINE:-}"
if [ -z "$engine" ]; then
    if command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; then engine=docker; else engine=buildah; fi
fi

if [ "$engine" = docker ]; then
    IMAGE="${IMAGE:-lu-service:$TARGET}"
    docker build --target "$TARGET" --build-arg "CUDA=$CUDA" ${PYTHON_IMAGE:+--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE"} -t "$IMAGE" .
    docker image prune --force >/dev/null
    size=$(docker image inspect --format '{{.Size}}' "$IMAGE")
    echo "image $IMAGE $size $(($(date +%s) - start))"
    exit 0
fi

# ---------------------------------------------------------------- buildah
export STORAGE_DRIVER=vfs # no overlay driver needed (nor fuse-overlayfs)
missing=()
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} (apt-get)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
IMAGE="${IMAGE:-localhost/lu-service:$TARGET}"

have_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }

base="${PYTHON_IMAGE:-}"
if [ -z "$base" ]; then
    if have_image "$LOCAL_BASE"; then
        base="$LOCAL_BASE"
    elif timeout 120 buildah pull --quiet "docker.io/library/$OFFICIAL_BASE" >/dev/null 2>&1; then
        buildah tag "docker.io/library/$OFFICIAL_BASE" "$LOCAL_BASE"
        base="$LOCAL_BASE"
    else
        # A python:3.11-slim stand-in: Debian bookworm with python3.11 and venv (about 1 min, 272 MB).
        echo "cannot pull $OFFICIAL_BASE: making $LOCAL_BASE with debootstrap" >&2
        work=$(mktemp -d /var/tmp/lu-base.XXXXXX)
        trap 'rm -rf "$work"' EXIT
        debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
            bookworm "$work/rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$work/debootstrap.log" 2>&1 \
            || { tail -20 "$work/debootstrap.log" >&2 && exit 1; }
        rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
        tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
        printf 'FROM scratch\nADD rootfs.tar /\nCMD ["python3"]\n' >"$work/Containerfile"
        buildah bud --quiet --isolation chroot --format docker -t "$LOCAL_BASE" -f "$work/Containerfile" "$work" >/dev/null
        base="$LOCAL_BASE"
    fi
fi

# pip inside the build uses this machine's certificate bundle and pip settings when it has
# them (the registries may be reached through an intercepting proxy).
volumes=()
for f in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf; do
    [ -f "$f" ] && volumes+=(--volume "$f:$f:ro")
done

bud() { buildah bud --isolation chroot --layers --format docker --build-arg "PYTHON_IMAGE=$base" \
    --build-arg "CUDA=$CUDA" "${volumes[@]}" "$@" .; }

# The intermediate stages are tagged too: an untagged stage is "dangling" once built
# (nothing is built FROM it; the targets COPY from it) and the prune below would throw
# its cached layers away, the CUDA wheels with them.
stages=(deps deps-cpu code kernels)
[ "$TARGET" = gpu ] && stages=(deps deps-gpu code kernels)
for stage in "${stages[@]}"; do
    tag="localhost/lu-service-stage:$stage"
    [ "$stage" = deps-gpu ] && tag="$tag-cu$CUDA"
    bud --quiet --target "$stage" -t "$tag" >/dev/null
done
bud --target "$TARGET" -t "$IMAGE"

# Untagged leftovers of earlier builds (the cache of the current chains stays: its
# layers are parents of tagged images). Repeated because removing a leaf can leave
# its parent dangling.
for _ in 1 2 3 4 5 6; do
    [ -z "$(buildah images --quiet --filter dangling=true 2>/dev/null)" ] && break
    buildah rmi --prune >/dev/null 2>&1 || break
done
size=$(buildah images --noheading --format '{{.Size}}' "$IMAGE" | head -1 | tr -d ' ')
echo "image $IMAGE $size $(($(date +%s) - start))"
