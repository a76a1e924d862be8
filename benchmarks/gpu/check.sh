#!/usr/bin/env bash
# The one-call GPU check (issue 3): on a machine with an NVIDIA GPU, from a clean tree,
#   1. configures and builds the CUDA configuration (library, C++ tests, GPU benchmarks, and the
#      Python module where pybind11 and Python headers exist),
#   2. runs the CUDA tests: td_cuda_tests (every CUDA op against the CPU backend, the GPT step),
#      the Python CUDA column of the op-conformance table and td.cuda's API tests,
#   3. runs the GPU benchmarks (GEMM vs raw cuBLASLt and the device peak, memory-bound kernels
#      vs a device-to-device copy, attention vs torch's SDPA where torch is importable),
#   4. prints one table (benchmarks/gpu/summarize.py) and keeps every log and JSON line in $OUT
#      (default build/gpu-check/out).
# Budget: under 8 minutes on one H200 (16 cores). Each stage has its own timeout so a hang cannot
# eat the budget; the exit status is non-zero when a build or a test failed.
#
# A bare GPU machine without oneDNN or GoogleTest: run scripts/gpu_deps.sh on a machine with apt
# first; it leaves the Debian packages in .gpu-deps/, which this script unpacks (dpkg -x, no
# root needed) into build/gpu-deps-root and puts on CMAKE_PREFIX_PATH.
#
#   bash benchmarks/gpu/check.sh                 # all stages
#   TD_GPU_ARCH=80 bash benchmarks/gpu/check.sh  # another architecture (default: the GPU's own)
#   TD_GPU_SKIP_BUILD=1 bash benchmarks/gpu/check.sh  # rerun tests and benchmarks on the last build
#   TD_GPU_STAGES="tests memcheck" bash benchmarks/gpu/check.sh  # only some stages after the build
#   TD_GPU_PREBUILT=.gpu-pre bash benchmarks/gpu/check.sh  # binaries built elsewhere by
#       scripts/gpu_prebuild.sh: only the Python module is compiled here (falls back to a full
#       build when they cannot load on this machine)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
ROOT=$(pwd)
BUILD=${TD_GPU_BUILD:-build/gpu-check}
OUT=${OUT:-$BUILD/out}
mkdir -p "$BUILD" "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=$(nproc)
T0=$(date +%s)
STATUS=0
stage() { echo; echo "=== [$(($(date +%s) - T0)) s] $*"; }
fail() { echo "FAILED: $*"; echo "$*" >>"$OUT/failures.txt"; STATUS=1; }
: >"$OUT/failures.txt"
# TD_GPU_STAGES: which stages after the build run (default all): tests memcheck python train
# layouts bench cpu
STAGES=" ${TD_GPU_STAGES:-tests memcheck python train layouts bench cpu} "
want() { [[ $STAGES == *" $1 "* ]]; }

stage "machine"
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  git -C "$ROOT" rev-parse --short HEAD 2>/dev/null | sed 's/^/commit: /'
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
    2>/dev/null | sed 's/^/gpu: /'
  (command -v nvcc || ls /usr/local/cuda/bin/nvcc) >/dev/null 2>&1 &&
    "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version | tail -1 | sed 's/^/nvcc: /'
  echo "cores: $JOBS"
  grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /cpu: /'
  echo "cpu amx: $(grep -m1 '^flags' /proc/cpuinfo | grep -o 'amx_[a-z0-9]*' | tr '\n' ' ')"
} | tee "$OUT/machine.txt"
if ! nvidia-smi >/dev/null 2>&1; then
  echo "no NVIDIA GPU visible (nvidia-smi failed): the build still runs, the tests will skip"
fi

