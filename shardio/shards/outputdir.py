"""The directory a :class:`~shardio.shards.writer.ShardWriter` writes a dataset into: made if needed, checked
writable, and claimed (no dataset in it, and no shard files but those an interrupted run's journal vouches
for, unless overwritten)."""

from __future__ import annotations

import glob
import os
import re

from ..errors import OptionError, OutputError, shown_path
from .index import INDEX_JSON
from .journal import Journal, Recorded, journal_path, matches, read_journal

__all__ = ["claim_directory", "partial_files", "shard_files", "writable_directory"]

_FLAG = "--overwrite"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def writable_directory(directory: str) -> None:
    """Create ``directory`` if needed; an :class:`~shardio.errors.OutputError` when it cannot be, or when it
    is not a writable directory; an :class:`~shardio.errors.OptionError` when it is a URL (never a local
    folder named ``s3:``)."""
    if _SCHEME.match(directory):
        raise OptionError(
            f"{shown_path(directory)} is a URL: shards are written into a local directory (pack in "
            "partitions to upload them: shardio.packing.engines.pack_partitioned)"
        )
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError:
        raise OutputError(
            f"{shown_path(directory)} is a file, not a directory; expected a directory to write the "
            "dataset into"
        ) from None
    except OSError as exc:
        raise OutputError(
            f"cannot create the output directory {shown_path(directory)} ({exc.strerror or exc})"
        ) from None
    if not os.path.isdir(directory):
        raise OutputError(
            f"{shown_path(directory)} is not a directory; expected a directory to write the dataset into"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputError(
            f"{shown_path(directory)} is not writable; expected a directory this user may write into"
        )


def shard_files(directory: str, prefix: str) -> list[str]:
    """The files in ``directory`` named as shards of ``prefix`` (``{prefix}-NNNNNN.tar*``)."""
    return glob.glob(os.path.join(glob.escape(directory), f"{prefix}-[0-9]*.tar*"))


def partial_files(directory: str, prefix: str) -> list[str]:
    """The files in ``directory`` named as unfinished shards of ``prefix`` (``.{prefix}-*.partial``)."""
    return glob.glob(os.path.join(glob.escape(directory), f".{prefix}-*.partial"))


def claim_directory(directory: str, prefix: str, suffix: str, overwrite: bool) -> Journal:
    """Check ``directory`` may be written and start this run's journal (see :mod:`shardio.shards.journal`).

    No dataset may be there, and no shard-named or partial file but those an interrupted run's journal names
    with their size and SHA-256 (removed here), unless ``overwrite`` (the dataset's index and the partial
    files are removed here; the other shard-named files when the new index is written)."""
    if os.path.exists(os.path.join(directory, INDEX_JSON)):
        if not overwrite:
            raise OptionError(
                f"{shown_path(directory)} already holds a dataset ({INDEX_JSON}); choose another "
                f"directory or pass overwrite=True ({_FLAG} on the command line)"
            )
        os.unlink(os.path.join(directory, INDEX_JSON))
    existing, partials = shard_files(directory, prefix), partial_files(directory, prefix)
    journal = journal_path(directory, prefix)
    if overwrite:
        for path in partials:
            os.unlink(path)
    elif os.path.lexists(journal):
        _replace_recorded(directory, read_journal(journal, prefix), existing, partials)
    elif existing or partials:
        names = ", ".join(shown_path(name) for name in sorted(map(os.path.basename, existing + partials))[:3])
        raise OptionError(
            f"{shown_path(directory)} holds shard files ({names}) that no interrupted shardio run left; "
            "choose another directory or prefix, or pass overwrite=True "
            f"({_FLAG} on the command line) to replace them"
        )
    return Journal(directory, prefix, suffix)


def _replace_recorded(directory: str, recorded: Recorded, existing: list[str], partials: list[str]) -> None:
    """Remove the files an interrupted run's journal vouches for, after checking every one: a shard-named file
    it does not name (or whose size or SHA-256 differs), or a partial file but its last two, is a refusal."""
    entries = {entry.name: entry for entry in recorded.entries}
    for path in sorted(existing):
        entry = entries.get(os.path.basename(path))
        if entry is None or not matches(path, entry):
            why = "that its run did not write" if entry is None else "whose size or SHA-256 differs from what"
            raise OptionError(
                f"{shown_path(directory)} holds a shard file {shown_path(os.path.basename(path))} {why} "
                "the journal of an interrupted shardio run records; nothing was replaced: choose another "
                f"directory or prefix, or pass overwrite=True ({_FLAG} on the command line) to replace them"
            )
    for path in partials:
        if (
            os.path.basename(path) not in recorded.partials
            or not os.path.isfile(path)
            or os.path.islink(path)
        ):
            raise OptionError(
                f"{shown_path(directory)} holds {shown_path(os.path.basename(path))}, which is not the "
                "partial shard the journal of an interrupted shardio run records; nothing was replaced: "
                f"choose another directory or prefix, or pass overwrite=True ({_FLAG} on the command line)"
            )
    for path in existing + partials:
        os.unlink(path)
