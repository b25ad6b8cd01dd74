"""The write journal ``.{prefix}.writing``: what a :class:`~shardio.shards.writer.ShardWriter` run has written
into a directory, so that the next run may replace exactly that and nothing else.

The journal is JSON lines: a header ``{"journal": "shardio-shards", "version": 1, "prefix": ..., "suffix":
...}``, then one line ``{"name": ..., "bytes": ..., "sha256": ...}`` per finished shard, appended (and
fsynced) before the shard takes its final name. A run that dies leaves it behind; the next run into the
directory reads it as untrusted input (a regular file, at most :data:`MAX_JOURNAL_BYTES`, each line checked)
and may remove a shard-named file only where the journal names it with the file's size and SHA-256, and the
partial file of the shard the run was writing. A journal that is not one shardio wrote, or a shard-named
file it does not vouch for, is a refusal: nothing is deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass

from ..errors import OptionError, OutputError, shown_path
from ..storage.files import write_atomic
from ..storage.localshard import kind

__all__ = [
    "MAX_JOURNAL_BYTES",
    "Journal",
    "JournalEntry",
    "Recorded",
    "journal_path",
    "matches",
    "partial_name",
    "read_journal",
]

MAX_JOURNAL_BYTES = 64 << 20
"""The largest journal read (about 500,000 shards); a larger one is refused."""
_MAGIC = "shardio-shards"
_VERSION = 1
_LINE_LIMIT = 512  # a line of ours is about 130 characters
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SUFFIXES = (".tar", ".tar.zst")
_FLAG = "--overwrite"


@dataclass(frozen=True)
class JournalEntry:
    """A finished shard a run wrote: its file name, size and SHA-256."""

    name: str
    bytes: int
    sha256: str


def journal_path(directory: str, prefix: str) -> str:
    """The journal of the shards of ``prefix`` in ``directory``."""
    return os.path.join(directory, f".{prefix}.writing")


def partial_name(name: str) -> str:
    """The name a shard is written under until it is finished."""
    return f".{name}.partial"


@dataclass(frozen=True)
class Recorded:
    """A valid journal's content: the shards' prefix and suffix, and the finished shards, in order."""

    prefix: str
    suffix: str
    entries: tuple[JournalEntry, ...]

    @property
    def partials(self) -> set[str]:
        """The partial files the run may have left: the shard it was writing when it stopped, or its last
        finished one (journaled, then stopped before the rename)."""
        numbers = range(max(len(self.entries) - 1, 0), len(self.entries) + 1)
        return {partial_name(f"{self.prefix}-{n:06d}{self.suffix}") for n in numbers}


def _refused(path: str, why: str, error: type[OptionError | OutputError] = OptionError) -> Exception:
    return error(
        f"{shown_path(path)}: {why}; it is not a journal shardio wrote, so nothing in the directory is "
        f"replaced on its word: remove the shard files yourself, or pass overwrite=True ({_FLAG} on the "
        "command line) to replace them"
    )


def read_journal(path: str, prefix: str) -> Recorded:
    """The journal at ``path``, checked as untrusted input: a regular file (no link, FIFO or directory) of at
    most :data:`MAX_JOURNAL_BYTES`, a header for ``prefix``, then shards numbered from 0 with a positive size
    and a SHA-256.

    Raises:
        OutputError: A journal that is not a regular file (a link, a FIFO, a directory), or cannot be opened.
        OptionError: Any other content: the message says what, and that nothing was replaced.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _refused(path, f"cannot be opened as a file ({exc.strerror or exc})", OutputError) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _refused(path, f"it is {kind(mode)}, not a regular file", OutputError)
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_JOURNAL_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_JOURNAL_BYTES:
        raise _refused(path, f"it holds over {MAX_JOURNAL_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refused(path, "it is not UTF-8 text") from None
    if not text.endswith("\n"):
        raise _refused(path, "it is empty or its last line is cut" if text else "it is empty")
    lines = text[:-1].split("\n")
    header = _record(path, lines[0], 1)
    if header != {"journal": _MAGIC, "version": _VERSION, "prefix": prefix, "suffix": header.get("suffix")}:
        raise _refused(path, f"line 1 is not the header of a journal of {prefix!r} shards")
    suffix = header["suffix"]
    if suffix not in _SUFFIXES:
        raise _refused(path, "line 1 names no shard suffix ('.tar' or '.tar.zst')")
    entries = []
    for number, line in enumerate(lines[1:]):
        record = _record(path, line, number + 2)
        name, size, digest = record.get("name"), record.get("bytes"), record.get("sha256")
        valid = (
            set(record) == {"name", "bytes", "sha256"}
            and name == f"{prefix}-{number:06d}{suffix}"
            and type(size) is int
            and 0 < size < 1 << 63
            and isinstance(digest, str)
            and _SHA256.fullmatch(digest) is not None
        )
        if not valid:
            raise _refused(
                path,
                f"line {number + 2} is not shard {number}'s name ({prefix}-{number:06d}{suffix}), size "
                "and SHA-256",
            )
        entries.append(JournalEntry(str(name), int(str(size)), str(digest)))
    return Recorded(prefix, str(suffix), tuple(entries))


def _record(path: str, line: str, number: int) -> dict[str, object]:
    if len(line) > _LINE_LIMIT:
        raise _refused(path, f"line {number} is over {_LINE_LIMIT} characters")
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        raise _refused(path, f"line {number} is not JSON") from None
    if not isinstance(record, dict):
        raise _refused(path, f"line {number} is not a JSON object")
    return record


def matches(path: str, entry: JournalEntry) -> bool:
    """Whether the file at ``path`` is a regular file (not a link) of ``entry``'s size and SHA-256 (anything
    else is not opened: opening a device may act)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size != entry.bytes:
            return False
        digest = hashlib.sha256()
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest() == entry.sha256


class Journal:
    """This run's journal: started (replacing an earlier one) by the constructor, one line appended and
    fsynced per finished shard (:meth:`record`), removed by :meth:`remove` once the index is written."""

    def __init__(self, directory: str, prefix: str, suffix: str) -> None:
        self.path = journal_path(directory, prefix)
        header = {"journal": _MAGIC, "version": _VERSION, "prefix": prefix, "suffix": suffix}
        write_atomic(self.path, (json.dumps(header) + "\n").encode("utf-8"))
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise OutputError(
                f"{shown_path(self.path)}: cannot append to it ({exc.strerror or exc})"
            ) from None
        self._fd: int | None = fd
        self.names: list[str] = []

    def record(self, name: str, size: int, sha256: str) -> None:
        """Append a finished shard (before it takes its final name), fsynced."""
        assert self._fd is not None
        line = (json.dumps({"name": name, "bytes": size, "sha256": sha256}) + "\n").encode("utf-8")
        while line:
            line = line[os.write(self._fd, line) :]
        os.fsync(self._fd)
        self.names.append(name)

    def close(self) -> None:
        """Stop appending (the file stays; idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        """Close and remove the journal (idempotent)."""
        self.close()
        if os.path.lexists(self.path):
            os.unlink(self.path)
