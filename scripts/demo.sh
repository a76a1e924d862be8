#!/usr/bin/env bash
# The Quick start demo: installs what is missing, builds, preprocesses the `fortunes` corpus and
# trains a GPT of a few million parameters on it for about five minutes, then prints the
# validation loss against the unigram entropy and a few samples (examples/train_fortunes.py).
# Extra arguments go to the example, e.g. `bash scripts/demo.sh --steps 50` for a quick look.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
PYTHONPATH="$(pwd)/python" .venv/bin/python examples/train_fortunes.py "$@"
