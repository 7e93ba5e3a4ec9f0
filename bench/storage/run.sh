#!/usr/bin/env bash
# ckptd's storage path against fio on the same directory, same size, same run.
#
#   bench/storage/run.sh [--size 4GiB] [--dir /tmp] [--bin build/bin] [--repeat 3]
#                        [--io-threads 8] [--json FILE]
#
# Each round runs, in this order and on the same directory:
#   1. fio sequential write, O_DIRECT, bs=16M, libaio, iodepth 4 and iodepth 8, fsync at the end,
#      each into a new file (fio preallocates it, its default); then the same at iodepth 8 without
#      preallocation (--fallocate=none), for information (ckptd's writer preallocates);
#   2. fio sequential read of that file, O_DIRECT, bs=16M, libaio, iodepth 8 and iodepth 4;
#   3. bench_storage: one rank's save of realistic shards through the daemon's own write path
#      (capture engine into the host pool, flush engine: aligned O_DIRECT pwrite per slot through
#      DataFileWriter, XXH3 of every piece, fdatasync), then CheckpointReader::Read of every
#      tensor (XXH3 check of every piece, copy out).
# The baseline of each direction is the better of fio's two queue depths (on virtual disks
# deeper is not always faster). The table shows medians over the rounds, the spread, and the
# ratios ckptd/fio (goal: >= 0.9). --json FILE also writes every round's numbers and the table
# (bench/run reads it).
set -euo pipefail

size=4GiB
dir=/tmp
bin=build/bin
repeat=3
io_threads=8
json=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --io-threads) io_threads=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

# "2GiB", "512M", "4096" -> bytes (binary suffixes, as ckptd parses them).
to_bytes() {
  if [[ $1 =~ ^([0-9]+)(B|K|KiB|M|MiB|G|GiB|T|TiB)?$ ]]; then
    local n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
    case "$unit" in
      ""|B) echo "$n" ;;
      K|KiB) echo $((n << 10)) ;;
      M|MiB) echo $((n << 20)) ;;
      G|GiB) echo $((n << 30)) ;;
      T|TiB) echo $((n << 40)) ;;
    esac
  else
    echo "run.sh: cannot parse size '$1' (use e.g. 2GiB, 512MiB)" >&2
    exit 2
  fi
}
bytes=$(to_bytes "$size")

command -v fio > /dev/null || { echo "run.sh: fio not found (apt-get install fio)" >&2; exit 2; }
command -v python3 > /dev/null || { echo "run.sh: python3 not found" >&2; exit 2; }
[[ -x $bin/bench_storage ]] || { echo "run.sh: $bin/bench_storage not built" >&2; exit 2; }

work=$(mktemp -d "$dir/ckpt-fio.XXXXXX")
trap 'rm -rf "$work"' EXIT

# fio_bw RW QD [extra fio args...] -> bytes/s
fio_bw() {
  local rw=$1 qd=$2
  shift 2
  fio --name="$rw" --rw="$rw" --directory="$work" --filename=fio.dat --bs=16M --size="$bytes" \
      --direct=1 --ioengine=libaio --iodepth="$qd" --output-format=json "$@" > "$work/fio.json"
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['jobs'][0][sys.argv[2]]['bw_bytes'])" \
      "$work/fio.json" "$rw"
}
max() { if (( $1 > $2 )); then echo "$1"; else echo "$2"; fi; }

fio_w=(); fio_w_noalloc=(); fio_r=(); ck_w=(); ck_r=()
for ((round = 1; round <= repeat; round++)); do
  # Every fio write creates its file anew, as ckptd's writer does: overwriting the blocks of a
  # file written before skips the allocation and the unwritten-extent conversion at fsync, and
  # measured 1.3-1.4x faster here (1 GiB, iodepth 8: 1452-1503 vs 1059-1099 MB/s).
  rm -f "$work/fio.dat"
  w4=$(fio_bw write 4 --end_fsync=1)
  rm -f "$work/fio.dat"
  w8=$(fio_bw write 8 --end_fsync=1)
  r8=$(fio_bw read 8)
  r4=$(fio_bw read 4)
  rm -f "$work/fio.dat"
  wn=$(fio_bw write 8 --end_fsync=1 --fallocate=none)
  rm -f "$work/fio.dat"
  fio_w+=("$(max "$w4" "$w8")"); fio_r+=("$(max "$r4" "$r8")"); fio_w_noalloc+=("$wn")

  "$bin/bench_storage" --size "$bytes" --dir "$work" --io-threads "$io_threads" > "$work/ck.txt"
  ck_w+=("$(sed -n 's/^write_bytes_per_s=//p' "$work/ck.txt")")
  ck_r+=("$(sed -n 's/^read_bytes_per_s=//p' "$work/ck.txt")")
  direct=$(sed -n 's/^direct=//p' "$work/ck.txt")
  echo "round $round: fio write qd4 $((w4 / 1000000)) qd8 $((w8 / 1000000))" \
       "no-prealloc $((wn / 1000000)), read qd4 $((r4 / 1000000)) qd8 $((r8 / 1000000));" \
       "ckptd write $((ck_w[-1] / 1000000)) read $((ck_r[-1] / 1000000)) MB/s"
