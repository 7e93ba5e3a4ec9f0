#!/usr/bin/env bash
# Loads through a real ckptd against same-run baselines, with sizes for a CI machine (2 cores,
# 24 GiB): a 2 GiB state (4 float32 tensors [16384, 8192], saved by 4 ranks row-sharded, 512 MiB
# each), loaded hot (from the daemon's memory, right after the save) and cold (daemon restarted,
# page cache dropped) in the same layout, by 3 ranks column-sharded and by 1 rank whole; fio
# O_DIRECT sequential read of the same size in the same directory as the cold baseline.
# About 2 minutes (more on a loaded machine); ~7 GiB of memory (state, destinations, the
# daemon's 2.5 GiB pool).
#
#   bench/load/run.sh [--bin build/bin] [--dir /tmp] [any bench_load option, e.g. --json out.json]
#
# Later options win (--rounds 6 overrides the default below). Run as root to drop the page cache
# between cold loads (ckptd and fio read with O_DIRECT anyway). Method and results:
# bench/load/RESULTS.md.
set -euo pipefail

bin=build/bin
dir=/tmp
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

command -v fio > /dev/null || { echo "run.sh: fio not found (apt-get install fio)" >&2; exit 2; }
for exe in bench_load ckptd; do
  [[ -x $bin/$exe ]] || { echo "run.sh: $bin/$exe not built (cmake --build <build dir> --target ckptd bench_load)" >&2; exit 2; }
done

exec "$bin/bench_load" --bin "$bin" --dir "$dir" --size 2GiB --tensors 4 --cols 8192 --ranks 4 \
    --reshard-ranks 3 --rounds 4 --hot-rounds 3 "${args[@]}"
