"""Output: where partitioned packing publishes files, a local directory or an fsspec URL (``s3://...``).

Object stores have no atomic rename, so a partition publishes each finished file with one put, and its
index part's ``index.json`` last: a reader that sees that file sees the whole partition.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import stat
from typing import Any

from ..errors import FormatError, shown_path
from ..shards.journal import JournalEntry, matches
from ..storage.files import check_output_file, filesystem, is_url, join, read_bytes, write_atomic
from ..storage.statefiles import MAX_STATE_FILE_BYTES, parse_state_json, read_state_bytes

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

    def read(self, name: str, what: str = "file", most: int = MAX_STATE_FILE_BYTES) -> bytes:
        """The bytes of ``name``, a ``what``, read as untrusted data: locally a regular file only (a FIFO is
        never waited on), at most ``most`` bytes; else a :class:`~shardio.errors.FormatError` naming it."""
        if not self.remote:
            return read_state_bytes(self.path(name), most, what=what, error=FormatError)
        data = read_bytes(self.path(name), self.storage_options)
        if len(data) > most:
            raise FormatError(f"{shown_path(self.path(name))}: more than the {most} bytes a {what} may hold")
        return data

    def load_json(self, name: str, what: str, most: int = MAX_STATE_FILE_BYTES) -> Any:
        """The JSON document in ``name`` (see :meth:`read`), its nesting and values bounded before it is
        parsed (:func:`~shardio.storage.statefiles.parse_state_json`)."""
        data = self.read(name, what, most)
        return parse_state_json(data, self.path(name), what=what, error=FormatError)

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

    def remove_file(self, name: str) -> None:
        """Remove the file ``name`` if there; locally only a regular file (a link, a FIFO or a folder put
        under a name shardio writes is not its file, and is left in place)."""
        if not self.remote:
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(self.path(name)).st_mode):
                    os.remove(self.path(name))
            return
        fs, _ = self._fs()
        if fs.isfile(self.path(name)):
            fs.rm_file(self.path(name))

    def remove_empty_dir(self, name: str) -> None:
        """Remove the folder ``name`` if it is empty (an object store has no folders: nothing to do)."""
        if not self.remote:
            with contextlib.suppress(OSError):
                os.rmdir(self.path(name))
