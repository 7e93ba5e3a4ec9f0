#!/usr/bin/env bash
# The node daemon against baselines measured in the same run (bench_daemon; method and results in
# bench/daemon/RESULTS.md). Builds nothing: build the ckptd and bench_daemon targets first.
#
#   bench/daemon/run.sh [--bin build/bin] [--dir /tmp] [--json FILE] [bench_daemon flags...]
#
# Sizes below fit a CI machine (2 cores, 24 GiB RAM, local disk) in about 3 minutes and ~8 GiB
# of memory at the peak (2 GiB pool + 2 GiB state + fio); every flag can be overridden:
#   --pool 2GiB               ckptd --host-pool of every section (>= --capture-size + one slot)
#   --slot-size 16MiB --checksum-chunk 1MiB --capture-threads 2 --flush-threads 8
#                             the daemon's defaults, passed explicitly
#   --ckptd-arg=--X=Y         any other ckptd flag, repeatable
#   --sections save capture flush train
#   a. --save-samples 100     most timed saves per state (about 8 GiB worth, at least 10);
#      --large                also a 4 GiB state (+30 s, +4 GiB memory);
#      --save-configs 256MiB:10000 ...   other SIZE:TENSORS states instead of the defaults
#   b. --capture-size 1GiB --rounds 5
#   c. --flush-size 2GiB --flush-rounds 4          (fio: O_DIRECT, bs=16M, libaio, iodepth 8)
#   d. --train-size 1GiB --compute-ms 200 --train-steps 8 --train-every 4
#   --keep                    keep the work directory (daemon logs) under --dir
# --dir must be a disk (not tmpfs): O_DIRECT and the fio baseline mean nothing on tmpfs.
set -euo pipefail

bin=build/bin
dir=/tmp
json=
rest=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) rest+=("$1"); shift ;;
  esac
done

command -v fio > /dev/null || { echo "run.sh: fio not found (apt-get install fio)" >&2; exit 2; }
for b in ckptd bench_daemon; do
  [[ -x $bin/$b ]] || { echo "run.sh: $bin/$b not built (cmake --build ... --target $b)" >&2; exit 2; }
done
if [[ $(stat -f -c %T "$dir") == tmpfs ]]; then
  echo "run.sh: $dir is tmpfs; pass --dir on a disk" >&2
  exit 2
fi

args=(--bin "$bin" --dir "$dir"
      --pool 2GiB --slot-size 16MiB --checksum-chunk 1MiB --capture-threads 2 --flush-threads 8
      --save-samples 100
      --capture-size 1GiB --rounds 5
      --flush-size 2GiB --flush-rounds 4
      --train-size 1GiB --compute-ms 200 --train-steps 8 --train-every 4)
[[ -n $json ]] && args+=(--json "$json")
# Later flags win (CLI11 keeps the last value of a repeated option).
exec "$bin/bench_daemon" "${args[@]}" "${rest[@]+"${rest[@]}"}"
