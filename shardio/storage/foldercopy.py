"""A copy of a folder of files (an Accelerate checkpoint) made whole or not at all.

:func:`staged_folder_copy` copies the regular files, folders and inward symbolic links of a folder into a new
temporary folder beside the output, lets the caller change the copy, then renames it to the output: a failure
anywhere leaves no output folder. It copies what a checkpoint holds and nothing that never ends or blocks:

- a regular file is copied to the size it had when listed (a file growing meanwhile is not chased);
- a FIFO, a device or a socket is no checkpoint data: it is left out, with a warning naming it (reading
  ``/dev/zero`` never ends, a FIFO blocks);
- a symbolic link is recreated when it points inside the folder (relative, so it points inside the copy) and
  refused when it leads outside (a copy would read, or point at, what the folder does not hold);
- at most :data:`MAX_FOLDER_ENTRIES` entries, nested at most :data:`MAX_FOLDER_DEPTH` deep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import OutputError, StateError, shown, shown_path
from .localshard import NotRegular, kind, open_regular

__all__ = ["MAX_FOLDER_DEPTH", "MAX_FOLDER_ENTRIES", "staged_folder_copy"]

logger = logging.getLogger(__name__)

MAX_FOLDER_ENTRIES = 1 << 16
"""The most entries (files, folders, links) a copied folder may hold."""
MAX_FOLDER_DEPTH = 16
"""How deep a copied folder's subfolders may nest."""
_CHUNK = 1 << 20


@dataclass
class _Listing:
    folders: list[str] = field(default_factory=list)
    files: list[tuple[str, int]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


@contextlib.contextmanager
def staged_folder_copy(source: str, out: str) -> Iterator[str]:
    """A copy of the folder ``source`` under a temporary name beside ``out``, renamed to ``out`` once the
    block ends without an exception (see the module docs); removed on an exception.

    Args:
        source: the folder to copy.
        out: the new folder's path; it must not exist.

    Returns:
        A context manager giving the temporary copy's path (write into it what the output should hold).

    Raises:
        StateError: ``source`` holds a symbolic link leading outside it, or more entries or deeper folders
            than the bounds.
        OutputError: ``out`` exists, or the copy cannot be written (nothing is left at ``out``).
    """
    if os.path.lexists(out):
        raise OutputError(f"{shown_path(out)} exists: a copy of a folder is written to a new one")
    listing = _listing(source)
    if listing.left_out:
        logger.warning(
            "%s: left out of the copy, not regular files: %s",
            source,
            ", ".join(shown(name) for name in listing.left_out[:10]),
        )
    parent = os.path.dirname(os.path.abspath(out))
    try:
        temporary = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(out)}-", dir=parent)
    except OSError as exc:
        raise OutputError(f"cannot write {shown_path(out)}: {exc.strerror or exc}") from None
    try:
        _copy(source, temporary, listing)
        shutil.copymode(source, temporary)  # mkdtemp makes it 0700
        yield temporary
        if os.path.lexists(out):
            raise OutputError(f"{shown_path(out)} exists: a copy of a folder is written to a new one")
        os.rename(temporary, out)
    except OSError as exc:
        shutil.rmtree(temporary, ignore_errors=True)
        raise OutputError(f"cannot write {shown_path(out)}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _listing(source: str) -> _Listing:
    """What to copy of ``source``, relative names in walking order (without following links)."""
    listing, root = _Listing(), os.path.realpath(source)
    count = 0
    pending: list[tuple[str, int]] = [("", 0)]
    while pending:
        folder, depth = pending.pop()
        if depth > MAX_FOLDER_DEPTH:
            raise StateError(f"{shown_path(source)}: folders nested more than {MAX_FOLDER_DEPTH} deep")
        with os.scandir(os.path.join(source, folder)) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                count += 1
                if count > MAX_FOLDER_ENTRIES:
                    raise StateError(f"{shown_path(source)}: more than {MAX_FOLDER_ENTRIES} entries to copy")
                name = os.path.join(folder, entry.name)
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    listing.links.append((name, _inward_link(source, root, name)))
                elif stat.S_ISDIR(mode):
                    listing.folders.append(name)
                    pending.append((name, depth + 1))
                elif stat.S_ISREG(mode):
                    listing.files.append((name, entry.stat(follow_symlinks=False).st_size))
                else:
                    listing.left_out.append(f"{name} ({kind(mode)})")
    return listing


def _inward_link(source: str, root: str, name: str) -> str:
    """The relative target of the link ``name`` in ``source``; a StateError when it leads outside."""
    path = os.path.join(source, name)
    target = os.path.realpath(path)
    if os.path.commonpath([root, target]) != root:
        raise StateError(
            f"{shown_path(path)}: a symbolic link to {shown(os.readlink(path))}, outside "
            f"{shown_path(source)}: a copy would not hold "
            "what it points at; replace it with the file"
        )
    return os.path.relpath(target, os.path.dirname(os.path.join(root, name)))


def _copy(source: str, temporary: str, listing: _Listing) -> None:
    for name in listing.folders:
        os.mkdir(os.path.join(temporary, name))
    for name, size in listing.files:
        _copy_file(os.path.join(source, name), os.path.join(temporary, name), size)
    for name, target in listing.links:
        os.symlink(target, os.path.join(temporary, name))


def _copy_file(path: str, copy: str, size: int) -> None:
    """``size`` bytes of the regular file at ``path`` into the new file ``copy`` (a file swapped for a FIFO or
    a device meanwhile is not read; one that shrank is an error)."""
    try:
        fd, _ = open_regular(path)
    except NotRegular as exc:
        raise StateError(f"{shown_path(path)}: it became {exc} while the folder was copied") from None
    with os.fdopen(fd, "rb") as handle, open(copy, "xb") as out:
        left = size
        while left:
            chunk = handle.read(min(left, _CHUNK))
            if not chunk:
                raise StateError(
                    f"{shown_path(path)}: it shrank below {size} bytes while the folder was copied"
                )
            out.write(chunk)
            left -= len(chunk)
    shutil.copymode(path, copy)
