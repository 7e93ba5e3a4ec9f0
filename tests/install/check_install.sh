#!/usr/bin/env bash
# cmake --install gives what deploy/README.md says it does, usable outside the tree: the three
# binaries, the systemd units and sysusers file, the example config, and the C++ client
# (include/ckpt/*.h, libckpt_client.so, a pkg-config file). A trainer compiled against the
# installed client alone saves to and restores from the installed ckptd.
#   check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2> /dev/null && wait "$daemon" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"

for f in bin/ckptd bin/ckptctl bin/ckpt-coordinator include/ckpt/client.h include/ckpt/status.h \
         lib/libckpt_client.so lib/pkgconfig/ckpt-client.pc lib/systemd/system/ckptd.service \
         lib/systemd/system/ckpt-coordinator.service lib/sysusers.d/ckptd.conf \
         share/ckptd/ckptd.yaml; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f"; cat "$work/install.log"; exit 1; }
done
# The public headers include nothing of the project but each other.
if grep -n '#include "' "$prefix"/include/ckpt/*.h | grep -v '"ckpt/'; then
  echo "an installed header includes a project header that is not installed"
  exit 1
fi

flags=$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs ckpt-client)
# shellcheck disable=SC2086
c++ -std=c++20 -o "$work/trainer" "$source/tests/install/use_installed_client.cc" $flags

"$prefix/bin/ckptd" --socket "$work/ckptd.sock" --storage-root "$work/root" --host-pool 32MiB \
  --slot-size 4MiB --admin "" --metrics "" --node-id install-check > "$work/ckptd.log" 2>&1 &
daemon=$!
# Client::Connect waits (up to its connect timeout) for the daemon to listen. The trainer is
# who torchrun would say it is (ClientOptionsFromEnvironment).
if ! env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 CKPTD_JOB=installed-client LD_LIBRARY_PATH=$prefix/lib \
    "$work/trainer" "$work/ckptd.sock"; then
  echo "--- ckptd log"
  cat "$work/ckptd.log"
  exit 1
fi
test -f "$work/root/installed-client/LATEST"
echo "install check passed"
