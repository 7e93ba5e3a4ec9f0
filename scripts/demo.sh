#!/usr/bin/env bash
# The README's demo: a ckptd with the embedded coordinator, and a PyTorch trainer that
# checkpoints every step, is killed mid-run, and resumes from the daemon's memory. Then the same
# run without the crash, to show the resumed training ended bit-identical.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
build=${CKPT_BUILD_DIR:-build}
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "${CKPT_JOBS:-2}" --target ckptd ckptctl _ckptd

work=$(mktemp -d /tmp/ckptd-demo.XXXXXX)
socket=$work/ckptd.sock
root=$work/checkpoints
export PYTHONPATH=$PWD/$build/python
python=/usr/bin/python3
trainer=client/python/examples/demo_train.py

"$build/bin/ckptd" --socket "$socket" --storage-root "$root" --host-pool 512MiB --keep 3 \
  --admin "unix:$work/admin.sock" > "$work/ckptd.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
echo "== ckptd (pid $daemon) on $socket, checkpoints under $root, log $work/ckptd.log"

echo "== run 1: train 20 steps, crash right after saving step 12"
$python "$trainer" --socket "$socket" --job demo --steps 20 --kill-at 12 || true
# The trainer is gone; its captured step 12 is still persisted and committed by the daemon.
$python -c "import ckptd, sys; c = ckptd.Client('demo', 0, 1, socket=sys.argv[1]); c.wait(12, 'committed'); c.close()" "$socket"
latest=$(cat "$root/demo/LATEST")
echo "== the daemon committed step $latest without the trainer; on disk:"
# (Through a file: with pipefail, `| head` would fail the script when ckptctl outlives head.)
"$build/bin/ckptctl" inspect "$root/demo/step-$(printf %010d "$latest")" > "$work/inspect.txt"
head -8 "$work/inspect.txt"
"$build/bin/ckptctl" verify "$root/demo/step-$(printf %010d "$latest")"

echo "== run 2: a new trainer process resumes"
$python "$trainer" --socket "$socket" --job demo --steps 20 --report "$work/resumed.digest"

echo "== reference: the same 20 steps without a crash (job demo-ref)"
$python "$trainer" --socket "$socket" --job demo-ref --steps 20 --report "$work/reference.digest" \
  > "$work/reference.log"
if cmp -s "$work/resumed.digest" "$work/reference.digest"; then
  echo "== resumed run and uninterrupted run end bit-identical (parameters + AdamW state)"
else
  echo "== MISMATCH: the resumed run differs from the uninterrupted one" >&2
  exit 1
fi
kill -TERM $daemon
wait $daemon
trap - EXIT
echo "== ckptd drained and exited 0; retention kept: $(ls "$root/demo" | tr '\n' ' ')"
