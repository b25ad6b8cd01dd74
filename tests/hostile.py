"""Helpers to tamper with a dataset's index files as a hostile (or broken) dataset would, and to run code
in a subprocess under an address-space limit."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardio import Index
from shardio.shards.index import COLUMNS
from shardio.shards.indexfile import encode
from shardio.shards.indexheader import digest
from shardio.shards.keys import Keys

REPO = Path(__file__).resolve().parent.parent


def rewrite_header(root: Path, change: Callable[[dict[str, Any]], None], refingerprint: bool = True) -> None:
    """Apply ``change`` to ``root/index.json``'s header, in place, and fingerprint the result as shardio
    does (the digest of the header: an edit that is otherwise consistent loads); ``refingerprint=False``
    leaves the fingerprint as ``change`` left it (a forged or stale one, refused at load)."""
    path = root / "index.json"
    header = json.loads(path.read_text())
    change(header)
    if (
        refingerprint
        and isinstance(header, dict)
        and "fingerprint" in header
        and "upgraded_from" not in header
    ):
        header.pop("fingerprint")
        header["fingerprint"] = digest(header)
    path.write_text(json.dumps(header))


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An uncompressed ``.npz`` of ``arrays``, as index format 1 stored its columns."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as handle:
                np.lib.format.write_array(handle, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def to_format1(root: Path) -> None:
    """Rewrite the (format-2) index of ``root`` as format 1 wrote it: ``index.npz`` holding the columns, the
    keys blob and their ends, and a version-1 header fingerprinted as format 1 did (its header's digest)."""
    index = Index.load(root)
    payload = _npz_bytes(
        {
            **index.columns,
            "keys_blob": np.frombuffer(bytes(index.keys.blob), np.uint8),
            "keys_end": np.asarray(index.keys.ends),
        }
    )
    (root / "index.npz").write_bytes(payload)

    def change(header: dict[str, Any]) -> None:
        header.update(version=1, columns_file="index.npz", columns_sha256=hashlib.sha256(payload).hexdigest())
        header.pop("keys_bytes", None)
        header.pop("fingerprint")
        header["fingerprint"] = digest(header)  # format 1 digested its own header, as format 2 does

    rewrite_header(root, change)
    os.unlink(root / "index.columns")


def rewrite_columns(root: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Apply ``change`` to the index columns of ``root`` (a format-1 ``index.npz`` or a format-2
    ``index.columns``) and record the new file's SHA-256 in index.json."""
    if (root / "index.npz").exists():
        with np.load(io.BytesIO((root / "index.npz").read_bytes())) as archive:
            arrays = {name[:-4] if name.endswith(".npy") else name: archive[name] for name in archive.files}
        change(arrays)
        payload = _npz_bytes(arrays)
        (root / "index.npz").write_bytes(payload)
        digest = hashlib.sha256(payload).hexdigest()
    else:
        index = Index.load(root)
        arrays = {name: np.array(column) for name, column in index.columns.items()}
        change(arrays)
        payload, digest = encode(
            {name: arrays[name] for name in COLUMNS},
            COLUMNS,
            Keys(bytes(index.keys.blob), np.asarray(index.keys.ends), "columns"),
        )
        (root / "index.columns").write_bytes(payload)
    rewrite_header(root, lambda header: header.update(columns_sha256=digest))


def run_limited(
    code: str, *, headroom_mb: int, timeout: float = 120, preload: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh Python whose address space is limited, after shardio's imports (and the
    modules ``preload`` names, comma-separated), to what they use plus ``headroom_mb`` MiB (so that an
    allocation beyond that is a MemoryError or a crash)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the address-space limit is measured from /proc/self/status (Linux)")
    prelude = (
        "import resource, shardio, shardio.packing.indexer, numpy, "
        f"soundfile{', ' + preload if preload else ''}\ndef _vm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmSize:'): return int(line.split()[1]) * 1024\n"
        f"resource.setrlimit(resource.RLIMIT_AS, (_vm() + {headroom_mb} * 2**20, resource.RLIM_INFINITY))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
