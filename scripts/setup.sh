#!/usr/bin/env bash
# Installs what the build needs (only what is missing) and builds Tardelli.
#   bash scripts/setup.sh            # configure + build with the `cpu` preset (build/cpu)
#   CI=true bash scripts/setup.sh    # the `ci` preset: warnings are errors (build/ci)
#   TD_PRESET=cuda bash scripts/setup.sh   # any preset from CMakePresets.json
#   TD_BUILD_DIR=build/mine bash scripts/setup.sh  # same preset, another build folder
#   TD_SETUP_UNTIL=configure bash scripts/setup.sh # stop after packages / configure / build
# Idempotent: a second run installs nothing and rebuilds only what changed. Python: Debian's
# /usr/bin/python3 with apt packages (numpy, pytest, torch as a test oracle), plus a virtual
# environment .venv over it (--system-site-packages) for the few PyPI-only packages
# (transformers, safetensors, tokenizers): scripts run .venv/bin/python.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -z "${TD_PRESET:-}" ]]; then
  if [[ "${CI:-}" == "true" ]]; then TD_PRESET=ci; else TD_PRESET=cpu; fi
fi
until_step="${TD_SETUP_UNTIL:-build}"
case "${until_step}" in
  packages | configure | build) ;;
  *)
    echo "setup: TD_SETUP_UNTIL must be packages, configure or build, got '${until_step}'" >&2
    exit 2
    ;;
esac

# Everything the build, the tests and the demo use, named explicitly: installs skip Recommends
# (below), so a package that another one only recommends must be listed here. libdnnl-dev's CMake
# config looks for OpenCL, which it reaches only through a Recommends (ocl-icd-opencl-dev);
# .ci/run checks this list in a minimal Debian root (scripts/check_clean_setup.sh).
packages=(
  ca-certificates cmake ninja-build g++ ccache
  libdnnl-dev ocl-icd-opencl-dev libomp-dev libgtest-dev nlohmann-json3-dev libtomlplusplus-dev
  zlib1g-dev
  pybind11-dev python3-dev python3-numpy python3-pytest python3-torch python3-venv
  openmpi-bin libopenmpi-dev
  python3-matplotlib fortunes
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "setup: installing ${missing[*]}"
  if [[ "$(id -u)" -eq 0 ]]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "setup: missing packages (${missing[*]}) and neither root nor sudo is available" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -q
  # No recommends: python3-torch would otherwise pull libtorch-dev (~1 GB) that we never use.
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
fi

# PyPI packages, pinned: transformers 4.45 is the last line that accepts Debian's torch 1.13.
pip_packages=(transformers==4.45.2 tokenizers==0.20.3 safetensors==0.8.0 huggingface_hub==0.36.2)
if ! .venv/bin/python -c "import transformers, tokenizers, safetensors" >/dev/null 2>&1; then
  echo "setup: creating .venv and installing ${pip_packages[*]}"
  /usr/bin/python3 -m venv --system-site-packages .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check "${pip_packages[@]}"
fi
# The cuDNN frontend's C++ headers for the CUDA build's fused attention (Note [cuDNN frontend] in
# cmake/cuda.cmake finds them in .venv's site-packages/include). Only the headers are used, so
# --no-deps leaves out the wheel's Python dependencies (CUTLASS DSL, TVM FFI). Not fatal: without
# them the CUDA build compiles the cuDNN path out and says so.
cudnn_frontend=nvidia-cudnn-frontend==1.32.0
if ! compgen -G ".venv/lib/python3*/site-packages/include/cudnn_frontend.h" >/dev/null; then
  echo "setup: installing ${cudnn_frontend} (headers only) into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "${cudnn_frontend}" ||
    echo "setup: could not install ${cudnn_frontend}; CUDA builds will use only Tardelli's own" \
      "attention kernels" >&2
fi
[[ "${until_step}" == packages ]] && exit 0

# ccache needs a writable cache folder even where HOME is unset (some CI environments).
export CCACHE_DIR="${CCACHE_DIR:-${HOME:-/root}/.cache/ccache}"
# Paths relative to the checkout in ccache's hash, so a fresh clone elsewhere (CI) hits the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"

build_dir="${TD_BUILD_DIR:-build/${TD_PRESET}}"
echo "setup: configuring preset '${TD_PRESET}' in ${build_dir}"
cmake --preset "${TD_PRESET}" -B "${build_dir}"
[[ "${until_step}" == configure ]] && exit 0
echo "setup: building ${build_dir}"
cmake --build "${build_dir}"
