#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan) and runs each for a bounded time, starting
# from the seed corpora in tests/fuzz/corpus/. Fails on any crash, sanitizer report, leak or
# timeout, leaving the input under $CKPT_FUZZ_OUT/ (reproduce: build-fuzz/bin/<harness> FILE).
# Prints the executions each harness ran.
#   CKPT_FUZZ_SECONDS  seconds per harness (default 20; four harnesses: 80 s in all)
#   CKPT_FUZZ_BUILD    build directory (default build-fuzz)
#   CKPT_FUZZ_OUT      where findings and the grown corpora go (default $CKPT_FUZZ_BUILD/fuzz-out)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${CKPT_FUZZ_SECONDS:-20}
build=${CKPT_FUZZ_BUILD:-build-fuzz}
out=${CKPT_FUZZ_OUT:-$build/fuzz-out}
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" \
  -DCKPT_BUILD_FUZZ=ON -DCKPT_BUILD_BENCH=OFF -DCKPT_BUILD_PYTHON=OFF > "$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "${CKPT_JOBS:-2}" --target ckpt_fuzz

harnesses=(fuzz_frame_decoder fuzz_session fuzz_manifest fuzz_geometry)
status=0
total=0
for h in "${harnesses[@]}"; do
  work="$out/$h"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/crashes"
  log="$work/fuzz.log"
  # The first corpus directory receives new inputs; the checked-in seeds stay untouched.
  if "$build/bin/$h" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=4096 \
       -print_final_stats=1 -artifact_prefix="$work/crashes/" \
       "$work/corpus" "tests/fuzz/corpus/$h" > "$log" 2>&1; then
    result=ok
  else
    result=FAILED
    status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  total=$((total + execs))
  echo "fuzz: $h: $result, $execs executions in ${seconds} s, corpus $(ls "$work/corpus" | wc -l) new inputs"
  if [ "$result" != ok ]; then
    tail -n 60 "$log"
    ls -l "$work/crashes"
  fi
done
echo "fuzz: $total executions in all"
exit $status
