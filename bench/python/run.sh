#!/usr/bin/env bash
# Trainer-visible stall per checkpoint, ckptd.torch.Checkpointer vs torch.save (with and without
# fsync), states of 256 MiB, 512 MiB, 1 GiB and 2 GiB (model + AdamW state); about 2 minutes
# on a 2-core CI machine, ~7 GiB of memory at the largest size (state, the daemon's 4.25 GiB pool).
#
#   bench/python/run.sh [--build build] [--dir /tmp] [any stall.py option, e.g. --json out.json]
#
# Uses $build/bin/ckptd and the Python package in $build/python (targets ckptd and _ckptd), and
# /usr/bin/python3 with PyTorch. Method and results: bench/python/RESULTS.md.
set -euo pipefail

build=build
dir=/tmp
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

python=${PYTHON:-/usr/bin/python3}
[[ -x $build/bin/ckptd ]] || { echo "run.sh: $build/bin/ckptd not built" >&2; exit 2; }
ls "$build"/python/ckptd/_ckptd*.so > /dev/null 2>&1 || {
  echo "run.sh: the Python module is not built ($build/python/ckptd; target _ckptd)" >&2; exit 2; }
"$python" -c "import torch" 2> /dev/null || { echo "run.sh: $python cannot import torch" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" exec "$python" "$here/stall.py" \
    --bin "$build/bin" --dir "$dir" --sizes 256MiB,512MiB,1GiB,2GiB --steps 8 --save-reps 3 \
    "${args[@]}"
