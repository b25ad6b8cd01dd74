"""Helpers to tamper with a dataset's index files as a hostile (or broken) dataset would, and to run code
in a subprocess under an address-space limit."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardio.index import _npz_bytes

REPO = Path(__file__).resolve().parent.parent


def rewrite_header(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to ``root/index.json``'s header, in place (the fingerprint is left alone)."""
    path = root / "index.json"
    header = json.loads(path.read_text())
    change(header)
    path.write_text(json.dumps(header))


def rewrite_columns(root: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Apply ``change`` to the arrays of ``root/index.npz``; record the new file's SHA-256 in index.json."""
    with np.load(io.BytesIO((root / "index.npz").read_bytes())) as archive:
        arrays = {name[:-4] if name.endswith(".npy") else name: archive[name] for name in archive.files}
    change(arrays)
    payload = _npz_bytes(arrays)
    (root / "index.npz").write_bytes(payload)
    rewrite_header(root, lambda header: header.update(columns_sha256=hashlib.sha256(payload).hexdigest()))


def run_limited(code: str, *, headroom_mb: int, timeout: float = 120, preload: str = ""
                ) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh Python whose address space is limited, after shardio's imports (and the
    modules ``preload`` names, comma-separated), to what they use plus ``headroom_mb`` MiB (so that an
    allocation beyond that is a MemoryError or a crash)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the address-space limit is measured from /proc/self/status (Linux)")
    prelude = (
        f"import resource, shardio, shardio.indexer, numpy, soundfile{', ' + preload if preload else ''}\n"
        "def _vm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmSize:'): return int(line.split()[1]) * 1024\n"
        f"resource.setrlimit(resource.RLIMIT_AS, (_vm() + {headroom_mb} * 2**20, resource.RLIM_INFINITY))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
