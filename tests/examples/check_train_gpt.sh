#!/usr/bin/env bash
# The C++ trainer (examples/train_gpt.cpp, built against the installed library) end to end:
#   1. trains 20 steps on a preprocessed corpus and checkpoints;
#   2. a run stopped after step 10 and resumed prints the same per-step losses (6 decimals) and
#      the same validation loss as the uninterrupted run;
#   3. its checkpoint loads in Python (`python -m tardelli.generate`): one layout for both;
#   4. --dtype fp16 with an inf injected into step 6's backward: that step is reported skipped
#      and the loss scale halves for step 7, and a run stopped after step 4 and resumed prints
#      the same losses, scales and skips (the scaler's state is in the checkpoint).
# Usage: check_train_gpt.sh TRAIN_GPT_BINARY PYTHON
set -euo pipefail
bin="$1"
py="$2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
d="$(mktemp -d)"
trap 'rm -rf "${d}"' EXIT
export PYTHONPATH="${root}/python"

"${py}" -m tardelli.data.preprocess --input "${root}/examples/data/tiny_corpus.txt" \
  --output-prefix "${d}/tiny" --vocab-size 512 >/dev/null
flags=(--data "${d}/tiny" --layers 2 --d-model 64 --heads 4 --seq-len 32 --micro-batch-size 4
  --steps 20 --warmup-steps 4 --log-interval 1 --eval-iters 2 --split 80,20,0)
losses() { grep -E '^(step|valid)' "$1" | sed -E 's/ \| [0-9.]+ tokens\/s//'; }

"${bin}" "${flags[@]}" --save "${d}/a" >"${d}/a.log"
"${bin}" "${flags[@]}" --save "${d}/b" --exit-at 10 >"${d}/b1.log"
"${bin}" "${flags[@]}" --save "${d}/b" --resume >"${d}/b2.log"

# Steps 11..20 and the final validation loss of the uninterrupted run vs the resumed run.
if ! diff <(losses "${d}/a.log" | grep -vE '^step +([1-9]|10) ') <(losses "${d}/b2.log"); then
  echo "check_train_gpt: the resumed run differs from the uninterrupted one" >&2
  exit 1
fi
first="$(losses "${d}/a.log" | head -n 1 | sed -E 's/.*loss ([0-9.]+).*/\1/')"
final="$(losses "${d}/a.log" | grep '^step' | tail -n 1 | sed -E 's/.*loss ([0-9.]+).*/\1/')"
if ! awk -v a="${first}" -v b="${final}" 'BEGIN { exit !(b < a - 0.5) }'; then
  echo "check_train_gpt: the loss did not fall (${first} -> ${final})" >&2
  exit 1
fi
"${py}" -m tardelli.generate --checkpoint "${d}/a" --prompt "The" --max-new-tokens 8 >/dev/null

fp16=("${flags[@]}" --steps 10 --dtype fp16 --initial-loss-scale 1024
  --loss-scale-window 3 --inject-nonfinite-grad 6)
"${bin}" "${fp16[@]}" --save "${d}/h" >"${d}/h.log"
"${bin}" "${fp16[@]}" --save "${d}/i" --exit-at 4 >"${d}/i1.log"
"${bin}" "${fp16[@]}" --save "${d}/i" --resume >"${d}/i2.log"
scale_of() { grep -E "^step +$2 " "$1" | sed -E 's/.*loss scale ([0-9.e+]+).*/\1/'; }
if ! grep -qE '^step +6 .*loss scale 2048 \(skipped\)' "${d}/h.log" ||
  [[ "$(grep -c skipped "${d}/h.log")" != 1 || "$(scale_of "${d}/h.log" 7)" != 1024 ]]; then
  echo "check_train_gpt: fp16 step 6 was not skipped with the scale backing off:" >&2
  grep '^step' "${d}/h.log" >&2
  exit 1
fi
if ! diff <(losses "${d}/h.log" | grep -vE '^step +[1-4] ') <(losses "${d}/i2.log"); then
  echo "check_train_gpt: the resumed fp16 run differs from the uninterrupted one" >&2
  exit 1
fi
echo "check_train_gpt: loss ${first} -> ${final}; resume exact; checkpoint loads in Python;" \
  "fp16 overflow skipped and resume exact"
