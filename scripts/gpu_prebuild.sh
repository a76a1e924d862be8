#!/usr/bin/env bash
# Builds, here (2 cores, ccache), what the GPU check runs, for the H200's architecture only, and
# copies the pieces into .gpu-pre/ (git-ignored) for the device tool to carry: the stripped
# library (with MPI: Open MPI from .gpu-deps, scripts/gpu_mpi.sh), td_cuda_tests, td_tests,
# td_dist_tests, comm_bench and the GPU benchmarks. benchmarks/gpu/check.sh with
# TD_GPU_PREBUILT=.gpu-pre then spends the lease on tests and timings, not on nvcc; only the
# Python module is compiled there (it must match that machine's Python). If the carried binaries
# cannot load there, check.sh falls back to a full build on the GPU machine.
#   bash scripts/gpu_prebuild.sh            # sm_90 (H100/H200)
#   TD_GPU_ARCH=80 bash scripts/gpu_prebuild.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ARCH=${TD_GPU_ARCH:-90}
BUILD=build/gpu-pre$([[ $ARCH == 90 ]] || echo "-sm$ARCH")
# MPI: the Open MPI the GPU machine will run with (scripts/gpu_mpi.sh; the layouts stage and
# td_dist_tests need it), so the carried library links that MPI's libmpi.
# shellcheck source=gpu_mpi.sh
source scripts/gpu_mpi.sh
if ! td_gpu_mpi; then
  echo "gpu_prebuild: no Open MPI wheel in .gpu-deps (run scripts/gpu_deps.sh first)" >&2
  exit 1
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTD_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DTD_WITH_MPI=ON -DMPI_CXX_COMPILER="$OPAL_PREFIX/bin/mpicxx" \
  -DMPI_C_COMPILER="$OPAL_PREFIX/bin/mpicc" -DTD_WITH_PYTHON=OFF -DTD_WERROR=ON \
  -DTD_BUILD_BENCHMARKS=ON -DTD_BUILD_TESTS=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target tardelli td_cuda_tests td_tests td_dist_tests \
  gemm_bench memory_bound_bench attention_bench comm_bench
rm -rf .gpu-pre
mkdir -p .gpu-pre/tests/distributed .gpu-pre/benchmarks/gpu
cp -a "$BUILD"/libtardelli.so* .gpu-pre/
cp "$BUILD"/tests/td_cuda_tests "$BUILD"/tests/td_tests .gpu-pre/tests/
cp "$BUILD"/tests/distributed/td_dist_tests .gpu-pre/tests/distributed/
cp "$BUILD"/benchmarks/gpu/{gemm_bench,memory_bound_bench,attention_bench} .gpu-pre/benchmarks/gpu/
cp "$BUILD"/benchmarks/comm_bench .gpu-pre/benchmarks/
strip --strip-unneeded .gpu-pre/libtardelli.so.*.*.* .gpu-pre/tests/td_* \
  .gpu-pre/tests/distributed/* .gpu-pre/benchmarks/gpu/* .gpu-pre/benchmarks/comm_bench
echo "sm_$ARCH mpi $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+dirty')" \
  >.gpu-pre/BUILT_FROM
# The device tool carries at most 64 MiB (.gpu-deps included) and the library alone is ~50 MB:
# carried as one xz archive (~9 MB), which check.sh unpacks.
tar -C .gpu-pre -cf - . | xz -T0 -6 >prebuilt.tar.xz.tmp
rm -rf .gpu-pre
mkdir -p .gpu-pre
mv prebuilt.tar.xz.tmp .gpu-pre/prebuilt.tar.xz
tar -xJOf .gpu-pre/prebuilt.tar.xz ./BUILT_FROM >.gpu-pre/BUILT_FROM
du -sh .gpu-pre .gpu-deps
