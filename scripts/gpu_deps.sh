#!/usr/bin/env bash
# Fetches, here (where apt works), the Debian packages the GPU check needs but a bare GPU machine
# lacks: oneDNN (the CPU GEMM every build links), GoogleTest, nlohmann-json and toml++ (both used
# header-only) and zlib's headers. They land in .gpu-deps/
# (git-ignored; ~7 MB) for the device tool to carry; benchmarks/gpu/check.sh unpacks them with
# dpkg -x into build/gpu-deps-root when the machine has no oneDNN / GoogleTest of its own.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p .gpu-deps
cd .gpu-deps
apt-get download libdnnl2 libdnnl-dev libgtest-dev ocl-icd-libopencl1 nlohmann-json3-dev \
  libtomlplusplus-dev zlib1g zlib1g-dev 2>&1 |
  grep -v "^W: Download is performed unsandboxed" || true
ls -la
