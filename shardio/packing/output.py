"""Output: where partitioned packing publishes files, a local directory or an fsspec URL (``s3://...``).

Object stores have no atomic rename, so a partition publishes each finished file with one put, and its
index part's ``index.json`` last: a reader that sees that file sees the whole partition.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
from typing import Any

from ..shards.journal import JournalEntry, matches
from ..storage.files import check_output_file, filesystem, is_url, join, read_bytes, write_atomic

__all__ = ["Output", "output_root"]


def output_root(location: str) -> str:
    """Where an output ``location`` is: a ``file://`` URL as its local path (as a dataset root is read), any
    other URL as it is, a path as it is."""
    return location.removeprefix("file://")


class Output:
    """The dataset location ``root`` (local path or URL, with fsspec ``storage_options``)."""

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        self.root = output_root(root)
        self.storage_options = storage_options
        self.remote = is_url(self.root)

    def path(self, name: str) -> str:
        """The local path or URL of ``name`` (``/``-separated) under the root."""
        return join(self.root, name) if self.remote else os.path.join(self.root, *name.split("/"))

    def _fs(self) -> tuple[Any, str]:
        return filesystem(self.root, self.storage_options)

    def exists(self, name: str) -> bool:
        """Whether ``name`` exists under the root."""
        if not self.remote:
            return os.path.exists(self.path(name))
        fs, _ = self._fs()
        return bool(fs.exists(self.path(name)))

    def read(self, name: str) -> bytes:
        """The bytes of ``name`` (``FileNotFoundError`` when absent)."""
        return read_bytes(self.path(name), self.storage_options)

    def write(self, name: str, data: bytes) -> None:
        """Write ``name`` whole (atomically on a local disk; one put on an object store)."""
        if not self.remote:
            os.makedirs(os.path.dirname(self.path(name)), exist_ok=True)
            write_atomic(self.path(name), data)
            return
        fs, _ = self._fs()
        fs.pipe_file(self.path(name), data)

    def publish(self, local: str, name: str) -> None:
        """Move the finished local file ``local`` to ``name`` (a rename locally, an upload remotely)."""
        if not self.remote:
            os.makedirs(os.path.dirname(self.path(name)), exist_ok=True)
            check_output_file(self.path(name))
            os.replace(local, self.path(name))
            return
        fs, _ = self._fs()
        fs.put_file(local, self.path(name))

    def holds_other(self, name: str, size: int, sha256: str) -> bool:
        """Whether something is at ``name`` other than a regular file of ``size`` bytes and SHA-256
        ``sha256`` (a file this partition's attempts did not write: they all write the same bytes)."""
        if not self.remote:
            path = self.path(name)
            return os.path.lexists(path) and not matches(path, JournalEntry(name, size, sha256))
        fs, _ = self._fs()
        if not fs.exists(self.path(name)):
            return False
        if int(fs.info(self.path(name)).get("size", -1)) != size:
            return True
        digest = hashlib.sha256()
        with fs.open(self.path(name), "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        return digest.hexdigest() != sha256

    def shard_files(self, prefix: str) -> list[str]:
        """The names of partition shards (``{prefix}-PPPPP-NNNNNN.tar*``) under the root, sorted."""
        pattern = f"{prefix}-[0-9][0-9][0-9][0-9][0-9]-[0-9]*.tar*"
        if not self.remote:
            return sorted(
                os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(self.root), pattern))
            )
        fs, _ = self._fs()
        return sorted(p.rsplit("/", 1)[-1] for p in fs.glob(self.path(pattern)))

    def remove_tree(self, name: str) -> None:
        """Remove the folder ``name`` and everything under it, if there."""
        if not self.remote:
            shutil.rmtree(self.path(name), ignore_errors=True)
            return
        fs, _ = self._fs()
        if fs.exists(self.path(name)):
            fs.rm(self.path(name), recursive=True)
