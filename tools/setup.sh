#!/usr/bin/env bash
# Make a virtualenv with shardio installed editable and the extras to work on it.
#   usage: bash tools/setup.sh [VENV_DIR] [EXTRAS]   (default: .venv, relative to where you run it; test)
# EXTRAS "test": what the fast test tier needs (pytest, hypothesis, the remote stack and its S3 server,
# Lightning, Accelerate); "dev": everything (the test extra, mypy, Ray, gcsfs and its emulator, the Hugging
# Face and Lhotse importers' packages, matplotlib, the docs and ruff), what the whole suite and the benchmarks
# need. SpeechBrain needs a torchaudio that loads against its torch: its tests run in an environment of its own,
#   TORCH_SPEC=torch==2.9.1 bash tools/setup.sh ENV test,speechbrain   (tests/README.md)
# The README, CI (.ci/run, with dev) and developers all use this script, so they install the same things.
set -euo pipefail

venv="${1:-.venv}"
extras="${2:-test}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"

"$python" -m venv "$venv"
# torch first, and pinned: shardio's bare "torch" requirement would otherwise let pip choose a CUDA build
# (gigabytes of nvidia-* wheels). With the pin, pip takes a CPU wheel wherever one is offered (a local
# --find-links folder, or an index set in PIP_INDEX_URL / PIP_EXTRA_INDEX_URL); TORCH_SPEC overrides it.
"$venv/bin/python" -m pip install "${TORCH_SPEC:-torch==2.13.0}"
"$venv/bin/python" -m pip install -e "$repo[$extras]"