stage "dependencies"
PREFIXES=()
if [[ -d .gpu-deps ]] && ls .gpu-deps/*.deb >/dev/null 2>&1; then
  DEPS_ROOT=$ROOT/build/gpu-deps-root
  if [[ ! -f /usr/include/dnnl.hpp || ! -f /usr/include/gtest/gtest.h ||
    ! -f /usr/include/nlohmann/json.hpp || ! -f /usr/include/toml++/toml.h ||
    ! -f /usr/include/zlib.h ]] ||
    ! ldconfig -p 2>/dev/null | grep -q libdnnl.so.2; then
    mkdir -p "$DEPS_ROOT"
    for f in .gpu-deps/*.deb; do
      if command -v dpkg >/dev/null 2>&1; then
        dpkg -x "$f" "$DEPS_ROOT"
      else  # a .deb is an ar archive holding data.tar.*
        (cd "$DEPS_ROOT" && ar x "$ROOT/$f" && tar -xf data.tar.* && rm -f data.tar.* control.tar.* debian-binary)
      fi
    done
    # zlib1g-dev's libz.so is an absolute link to Debian's /lib/.../libz.so.1.2.13: point it at
    # the unpacked zlib1g instead, so it resolves whatever zlib this machine has.
    for z in "$DEPS_ROOT"/lib/x86_64-linux-gnu/libz.so.1 "$DEPS_ROOT"/usr/lib/x86_64-linux-gnu/libz.so.1; do
      [[ -e $z ]] && ln -sf "$z" "$DEPS_ROOT/usr/lib/x86_64-linux-gnu/libz.so" && break
    done
    PREFIXES+=("$DEPS_ROOT/usr")
    export LD_LIBRARY_PATH="$DEPS_ROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "unpacked $(ls .gpu-deps/*.deb | wc -l) packages from .gpu-deps into $DEPS_ROOT"
  fi
fi
PY=${TD_PYTHON:-python3}
# MPI (the multi-rank layout stage): where this machine has Open MPI or MPICH with its compiler
# wrapper; else the build has no MPI and the layout stage says why it cannot run.
# The GPU image has none: Open MPI from the wheel scripts/gpu_deps.sh fetched (scripts/gpu_mpi.sh).
WITH_MPI=OFF
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicxx >/dev/null 2>&1; then
  # shellcheck source=../../scripts/gpu_mpi.sh
  source scripts/gpu_mpi.sh
  td_gpu_mpi || echo "no MPI here and no Open MPI wheel in .gpu-deps"
fi
if command -v mpirun >/dev/null 2>&1 && command -v mpicxx >/dev/null 2>&1; then WITH_MPI=ON; fi
WITH_PYTHON=OFF
PYBIND_DIR=$($PY -m pybind11 --cmakedir 2>/dev/null || true)
PY_INCLUDE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)
if [[ -n "$PYBIND_DIR" && -f "$PY_INCLUDE/Python.h" ]]; then
  WITH_PYTHON=ON
  PREFIXES+=("$PYBIND_DIR")
fi
echo "python: $($PY --version 2>&1) module: $WITH_PYTHON (pybind11: ${PYBIND_DIR:-none})"
ARCH=${TD_GPU_ARCH:-}
if [[ -z "$ARCH" ]]; then
  CC_=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
  ARCH=${CC_:-90}
fi
echo "CUDA architecture: sm_$ARCH"
# Runtime libraries a carried build may need: the toolkit's, and cuDNN/NCCL/cuBLAS from the pip
# wheels of this machine's PyTorch when the toolkit lacks them.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $($PY -c 'import nvidia, os, glob
print(" ".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null); do
  [[ -d $d ]] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done

if [[ -n "${TD_GPU_PREBUILT:-}" ]]; then
  stage "carried build ($TD_GPU_PREBUILT: $(cat "$TD_GPU_PREBUILT/BUILT_FROM" 2>/dev/null))"
  TD_GPU_PREBUILT=$(cd "$TD_GPU_PREBUILT" && pwd)
  if [[ -f "$TD_GPU_PREBUILT/prebuilt.tar.xz" ]]; then  # scripts/gpu_prebuild.sh's archive
    rm -rf "$ROOT/build/gpu-prebuilt"
    mkdir -p "$ROOT/build/gpu-prebuilt"
    $PY -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$TD_GPU_PREBUILT/prebuilt.tar.xz" "$ROOT/build/gpu-prebuilt" || fail "unpacking $TD_GPU_PREBUILT"
    TD_GPU_PREBUILT=$ROOT/build/gpu-prebuilt
  fi
  # Carried binaries from other sources than this tree's would not match its Python module or
  # tests: then build from source (the binaries' commit is the last word of BUILT_FROM).
  built=$(awk '{print $NF}' "$TD_GPU_PREBUILT/BUILT_FROM" 2>/dev/null)
  built=${built%+dirty}
  if [[ -n "$built" ]] && git -C "$ROOT" cat-file -e "$built^{commit}" 2>/dev/null &&
    ! git -C "$ROOT" diff --quiet "$built" -- src include kernels python/src tools cmake \
      CMakeLists.txt ':(glob)tests/**/*.cpp' ':(glob)tests/**/*.h' ':(glob)**/CMakeLists.txt' \
      ':(glob)benchmarks/**/*.cpp' ':(glob)benchmarks/**/*.h' 2>/dev/null; then
    echo "the carried binaries were built from $built and the sources have changed since"
    stale=1
  else
    stale=0
  fi
  missing=$(LD_LIBRARY_PATH="$TD_GPU_PREBUILT:$LD_LIBRARY_PATH" ldd \
    "$TD_GPU_PREBUILT"/libtardelli.so.*.*.* "$TD_GPU_PREBUILT/tests/td_cuda_tests" 2>&1 |
    grep "not found" | sort -u)
  if ((stale)) || [[ -n "$missing" ]] || ! LD_LIBRARY_PATH="$TD_GPU_PREBUILT:$LD_LIBRARY_PATH" \
    "$TD_GPU_PREBUILT/tests/td_cuda_tests" --gtest_list_tests >/dev/null 2>&1; then
    ((stale)) || echo "the carried binaries do not load here; building from source instead:"
    ((stale)) && echo "building from source instead (rerun scripts/gpu_prebuild.sh to carry them)"
    echo "$missing"
    unset TD_GPU_PREBUILT
  else
    BUILD=$(cd "$TD_GPU_PREBUILT" && pwd)
    export LD_LIBRARY_PATH="$BUILD:$LD_LIBRARY_PATH"
    echo "the carried binaries load; the Python module is compiled here"
    WITH_PYTHON_WANTED=$WITH_PYTHON
    WITH_PYTHON=OFF
    if [[ $WITH_PYTHON_WANTED == ON ]]; then
      PYOBJ=$ROOT/build/gpu-pyobj
      mkdir -p "$PYOBJ"
      CXX_=${CXX:-$(command -v g++ || command -v c++)}
      INC="-I$ROOT/include $($PY -m pybind11 --includes)"
      EXT=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
      if ls python/src/*.cpp | timeout 240 xargs -P "$JOBS" -I{} sh -c \
        "$CXX_ -O1 -fPIC -fvisibility=hidden -std=c++20 $INC -c {} -o $PYOBJ/\$(basename {}).o" \
        >"$OUT/pymodule.log" 2>&1 &&
        $CXX_ -shared -o "python/tardelli/_C$EXT" "$PYOBJ"/*.o -L"$BUILD" -l:libtardelli.so.0 \
          -Wl,-rpath,"$BUILD" >>"$OUT/pymodule.log" 2>&1; then
        WITH_PYTHON=ON
        echo "python module built in $(($(date +%s) - T0)) s"
      else
        tail -20 "$OUT/pymodule.log"
        fail "python module (against the carried library)"
      fi
    fi
  fi
fi

if [[ -n "${TD_GPU_PREBUILT:-}" ]]; then
  :
elif [[ -n "${TD_GPU_SKIP_BUILD:-}" ]]; then
  [[ -x "$BUILD/tests/td_cuda_tests" ]] || { fail "TD_GPU_SKIP_BUILD: no build in $BUILD"; exit 1; }
  [[ -f "$BUILD/CMakeCache.txt" ]] && grep -q "TD_WITH_PYTHON:BOOL=ON" "$BUILD/CMakeCache.txt" ||
    WITH_PYTHON=OFF
  echo "reusing the build in $BUILD (python module: $WITH_PYTHON)"
else
stage "configure and build (CUDA, sm_$ARCH, $JOBS jobs)"
PREFIX_PATH=$(IFS=';'; echo "${PREFIXES[*]:-}")
if ! timeout 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTD_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DTD_WITH_MPI=$WITH_MPI \
  -DTD_WITH_PYTHON=$WITH_PYTHON -DPython3_EXECUTABLE="$(command -v $PY)" \
  -DTD_BUILD_BENCHMARKS=ON -DTD_BUILD_TESTS=ON -DCMAKE_PREFIX_PATH="$PREFIX_PATH" \
  >"$OUT/configure.log" 2>&1; then
  tail -30 "$OUT/configure.log"
  fail "configure"
  exit 1
fi
if ! timeout 330 cmake --build "$BUILD" -j "$JOBS" >"$OUT/build.log" 2>&1; then
  grep -E "error|Error" "$OUT/build.log" | head -40
  fail "build"
  exit 1
fi
echo "built in $(($(date +%s) - T0)) s"
# Whether the cuDNN attention path is compiled in (cmake/cuda.cmake, Note [cuDNN frontend]).
grep -o "cuDNN frontend [0-9.]*\|no cuDNN frontend[^,]*" "$OUT/configure.log" | head -1
fi

EXCLUDE=""
if want tests; then
stage "C++ CUDA tests (td_cuda_tests)"
# A kernel that faults kills the process (and its CUDA context): rerun without the test that was
# running, up to three times, so one crash does not hide the results of the tests after it.
for attempt in 1 2 3 4; do
  timeout 180 "$BUILD/tests/td_cuda_tests" --gtest_output=json:"$OUT/td_cuda_tests.json" \
    ${EXCLUDE:+--gtest_filter=-${EXCLUDE#:}} >"$OUT/td_cuda_tests.log" 2>&1
  rc=$?
  cat "$OUT/td_cuda_tests.log" >>"$OUT/td_cuda_tests_all.log"
  ((rc == 0)) && break
  if grep -q '^\[==========\] .* ran\.' "$OUT/td_cuda_tests.log"; then
    fail "td_cuda_tests"
    break
  fi
  crashed=$(grep '^\[ RUN      \]' "$OUT/td_cuda_tests.log" | tail -1 | awk '{print $NF}')
  fail "td_cuda_tests crashed (exit $rc) in ${crashed:-?}"
  [[ -z "$crashed" ]] && break
  EXCLUDE="$EXCLUDE:$crashed"
done
grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]|^\[  FAILED  \]|tests? ran' "$OUT/td_cuda_tests.log" |
  tail -40
fi
# The same tests under compute-sanitizer's memcheck (out-of-bounds and misaligned accesses, leaks
# of device memory), where the tool works (Firecracker machines; not gVisor): capped at 150 s, a
# run cut short by the cap reports what it saw so far. Not in TD_GPU_STAGES: skipped.
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [[ -n "$SAN" ]] && want memcheck; then
  stage "td_cuda_tests under compute-sanitizer (memcheck)"
  # On the H200 (2026-11-30) the sanitizer disabled itself here ("CUDA initialized before the
  # Sanitizer"), also with OpenCL's ICDs hidden (OCL_ICD_VENDORS=<empty dir>): the cause is not
  # known. The stage then reports the tool unavailable rather than a failure.
  timeout 150 "$SAN" --tool memcheck --leak-check no --print-limit 20 \
    "$BUILD/tests/td_cuda_tests" ${EXCLUDE:+--gtest_filter=-${EXCLUDE#:}} \
    >"$OUT/memcheck.log" 2>&1
  rc=$?
  grep -E "ERROR SUMMARY|Sanitizer will be disabled|^\[  (PASSED|FAILED)  \]" "$OUT/memcheck.log" |
    head -20
  if grep -q "Sanitizer will be disabled" "$OUT/memcheck.log"; then
    env | grep -iE "cuda|inject|^LD_|OCL" | sort >"$OUT/memcheck_env.txt"
    echo "memcheck unavailable here: the sanitizer disabled itself (environment in memcheck_env.txt)"
  elif ((rc == 124)); then
    echo "memcheck stopped at its 150 s cap"
  elif grep -q "ERROR SUMMARY: [1-9]" "$OUT/memcheck.log"; then
    grep -m 10 -A6 "========= Invalid\|========= Program hit" "$OUT/memcheck.log"
    fail "compute-sanitizer memcheck found errors"
  elif ((rc != 0)); then
    fail "td_cuda_tests under memcheck (exit $rc)"
  fi
fi

# The CPU-side CUDA runtime tests (allocator policy, stream/event round trips) live in td_tests.
if want tests; then
if ! timeout 60 "$BUILD/tests/td_tests" --gtest_filter='CudaRuntime*:CachingAllocator*' \
  >"$OUT/td_tests_cuda_runtime.log" 2>&1; then
  fail "td_tests (CUDA runtime)"
fi
tail -3 "$OUT/td_tests_cuda_runtime.log"
fi

if [[ $WITH_PYTHON == ON ]] && want python; then
  stage "Python CUDA tests (conformance table on CUDA, td.cuda)"
  if ! PYTHONPATH=python timeout 240 $PY -m pytest -q -p no:cacheprovider \
    tests/python/test_cuda_api.py tests/python/test_gpt_cuda.py "tests/python/test_conformance.py::test_cuda_vs_cpu" \
    -n "$(( JOBS > 8 ? 8 : JOBS ))" >"$OUT/pytest_cuda.log" 2>&1; then
    # pytest-xdist may be missing: retry serially
    if grep -q "unrecognized arguments: -n" "$OUT/pytest_cuda.log"; then
      PYTHONPATH=python timeout 240 $PY -m pytest -q -p no:cacheprovider \
        tests/python/test_cuda_api.py tests/python/test_gpt_cuda.py "tests/python/test_conformance.py::test_cuda_vs_cpu" \
        >"$OUT/pytest_cuda.log" 2>&1 || fail "pytest (CUDA)"
    else
      fail "pytest (CUDA)"
    fi
  fi
  tail -15 "$OUT/pytest_cuda.log"
fi
if [[ $WITH_PYTHON == ON ]] && want train; then
  stage "training the demo-sized GPT on the GPU (python -m tardelli.train --device cuda)"
  if ! PYTHONPATH=python PYTHONFAULTHANDLER=1 timeout 120 $PY -m tardelli.train --device cuda --synthetic-data \
    --vocab-size 4096 --layers 4 --d-model 256 --heads 4 --seq-len 256 --micro-batch-size 8 \
    --steps 30 --warmup-steps 5 --log-interval 10 --eval-interval 0 --no-progress \
    --metrics-file "$OUT/train_metrics.jsonl" >"$OUT/train.log" 2>&1; then
    fail "training on the GPU"
  fi
  tail -8 "$OUT/train.log"
  if grep -q "loss plot not drawn" "$OUT/train.log"; then
    # Which import crashes, and with what loaded (seen: a segfault importing matplotlib.pyplot).
    for v in "plain" "with tardelli" "empty LD_LIBRARY_PATH"; do
      case $v in
        plain) pre="" lp="$LD_LIBRARY_PATH" ;;
        "with tardelli") pre="import tardelli;" lp="$LD_LIBRARY_PATH" ;;
        *) pre="" lp="" ;;
      esac
      LD_LIBRARY_PATH="$lp" PYTHONPATH=python timeout 60 $PY -c \
        "${pre}import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot" \
        >/dev/null 2>&1
      echo "import matplotlib.pyplot ($v): exit $?"
    done
  fi
fi

# Issue 23: every parallel layout on CUDA tensors, 2 and 4 ranks sharing the GPU (their groups
# stage through host memory over MPI), against one process on the GPU.
if want layouts; then
  stage "parallel layouts on the GPU (2 and 4 ranks sharing it; benchmarks/gpu/layout_parity.py)"
  if [[ $WITH_MPI != ON ]]; then
    echo "skipped: no MPI on this machine (mpirun and mpicxx not found); the layouts need it"
    echo "layouts: skipped (no MPI)" >>"$OUT/failures.txt"
  elif [[ $WITH_PYTHON != ON ]]; then
    echo "skipped: no Python module in this build"
  else
    MPIENV=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TD_COMM_TIMEOUT_S=60)
    if [[ -x "$BUILD/tests/distributed/td_dist_tests" ]]; then
      "${MPIENV[@]}" timeout 60 mpirun --oversubscribe --bind-to none -np 2 \
        "$BUILD/tests/distributed/td_dist_tests" --gtest_filter='HostStaged*:NcclCommunicator*' \
        >"$OUT/host_staged.log" 2>&1 || fail "td_dist_tests HostStaged*, NcclCommunicator* (2 ranks)"
      grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/host_staged.log" | head -5
    fi
    # Issue 23: NCCL at one rank, then the shared-device path (2 ranks on the GPU), on CUDA
    # tensors up to 64 MiB (benchmarks/comm_bench.cpp's GPU mode).
    if [[ -x "$BUILD/benchmarks/comm_bench" ]]; then
      for np in 1 2; do
        "${MPIENV[@]}" timeout 90 mpirun --oversubscribe --bind-to none -np $np \
          "$BUILD/benchmarks/comm_bench" 67108864 --device cuda >>"$OUT/comm_gpu.jsonl" \
          2>>"$OUT/comm_gpu.err" || fail "comm_bench --device cuda at $np ranks"
      done
      grep -E '"size_bytes": 6710886' "$OUT/comm_gpu.jsonl" | head -12
    fi
    "${MPIENV[@]}" PYTHONPATH=python timeout 300 $PY benchmarks/gpu/layout_parity.py \
      --device cuda >"$OUT/layouts.jsonl" 2>"$OUT/layouts.err" || fail "layout parity on CUDA"
    $PY - "$OUT/layouts.jsonl" <<'PYEOF' || true
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "layout" in r:
        print(f"{r['layout']:18s} ranks {r.get('ranks', '-')} {r.get('dtype', '')}: "
              f"max rel diff {r.get('max_rel_diff', float('nan')):.2e} "
              f"(tol {r.get('rtol', float('nan')):.0e}) {'ok' if r['ok'] else 'FAIL ' + r.get('error', '')[-300:]}")
PYEOF
  fi
fi

BENCH="$OUT/bench.jsonl"
: >"$BENCH"
if want bench; then
stage "GPU benchmarks"
for b in gemm_bench memory_bound_bench attention_bench; do
  if [[ -x "$BUILD/benchmarks/gpu/$b" ]]; then
    timeout 120 "$BUILD/benchmarks/gpu/$b" 2>"$OUT/$b.err" | tee -a "$BENCH" ||
      fail "$b (exit $?; $OUT/$b.err)"
  else
    fail "$b was not built"
  fi
done
timeout 120 $PY benchmarks/gpu/torch_sdpa_bench.py 2>"$OUT/torch_sdpa_bench.err" | tee -a "$BENCH" ||
  echo "torch SDPA reference unavailable (see $OUT/torch_sdpa_bench.err)"
if [[ $WITH_PYTHON == ON ]]; then  # GPT-2 small train step, td vs eager torch (bf16, then fp32)
  for dt in bf16 fp32; do
    PYTHONPATH=python timeout 180 $PY benchmarks/gpu/gpt_step_bench.py --dtype $dt \
      $([[ $dt == bf16 ]] && echo --profile 25) \
      2>"$OUT/gpt_step_bench_$dt.err" | tee -a "$BENCH" || fail "gpt_step_bench $dt (exit $?)"
  done
  # Issue 24: the bf16 step with forward + backward replayed from a CUDA graph.
  PYTHONPATH=python timeout 180 $PY benchmarks/gpu/gpt_step_bench.py --dtype bf16 --cuda-graph \
    --no-torch 2>"$OUT/gpt_step_bench_graph.err" | tee -a "$BENCH" || fail "gpt_step_bench graph (exit $?)"
  # Issue 27: the same step with the blocks' linears in FP8 (hybrid, cuBLASLt FP8 GEMMs), to set
  # beside the bf16 row above.
  PYTHONPATH=python timeout 180 $PY benchmarks/gpu/gpt_step_bench.py --dtype bf16 --fp8 hybrid \
    --no-torch 2>"$OUT/gpt_step_bench_fp8.err" | tee -a "$BENCH" || fail "gpt_step_bench fp8 (exit $?)"
fi
fi

# Issue 4's bf16 target is a CPU one (the fused GPT-2 step in bf16 >= 2.5x torch fp32, 2 threads)
# and needs AMX, which the build machine lacks: where this host's CPU has it, check that bf16
# products run on AMX and time the step in both dtypes against torch (about 2 minutes).
if want cpu && grep -q '^flags.* amx_bf16' /proc/cpuinfo; then
  stage "CPU: bf16 on AMX (the fused GPT-2 train step, 2 threads)"
  timeout 60 "$BUILD/tests/td_tests" --gtest_filter='Matmul.*' >"$OUT/td_tests_matmul.log" 2>&1 ||
    fail "td_tests Matmul.* (bf16 on AMX; $OUT/td_tests_matmul.log)"
  tail -3 "$OUT/td_tests_matmul.log"
  if [[ $WITH_PYTHON == ON ]]; then
    for dt in bf16 fp32; do
      PYTHONPATH=python timeout 150 $PY benchmarks/train_step.py --dtype $dt --threads 2 \
        --steps 6 --warmup 2 --no-memory --compare-torch --torch-configs default \
        --torch-steps 4 --torch-warmup 1 --rounds 1 2>"$OUT/cpu_train_step_$dt.err" |
        tail -1 | tee -a "$BENCH" || fail "CPU train_step $dt (exit $?)"
    done
  fi
fi

stage "summary"
for f in layouts.jsonl comm_gpu.jsonl; do  # the layouts stage's results into the table too
  [[ -f "$OUT/$f" ]] && cat "$OUT/$f" >>"$BENCH"
done
$PY benchmarks/gpu/summarize.py --bench "$BENCH" --machine "$OUT/machine.txt" \
  --gtest "$OUT/td_cuda_tests.json" --pytest "$OUT/pytest_cuda.log" --failures "$OUT/failures.txt" |
  tee "$OUT/summary.md"
# Few files in $OUT (the device tool brings back at most 8): the table, the raw JSON lines, the
# machine, the failures and the test report stay loose; every other log goes into one archive.
(
  cd "$OUT" || exit
  logs=()
  for f in *; do
    case $f in
      summary.md | bench.jsonl | machine.txt | failures.txt | td_cuda_tests.json | logs.tar.gz) ;;
      *) [[ -f $f ]] && logs+=("$f") ;;
    esac
  done
  if ((${#logs[@]})); then tar czf logs.tar.gz "${logs[@]}" && rm -f "${logs[@]}"; fi
)
echo "total $(($(date +%s) - T0)) s; results in $OUT (other logs in $OUT/logs.tar.gz)"
exit $STATUS
