"""The zip of a ``torch.save`` file, checked before ``torch.load`` reads it.

``torch.load`` extracts an entry of the zip (``data.pkl`` always, a tensor's storage where the entry cannot
be memory-mapped) into memory at the size its central directory declares. ``torch.save`` stores its entries
uncompressed, so those sizes are the file's own bytes; a deflated entry can declare gigabytes from a few
kilobytes (a zero-padded ``data.pkl``: 1 MB of file took 2.3 GB). :func:`check_torch_zip` reads the central
directory with :mod:`zipfile` (nothing is extracted) and refuses, with a :class:`~shardio.errors.StateError`,
what the file's bytes do not justify:

- more than :data:`MAX_ZIP_ENTRIES` entries;
- a stored entry declaring another size than the bytes it stores;
- an entry (or all of them together) declaring more than :data:`MAX_ZIP_RATIO` times the bytes it holds (the
  whole file's, for the sum), plus :data:`ZIP_SLACK_BYTES`: a deflated copy of real weights shrinks by a small
  factor, a zip bomb by thousands.
"""

from __future__ import annotations

import os
import zipfile

from ..errors import StateError, shown, shown_path

__all__ = ["MAX_ZIP_ENTRIES", "MAX_ZIP_RATIO", "ZIP_SLACK_BYTES", "check_torch_zip"]

MAX_ZIP_ENTRIES = 1 << 20
"""The most entries of a ``torch.save`` zip (one per tensor storage, and a few more)."""
MAX_ZIP_RATIO = 16
"""How many times its compressed bytes an entry may declare (zeroed optimizer moments compress well, weights
hardly at all)."""
ZIP_SLACK_BYTES = 1 << 16
"""Added to each bound: a small entry may compress far better than a large one."""


def check_torch_zip(path: str) -> None:
    """Refuse the zip at ``path`` when what ``torch.load`` would extract from it is beyond what its bytes
    justify (see the module docs).

    Args:
        path: a regular file in the zip format (``torch.save``'s default).

    Raises:
        StateError: not a readable zip, or beyond a bound; the message names the entry and its sizes.
    """
    size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StateError(f"{shown_path(path)}: not a zip that torch.save writes ({shown(reason)})") from None
    if len(entries) > MAX_ZIP_ENTRIES:
        raise StateError(
            f"{shown_path(path)}: a zip of {len(entries)} entries, more than the {MAX_ZIP_ENTRIES} read"
        )
    for entry in entries:
        declared, held = entry.file_size, entry.compress_size
        if entry.compress_type == zipfile.ZIP_STORED and declared != held:
            raise StateError(
                f"{shown_path(path)}: the zip entry {shown(entry.filename)} declares {declared} bytes but "
                f"stores {held}"
            )
        if declared > MAX_ZIP_RATIO * held + ZIP_SLACK_BYTES:
            raise StateError(
                f"{shown_path(path)}: the zip entry {shown(entry.filename)} declares {declared} bytes "
                f"from {held} "
                f"compressed (more than {MAX_ZIP_RATIO} times: torch.load would extract it whole); "
                "torch.save stores its entries uncompressed"
            )
    total = sum(entry.file_size for entry in entries)
    if total > MAX_ZIP_RATIO * size + ZIP_SLACK_BYTES:
        raise StateError(
            f"{shown_path(path)}: the zip's entries declare {total} bytes from a file of {size} (more than "
            f"{MAX_ZIP_RATIO} times); torch.save stores its entries uncompressed"
        )
