#!/usr/bin/env bash
# Builds (scripts/setup.sh) and runs every test: the GoogleTest suites through ctest, the Python
# tests through pytest, and a check that an installed libtardelli works from another CMake
# project (examples/cpp through find_package(tardelli)). Runs everything even when something
# fails, exits non-zero if anything failed, and ends with one line "N passed, N failed".
# Same environment variables as setup.sh (CI, TD_PRESET, TD_BUILD_DIR).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
root="$(pwd)"

if [[ -z "${TD_PRESET:-}" ]]; then
  if [[ "${CI:-}" == "true" ]]; then TD_PRESET=ci; else TD_PRESET=cpu; fi
fi
export TD_PRESET
build_dir="${TD_BUILD_DIR:-build/${TD_PRESET}}"
export TD_BUILD_DIR="${build_dir}"

passed=0
failed=0
skipped=0
problems=()

note_failure() {
  problems+=("$1")
}

# ---- build ----
if ! bash scripts/setup.sh; then
  echo "test: the build failed" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

# ---- C++ tests (ctest) ----
log="$(mktemp)"
ctest --test-dir "${build_dir}" --output-on-failure -j2 2>&1 | tee "${log}"
ctest_rc=${PIPESTATUS[0]}
# "100% tests passed, 0 tests failed out of 312"
summary="$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "${log}" | tail -n 1)"
if [[ -n "${summary}" ]]; then
  n_failed="$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"${summary}")"
  n_total="$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"${summary}")"
  # Skipped tests (the CUDA suites without a GPU) count as neither passed nor failed.
  n_skipped="$(grep -cE '^[[:space:]]*[0-9]+ - .*\(Skipped\)$' "${log}" || true)"
  passed=$((passed + n_total - n_failed - n_skipped))
  failed=$((failed + n_failed))
  skipped=$((skipped + n_skipped))
  ((ctest_rc != 0 && n_failed == 0)) && { failed=$((failed + 1)); note_failure "ctest exited ${ctest_rc}"; }
  ((n_failed > 0)) && note_failure "ctest: ${n_failed} failed"
elif grep -q "No tests were found" "${log}"; then
  echo "test: ctest found no tests"
else
  failed=$((failed + 1))
  note_failure "ctest exited ${ctest_rc} without a summary"
fi
rm -f "${log}"

# ---- Python tests (pytest) ----
if [[ -d tests/python ]]; then
  log="$(mktemp)"
  PYTHONPATH="${root}/python" "${root}/.venv/bin/python" -m pytest -q tests/python 2>&1 | tee "${log}"
  pytest_rc=${PIPESTATUS[0]}
  if ((pytest_rc == 5)); then
    echo "test: pytest collected no tests"
  else
    # The closing line: "3 failed, 120 passed, 2 skipped in 4.2s" (any order, any subset).
    last="$(grep -E '(passed|failed|error)' "${log}" | tail -n 1)"
    n_pass="$(grep -oE '[0-9]+ passed' <<<"${last}" | grep -oE '[0-9]+' || true)"
    n_fail="$(grep -oE '[0-9]+ failed' <<<"${last}" | grep -oE '[0-9]+' || true)"
    n_err="$(grep -oE '[0-9]+ errors?' <<<"${last}" | grep -oE '[0-9]+' || true)"
    n_skip="$(grep -oE '[0-9]+ skipped' <<<"${last}" | grep -oE '[0-9]+' || true)"
    passed=$((passed + ${n_pass:-0}))
    skipped=$((skipped + ${n_skip:-0}))
    failed=$((failed + ${n_fail:-0} + ${n_err:-0}))
    if ((pytest_rc != 0)); then
      note_failure "pytest exited ${pytest_rc}"
      ((${n_fail:-0} + ${n_err:-0} == 0)) && failed=$((failed + 1))
    fi
  fi
  rm -f "${log}"
fi

# ---- the installed package works from another CMake project ----
prefix="$(mktemp -d)"
consumer="$(mktemp -d)"
if cmake --install "${build_dir}" --prefix "${prefix}" >/dev/null &&
  cmake -S examples/cpp -B "${consumer}" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="${prefix}" >/dev/null &&
  cmake --build "${consumer}" &&
  "${consumer}/tensor_basics"; then
  echo "test: installed package OK (find_package(tardelli) from examples/cpp)"
  passed=$((passed + 1))
  # The C++ trainer built from the installed package: trains, resumes exactly, and its
  # checkpoint loads in Python.
  if bash tests/examples/check_train_gpt.sh "${consumer}/train_gpt" "${root}/.venv/bin/python"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    note_failure "examples/train_gpt.cpp check"
  fi
  # A custom C++ trainer around td::train::Trainer, built from the installed package, trains on
  # two tensor-parallel ranks exactly as the installed tardelli-train does.
  if bash tests/examples/check_custom_trainer.sh "${consumer}/custom_trainer" \
    "${prefix}/bin/tardelli-train" "${root}/.venv/bin/python"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    note_failure "examples/cpp/custom_trainer.cpp check"
  fi
else
  echo "test: installed package check FAILED" >&2
  failed=$((failed + 1))
  note_failure "install + examples/cpp"
fi
rm -rf "${prefix}" "${consumer}"

if ((${#problems[@]} > 0)); then
  echo "test: problems: ${problems[*]}"
fi
((skipped > 0)) && echo "test: ${skipped} skipped (CUDA tests skip without a GPU; run benchmarks/gpu/check.sh on one)"
echo "${passed} passed, ${failed} failed"
((failed == 0))
