"""The folder walk behind :func:`shardio.packing.corpus.read_folder`: every file under a root, and what is left out.

Symlinked sub-directories are followed, each real directory once, by the first path the top-down walk
meets (in one folder, real directories before links): any other path to it (a loop back up, or a second
link to the same files) is left out and counted, as are files whose extension is not an audio format pack
takes. A directory that cannot be listed is an
:class:`~shardio.errors.InputError` naming it: a silent skip would lose its files unseen.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from ..errors import InputError, InputProblem

__all__ = ["LOOP", "SIDECARS", "walk_folder"]

SIDECARS = ("txt", "lab")
"""Extensions of transcript sidecars: ``{stem}.txt`` (or ``.lab``) next to ``{stem}.{audio ext}``."""
LOOP = "symlinked directories already walked"
"""The ``left_out`` entry counting directory links to a directory already walked (loops, duplicates)."""


def _unreadable(error: OSError) -> None:
    raise InputError([InputProblem(str(error.filename), "", "cannot list this directory "
                                   f"({error.strerror or error}); expected a readable directory")])


def walk_folder(root: Path, audio_extensions: tuple[str, ...], left_out: Counter[str]) -> list[str]:
    """The non-hidden files under ``root`` (posix paths relative to it, sorted) that are audio or sidecars.

    Every other file is counted in ``left_out`` by its extension (``.aiff``; ``(no extension)``), and each
    directory link not followed under :data:`LOOP`. Hidden files and directories (``.name``) are not inputs.
    """
    found: list[str] = []
    top = os.stat(root)
    walked: set[tuple[int, int]] = {(top.st_dev, top.st_ino)}  # real directories walked or about to be
    for directory, subdirs, files in os.walk(root, onerror=_unreadable, followlinks=True):
        kept: set[str] = set()
        visible = [name for name in subdirs if not name.startswith(".")]
        # real directories before links to them, so the link is what is left out
        for name in sorted(visible, key=lambda n: (os.path.islink(os.path.join(directory, n)), n)):
            try:
                target = os.stat(os.path.join(directory, name))
            except OSError as exc:
                _unreadable(exc)
            if (target.st_dev, target.st_ino) in walked:
                left_out[LOOP] += 1
                continue
            walked.add((target.st_dev, target.st_ino))
            kept.add(name)
        subdirs[:] = sorted(kept)
        relative = Path(directory).relative_to(root)
        for name in files:
            if name.startswith("."):
                continue
            stem, dot, ext = name.rpartition(".")
            ext = ext.lower() if dot and stem else ""
            if ext in audio_extensions or ext in SIDECARS:
                found.append((relative / name).as_posix())
            else:
                left_out["." + ext if ext else "(no extension)"] += 1
    return sorted(found)

