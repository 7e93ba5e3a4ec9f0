#!/usr/bin/env bash
# The GPU path in one command, for a machine with an NVIDIA GPU and driver (none is available to
# the project's CI: there the CUDA code is compiled and its logic tested through a fake driver,
# its steps passed on one H200 on 2026-11-26, run by hand from a prebuilt tree because that
# machine had no gRPC to build with: bench/README.md, "gpu").
#
#   bench/gpu/run.sh [--build-dir build] [--dir /tmp] [--bytes 1073741824] [--reps 5]
#
# 1. configures and builds ckptd, the tests and ckpt_gpu_trainer with the CUDA backend required
#    (CKPT_WITH_CUDA=ON);
# 2. runs the [gpu] tests: two real processes, kernel-written random data, save without host
#    sync, mutate after wait_snapshot, checkpoint holds the pre-mutation bytes, legacy and VMM
#    routes, H2D load bit-exact;
# 3. starts a ckptd and measures D2H capture throughput (save → wait_snapshot) against one plain
#    cudaMemcpyAsync of the same bytes into pinned memory (goal >= 0.8), and the trainer-visible
#    stall of save(); prints a table (Markdown) to paste into bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build
dir=/tmp
bytes=$((1 << 30))
reps=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done

command -v nvidia-smi > /dev/null && nvidia-smi -L || echo "warning: nvidia-smi not found"
cmake -S . -B "$build" -G Ninja -DCKPT_WITH_CUDA=ON > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target ckptd ckpt_gpu_trainer ckpt_unit_tests ckpt_integration_tests

echo "== [gpu] and CUDA-backend tests"
"$build/bin/ckpt_unit_tests" "[device]"
CKPT_BIN_DIR="$PWD/$build/bin" "$build/bin/ckpt_integration_tests" "[gpu]" --success \
  | grep -E "SKIPPED|passed|failed" || true
CKPT_BIN_DIR="$PWD/$build/bin" "$build/bin/ckpt_integration_tests" "[gpu]"

echo "== capture throughput and stall"
work=$(mktemp -d "$dir/ckpt-gpu-bench-XXXXXX")
daemon=
trap '[[ -n "$daemon" ]] && { kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; }; rm -rf "$work"' EXIT
pool=$(( (bytes / (16 << 20) + 2) * (16 << 20) ))
"$build/bin/ckptd" --socket "$work/ckptd.sock" --storage-root "$work/root" \
  --host-pool "$pool" > "$work/ckptd.log" 2>&1 &
daemon=$!
"$build/bin/ckpt_gpu_trainer" --mode bench --socket "$work/ckptd.sock" --job bench \
  --bytes "$bytes" --reps "$reps"
grep -E "CUDA backend|GPU .*activated|registered with CUDA" "$work/ckptd.log" || true
