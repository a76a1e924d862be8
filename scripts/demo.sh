#!/usr/bin/env bash
# The Quick start demo: installs what is missing, builds, then trains a tiny character-level
# transformer with the Python API (examples/train_tiny_lm.py; about a minute on 2 cores).
# Extra arguments go to the example, e.g. `bash scripts/demo.sh --steps 100`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
PYTHONPATH="$(pwd)/python" .venv/bin/python examples/train_tiny_lm.py "$@"
