#!/usr/bin/env bash
# Installs what is missing, builds everything (warnings are errors) and runs every test.
# This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
build=${CKPT_BUILD_DIR:-build}
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCKPT_WERROR=ON ${CKPT_CMAKE_ARGS:-} > "$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "${CKPT_JOBS:-2}"
ctest --test-dir "$build" --output-on-failure -j "${CKPT_JOBS:-2}" --timeout 600
