#!/usr/bin/env bash
# Make a virtualenv with shardio installed editable and its development tools (tests, benchmarks).
#   usage: bash tools/setup.sh [VENV_DIR]        (default: .venv, relative to where you run it)
# The README, CI (.ci/run) and developers all use this script, so they install the same things.
set -euo pipefail

venv="${1:-.venv}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"

"$python" -m venv "$venv"
# torch first, and pinned: shardio's bare "torch" requirement would otherwise let pip choose a CUDA build
# (gigabytes of nvidia-* wheels). With the pin, pip takes a CPU wheel wherever one is offered (a local
# --find-links folder, or an index set in PIP_INDEX_URL / PIP_EXTRA_INDEX_URL); TORCH_SPEC overrides it.
"$venv/bin/python" -m pip install "${TORCH_SPEC:-torch==2.13.0}"
"$venv/bin/python" -m pip install -e "$repo[dev]"
