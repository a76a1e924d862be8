#!/usr/bin/env bash
# The installed package's training loop from a custom C++ trainer (examples/cpp/custom_trainer
# built through find_package(tardelli)): a 2-rank tensor-parallel run starts at an untrained
# model's loss (ln(vocab) on uniform random tokens) and takes exactly the steps of the installed
# tardelli-train with the same flags (each printed loss equals the binary's metrics row at the
# printed precision).
# Usage: check_custom_trainer.sh CUSTOM_TRAINER TARDELLI_TRAIN PYTHON
set -euo pipefail
trainer="$1"
binary="$2"
python="$3"
if ! command -v mpirun >/dev/null; then
  echo "check_custom_trainer: mpirun is not installed" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export TD_COMM_TIMEOUT_S=60
flags=(--synthetic-data --vocab-size 128 --layers 2 --d-model 32 --heads 4 --seq-len 16
  --micro-batch-size 4 --steps 12 --lr 3e-3 --tp 2 --sequence-parallel --eval-interval 0
  --no-progress)
mpi=(mpirun --oversubscribe --bind-to none -np 2)
timeout 300 "${mpi[@]}" "${trainer}" "${flags[@]}" --patience 100 >"${work}/custom.txt"
timeout 300 "${mpi[@]}" "${binary}" "${flags[@]}" --metrics-file "${work}/m.jsonl" >/dev/null
"${python}" - "${work}/custom.txt" "${work}/m.jsonl" <<'PY'
import json, re, sys
custom = [l for l in open(sys.argv[1]) if l.startswith("step ")]
rows = [json.loads(l) for l in open(sys.argv[2])]
got = [(int(m.group(1)), float(m.group(2))) for m in
       (re.match(r"step (\d+) loss ([0-9.]+) .* tp 2 dp 1", l) for l in custom)]
want = [(r["step"], round(r["loss"], 4)) for r in rows]
assert got == want, f"custom trainer {got} != tardelli-train {want}"
# Uniform random tokens: an untrained model's loss is about ln(vocab) (a wrong model shape or
# a broken tp layout would show here before anything else).
import math
assert abs(got[0][1] - math.log(128)) < 0.3, f"first loss {got[0][1]} vs ln 128 = {math.log(128):.3f}"
print(f"check_custom_trainer: OK (2-rank tp + sp, {len(got)} steps equal to tardelli-train)")
PY
