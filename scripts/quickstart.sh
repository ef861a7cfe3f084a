#!/usr/bin/env bash
# Set everything up, then run examples/quickstart.ipynb headless in a real kernel: its
# %%dlc cell trains a small DDP model as 2 nodes x 2 processes on the embedded launcher.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec python3 scripts/run_quickstart.py
