#!/usr/bin/env bash
# Install the paper's reference package for bench/experiment.py's side-by-side run.
#
# Creates a virtualenv of its own (default .bench-venv, ignored by git; never Sandhive's
# .venv), pip-installs llm-in-sandbox==0.2.0 from the package index, links
# bench/package_task into the installed package's benchmark/ folder as `sandhive_bench`
# (the package looks its tasks up there), and builds the package's sandbox image from
# bench/package_image.Dockerfile on the local Debian base (no registry needed; apt reads
# the base's own mirror). Idempotent: skips what is already there (FORCE=1 rebuilds the image).
#
# Usage: bench/package_setup.sh [VENV_DIR]
#   BASE_IMAGE    default sandhive-base:bookworm (deploy/build-base-image.sh builds it)
#   PACKAGE_IMAGE default llm-in-sandbox-local:v0.1
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
venv="${1:-$root/.bench-venv}"
base="${BASE_IMAGE:-sandhive-base:bookworm}"
image="${PACKAGE_IMAGE:-llm-in-sandbox-local:v0.1}"

if [[ ! -x "$venv/bin/llm-in-sandbox" ]]; then
    echo "creating $venv with llm-in-sandbox==0.2.0"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check llm-in-sandbox==0.2.0
else
    echo "$venv already has llm-in-sandbox"
fi

# find_spec, not import: importing the package imports litellm, which fetches a price list.
benchmarks=$("$venv/bin/python" -c \
    'import importlib.util as u; print(u.find_spec("llm_in_sandbox").submodule_search_locations[0])')/benchmark
ln -sfn "$here/package_task" "$benchmarks/sandhive_bench"
echo "linked $benchmarks/sandhive_bench -> $here/package_task"

if [[ "${FORCE:-0}" != "1" ]] && docker image inspect "$image" >/dev/null 2>&1; then
    echo "image $image already present"
else
    if ! docker image inspect "$base" >/dev/null 2>&1; then
        echo "base image $base missing: run deploy/build-base-image.sh first" >&2
        exit 1
    fi
    context=$(mktemp -d)
    trap 'rm -rf "$context"' EXIT
    cp "$here/package_image.Dockerfile" "$context/Dockerfile"
    docker build --quiet --build-arg "BASE_IMAGE=$base" -t "$image" "$context" >/dev/null
    echo "built $image from $base"
fi