done

# "median min max" of the arguments.
stats() {
  printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1}
    END {m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; print m, a[1], a[NR]}'
}

echo
echo "storage bench: $size in $dir, $repeat rounds (median, min-max), $io_threads ckptd I/O" \
     "threads, O_DIRECT: $([[ $direct == 1 ]] && echo yes || echo 'no (filesystem refused it)')"
{
  echo "write $(stats "${fio_w[@]}") $(stats "${ck_w[@]}")"
  echo "read $(stats "${fio_r[@]}") $(stats "${ck_r[@]}")"
  echo "write-vs-no-prealloc $(stats "${fio_w_noalloc[@]}") $(stats "${ck_w[@]}")"
} | awk 'BEGIN {
    label["write"] = "write"
    label["read"] = "read"
    label["write-vs-no-prealloc"] = "write vs fio --fallocate=none"
    printf "| %-37s | %-20s | %-20s | %9s |\n", "", "fio MB/s", "ckptd MB/s", "ckptd/fio"
    printf "|---------------------------------------|----------------------|----------------------|----------:|\n"
    below = 0
  }
  {
    ratio = $5 / $2
    printf "| %-37s | %6.0f (%5.0f-%5.0f) | %6.0f (%5.0f-%5.0f) | %9.2f |\n", label[$1],
           $2 / 1e6, $3 / 1e6, $4 / 1e6, $5 / 1e6, $6 / 1e6, $7 / 1e6, ratio
    if (($1 == "write" || $1 == "read") && ratio < 0.9) below = 1
  }
  END { if (below) print "below goal (0.9) on write or read: see bench/README.md" }'

if [[ -n $json ]]; then
  # Lists of bytes/s per round -> JSON with medians and the rows of the table above.
  python3 - "$json" "$size" "$bytes" "$repeat" "$io_threads" "${direct:-0}" \
      "${fio_w[*]}" "${fio_r[*]}" "${fio_w_noalloc[*]}" "${ck_w[*]}" "${ck_r[*]}" << 'PY'
import json, statistics, sys, time
path, size, nbytes, repeat, threads, direct = sys.argv[1:7]
names = ["fio_write", "fio_read", "fio_write_no_prealloc", "ckptd_write", "ckptd_read"]
lists = {n: [float(x) for x in v.split()] for n, v in zip(names, sys.argv[7:12])}
med = {n: statistics.median(v) for n, v in lists.items()}
def row(metric, ck, base, goal):
    ratio = med[ck] / med[base]
    return {"metric": metric, "ckptd": "%.0f MB/s" % (med[ck] / 1e6),
            "baseline": "%.0f MB/s fio" % (med[base] / 1e6), "ratio": ratio, "goal": goal,
            "met": None if goal == "(info)" else ratio >= 0.9}
with open(path, "w") as f:
    json.dump({"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "size": size,
               "bytes": int(nbytes), "rounds": int(repeat), "io_threads": int(threads),
               "direct": direct == "1", "bytes_per_s": lists,
               "median_bytes_per_s": med,
               "table": [row("daemon write path %s (capture + flush engines)" % size, "ckptd_write", "fio_write",
                             ">= 0.9"),
                         row("storage engine read %s" % size, "ckptd_read", "fio_read", ">= 0.9"),
                         row("storage write vs fio --fallocate=none", "ckptd_write",
                             "fio_write_no_prealloc", "(info)")]}, f, indent=2)
print("JSON: %s" % path)
PY
fi
