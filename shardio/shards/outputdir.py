"""The directory a :class:`~shardio.shards.writer.ShardWriter` writes a dataset into: made if needed, checked
writable, and claimed (no dataset in it, and no shard files but an interrupted run's, unless overwritten)."""

from __future__ import annotations

import glob
import os

from ..errors import OptionError, OutputError
from ..storage.files import open_output
from .index import INDEX_JSON

__all__ = ["claim_directory", "shard_files", "writable_directory"]

_FLAG = "--overwrite"


def writable_directory(directory: str) -> None:
    """Create ``directory`` if needed; an :class:`~shardio.errors.OutputError` when it cannot be, or when it
    is not a writable directory."""
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError:
        raise OutputError(
            f"{directory} is a file, not a directory; expected a directory to write the dataset into"
        ) from None
    except OSError as exc:
        raise OutputError(f"cannot create the output directory {directory} ({exc.strerror or exc})") from None
    if not os.path.isdir(directory):
        raise OutputError(f"{directory} is not a directory; expected a directory to write the dataset into")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputError(f"{directory} is not writable; expected a directory this user may write into")


def shard_files(directory: str, prefix: str) -> list[str]:
    """The files in ``directory`` named as shards of ``prefix`` (``{prefix}-NNNNNN.tar*``)."""
    return glob.glob(os.path.join(glob.escape(directory), f"{prefix}-[0-9]*.tar*"))


def claim_directory(directory: str, prefix: str, overwrite: bool) -> str:
    """Check ``directory`` may be written (no dataset; no shard files but an interrupted run's, unless
    ``overwrite``) and start the journal; returns the journal's path."""
    if os.path.exists(os.path.join(directory, INDEX_JSON)):
        if not overwrite:
            raise OptionError(
                f"{directory} already holds a dataset ({INDEX_JSON}); choose another "
                f"directory or pass overwrite=True ({_FLAG} on the command line)"
            )
        os.unlink(os.path.join(directory, INDEX_JSON))
    # shard-named files are replaced only when a run of this writer left them (its journal says so)
    journal = os.path.join(directory, f".{prefix}.writing")
    existing = shard_files(directory, prefix)
    if existing and not overwrite and not os.path.exists(journal):
        names = ", ".join(sorted(map(os.path.basename, existing))[:3])
        raise OptionError(
            f"{directory} holds shard files ({names}) that no interrupted shardio run left; "
            f"choose another directory or prefix, or pass overwrite=True ({_FLAG} on the "
            "command line) to replace them"
        )
    with open_output(journal):
        pass
    return journal
