#!/usr/bin/env bash
# CI: build both images and check them without a GPU (what `make image-check` runs).
#
#   deploy/image_check.sh            # cpu and gpu
#   deploy/image_check.sh cpu        # one of them
#
# Builds with deploy/image.sh (docker where an engine works, else buildah from a debootstrap
# base; layers and the base are reused between runs), then deploy/image_check.py starts the
# images and checks them (see its docstring). Prints the build time and size of each image.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
targets=("${@:-cpu gpu}")
read -r -a targets <<<"${targets[*]}"
args=()
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
for t in "${targets[@]}"; do
    deploy/image.sh "$t" 2>&1 | tee "$logs/$t.log" >&2
    line=$(tail -1 "$logs/$t.log")
    read -r _ image size seconds <<<"$line"
    echo "[image-check] built $image ($size) in $seconds s" >&2
    args+=("--$t-image" "$image")
done
"$PY" deploy/image_check.py "${args[@]}"
