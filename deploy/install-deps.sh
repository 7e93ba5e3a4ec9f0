#!/usr/bin/env bash
# Installs every Debian package that ckptd's build, tests and benchmarks need.
# Idempotent: packages already present are left alone; safe to run on every CI start.
# CUDA and NCCL are not Debian packages: the CUDA backend is built when /usr/local/cuda exists.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost-dev libspdlog-dev libfmt-dev catch2 pybind11-dev python3-dev
  libtorch-dev libyaml-cpp-dev libxxhash-dev libcli11-dev prometheus-cpp-dev libsystemd-dev
  python3-torch python3-grpcio python3-yaml python3-numpy python3-matplotlib
  python3-pip python3-venv python3-wheel python3-setuptools
  fio openssl clang libclang-rt-14-dev clang-format
  # promtool (deploy/prometheus rule tests) ships only in the prometheus package, whose
  # postinst enables a Prometheus server on :9090 where systemd runs: stop it if unwanted.
  prometheus fuse3 python3-fusepy
  # The partition test cuts a daemon off loopback with nftables rules (tests/integration/
  # net_partition.h); the peer benchmark's raw-TCP baseline is iperf3 (bench/peer).
  nftables iperf3
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
