"""The folder walk behind :func:`shardio.packing.corpus.read_folder`: every file under a
root, and what is left out.

Symlinked sub-directories are followed, each real directory once, by the first path the top-down walk
meets (in one folder, real directories before links): any other path to it (a loop back up, or a second
link to the same files) is left out and counted, as are files whose extension is not an audio format pack
takes, and transcript sidecars that no sample uses (no audio file of their name, often a sign of a missing
download; a ``.lab`` beside the ``.txt`` that is used; a second one differing only in the extension's case).
A directory that cannot be listed is an :class:`~shardio.errors.InputError` naming it: a silent skip would
lose its files unseen.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError, InputProblem

__all__ = ["LOOP", "SIDECARS", "UNUSED_SIDECAR", "walk_folder"]

SIDECARS = ("txt", "lab")
"""Extensions of transcript sidecars, in order of preference: ``{stem}.txt`` (or ``.lab``, any case) next to
``{stem}.{audio ext}``."""
LOOP = "symlinked directories already walked"
"""The ``left_out`` entry counting directory links to a directory already walked (loops, duplicates)."""
UNUSED_SIDECAR = "{} no sample uses"
"""The ``left_out`` entry (formatted with ``.txt`` or ``.lab``) counting sidecars that are no sample's
transcript."""


def _unreadable(error: OSError) -> None:
    raise InputError(
        [
            InputProblem(
                str(error.filename),
                "",
                f"cannot list this directory ({error.strerror or error}); expected a readable directory",
            )
        ]
    )


def walk_folder(
    root: Path,
    audio_extensions: tuple[str, ...],
    left_out: Counter[str],
    listed: Callable[[int], object] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The non-hidden audio files under ``root`` (posix paths relative to it, sorted), and the transcript
    sidecar of each one that has one (audio path -> sidecar path).

    Every other file is counted in ``left_out`` by its extension (``.aiff``; ``(no extension)``), each
    sidecar that is no audio file's transcript under :data:`UNUSED_SIDECAR`, and each directory link not
    followed under :data:`LOOP`. Hidden files and directories (``.name``) are not inputs. ``listed`` is
    called with each directory's count of files as the walk goes (a progress counter).
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
        if listed is not None:
            listed(len(files))
        for name in files:
            if name.startswith("."):
                continue
            stem, dot, ext = name.rpartition(".")
            ext = ext.lower() if dot and stem else ""
            if ext in audio_extensions or ext in SIDECARS:
                found.append((relative / name).as_posix())
            else:
                left_out["." + ext if ext else "(no extension)"] += 1
    return _pair_sidecars(sorted(found), audio_extensions, left_out)


def _pair_sidecars(
    found: list[str], audio_extensions: tuple[str, ...], left_out: Counter[str]
) -> tuple[list[str], dict[str, str]]:
    """``found`` split into its audio files and each one's sidecar, unused sidecars
    counted in ``left_out``."""
    audio: list[str] = []
    sidecars: dict[tuple[str, str], str] = {}  # (stem, "txt" or "lab") -> path, the first in sorted order
    for name in found:
        stem, _, ext = name.rpartition(".")
        if ext.lower() in audio_extensions:
            audio.append(name)
        else:
            sidecars.setdefault((stem, ext.lower()), name)
    transcripts: dict[str, str] = {}
    for name in audio:
        stem = name.rpartition(".")[0]
        sidecar = next((sidecars[stem, ext] for ext in SIDECARS if (stem, ext) in sidecars), None)
        if sidecar is not None:
            transcripts[name] = sidecar
    used = set(transcripts.values())
    for name in found:
        ext = name.rpartition(".")[2].lower()
        if ext in SIDECARS and name not in used:
            left_out[UNUSED_SIDECAR.format("." + ext)] += 1
    return audio, transcripts
