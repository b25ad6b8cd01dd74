"""The shardio state inside the checkpoints users write, read for the ledger and
written back in the same form.

``shardio trace``, ``quarantine`` and ``remix`` take ``--state`` as any of:

- a JSON file holding a shardio state (or a dict holding one, as ``ds.state_dict()`` or a JSON checkpoint);
- a ``torch.save`` file: the README's ``{"model": ..., "loader": loader.state_dict(), ...}`` dict, a Lightning
  ``.ckpt`` (the :class:`~shardio.integrations.lightning.ShardioCallback`'s entry under ``callbacks``), or one
  holding a ``StatefulDataLoader``'s state (the dataset's states nested inside);
- an Accelerate ``save_state`` directory: the ``shardio_loader.json`` that
  :func:`~shardio.integrations.accelerate.track` writes (or the ``custom_checkpoint_N.pkl`` an older shardio
  registered, read as any ``torch.save`` file);
- an HF Trainer checkpoint directory (it holds ``trainer_state.json``): the state
  :class:`~shardio.integrations.transformers.ShardioTrainer` keeps among its ``stateful_callbacks``.

A ``torch.save`` file is loaded with ``torch.load(weights_only=True)`` (tensors and plain values only: nothing
in it is executed) and memory-mapped where it is in the zip format, so its tensors are not read; a file of the
older format is read whole, so it is refused above :data:`MAX_LEGACY_BYTES`; a zip whose entries declare
more than its bytes justify (a deflated bomb) is refused before ``torch.load``
(:mod:`shardio.ledger.torchzip`). The state is found by its ``"format": "shardio-state"`` field wherever it is
nested; :attr:`Checkpoint.where` names the key path.

:func:`write_checkpoint` writes a new state into a copy of the same container at the same key path (the rest
of the checkpoint, the model's weights included, unchanged), so the training script resumes from ``--out`` as
it did from ``--state``. A state that is several states (a ``StatefulDataLoader`` with workers saves one per
worker) cannot take one job-level state in their place: writing it is refused, write a JSON state instead.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import OutputError, StateError, shown, shown_path
from ..jobstate import job_state
from ..storage.files import write_atomic
from ..storage.foldercopy import staged_folder_copy
from ..storage.localshard import kind
from ..storage.statefiles import load_state_file
from .rebuild import read_state
from .statepaths import replaced_state, state_paths, state_where
from .torchzip import check_torch_zip

__all__ = ["MAX_LEGACY_BYTES", "Checkpoint", "read_checkpoint", "write_checkpoint"]

MAX_LEGACY_BYTES = 1 << 30
"""The largest ``torch.save`` file of the pre-zip format read (whole: it cannot be memory-mapped)."""

_FORMAT = "shardio-state"
_ZIP, _PICKLE = b"PK\x03\x04", b"\x80"
_CUSTOM = "custom_checkpoint_"  # accelerate's save_state names a registered object's file so
_TRAINER_STATE = "trainer_state.json"  # an HF Trainer checkpoint folder's


@dataclass(frozen=True)
class Checkpoint:
    """A shardio state found in a checkpoint, and where it was found."""

    path: str
    """The file the state was read from (inside the directory, for an Accelerate checkpoint)."""
    kind: str
    """``"json"``, ``"torch"`` (a ``torch.save`` file, Lightning's ``.ckpt`` included), ``"accelerate"`` or
    ``"transformers"`` (a file inside a checkpoint directory)."""
    container: Any
    """The whole loaded object (the checkpoint dict)."""
    state: dict[str, Any]
    """The job-level shardio state (JSON-ready), as ``ds.load_state_dict`` would take it."""
    where: tuple[Any, ...] | None
    """The key path of the one shardio state in :attr:`container` (``()``: the container is it); ``None``
    where the container holds several (a ``StatefulDataLoader``'s per-worker states)."""

    @property
    def global_step(self) -> int | None:
        """The trainer's global step the checkpoint records beside the state (a top-level integer
        ``global_step``, as Lightning and the README's loop save it), else ``None``."""
        value = self.container.get("global_step") if isinstance(self.container, Mapping) else None
        return value if type(value) is int and value >= 0 else None

    def describe(self) -> str:
        """Where the state is, in words (``ckpt.pt["loader"]``)."""
        if self.where is None:
            return f"{self.path} (several states, as a StatefulDataLoader with workers saves)"
        return self.path + "".join(f"[{key!r}]" for key in self.where)


def read_checkpoint(location: str) -> Checkpoint:
    """The shardio state in the checkpoint at ``location`` (see the module docs).

    Args:
        location: a JSON state, a ``torch.save`` file (Lightning ``.ckpt`` too), an Accelerate or an HF
            Trainer checkpoint directory.

    Returns:
        The state, its container and its place in it.

    Raises:
        StateError: nothing readable there, no shardio state in it, or states of several loaders.
    """
    if os.path.isdir(location):
        if os.path.lexists(os.path.join(location, _TRAINER_STATE)):
            return _read_trainer(location)
        return _read_accelerate(location)
    head = _head(location)
    if not head.startswith((_ZIP, _PICKLE)):
        state = read_state(location)
        return Checkpoint(location, "json", state, job_state(state).to_dict(), state_where(state))
    container = _torch_load(location, mmap=head.startswith(_ZIP))
    where = state_where(container)
    return Checkpoint(location, "torch", container, _state_of(container, location, where), where)


def write_checkpoint(checkpoint: Checkpoint, state: Mapping[str, Any], out: str) -> str:
    """Write ``checkpoint`` with ``state`` in place of its shardio state to ``out`` (same kind; may be the
    checkpoint's own location: replaced atomically). Returns the file written.

    Args:
        checkpoint: what :func:`read_checkpoint` found.
        state: the new job-level state (what ``quarantine`` or ``remix`` returned).
        out: a file (a directory for an Accelerate or HF Trainer checkpoint: a copy of its regular files,
            folders and inward links, written whole or not at all; see :mod:`shardio.storage.foldercopy`).

    Returns:
        The path of the file that holds the new state.

    Raises:
        StateError: the checkpoint holds several states (a ``StatefulDataLoader``'s per worker), or an
            Accelerate folder a symbolic link leading outside it.
        OutputError: ``out`` cannot be written.
    """
    if checkpoint.where is None:
        raise StateError(
            f"{checkpoint.describe()}: one job-level state cannot replace a StatefulDataLoader's "
            "per-worker states; write a JSON state (--out NAME.json) and load it with "
            "ds.load_state_dict() on the dataset before iterating"
        )
    container = replaced_state(checkpoint.container, checkpoint.where, dict(state))
    try:
        if checkpoint.kind == "json":
            write_atomic(out, json.dumps(container).encode("utf-8"))
            return out
        if checkpoint.kind == "torch":
            _torch_save(container, out)
            return out
        directory, name = os.path.split(checkpoint.path)
        if os.path.abspath(out) == os.path.abspath(directory):
            _write_state_file(container, checkpoint.path)
            return checkpoint.path
        with staged_folder_copy(directory, out) as copy:  # whole at out, or nothing there
            _write_state_file(container, os.path.join(copy, name))
        return os.path.join(out, name)
    except OSError as exc:
        raise OutputError(f"cannot write {shown_path(out)}: {exc.strerror or exc}") from None


def _head(path: str) -> bytes:
    """The first 4 bytes of ``path``; a :class:`StateError` unless it is a regular
    file (a FIFO would hang)."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise StateError(
                f"{shown_path(path)}: {kind(mode)}, not a regular file: a loader state must be a "
                "regular file or "
                "an Accelerate checkpoint directory"
            )
        with open(path, "rb") as handle:
            return handle.read(4)
    except OSError as exc:
        raise StateError(f"{shown_path(path)}: cannot read a loader state ({exc.strerror or exc})") from None


def _torch_load(path: str, *, mmap: bool) -> Any:
    import pickle

    import torch

    if not os.path.isfile(path):
        raise StateError(f"{shown_path(path)}: a checkpoint must be a regular file")
    if not mmap and os.path.getsize(path) > MAX_LEGACY_BYTES:
        raise StateError(
            f"{shown_path(path)}: a torch.save file of the pre-zip format larger than "
            f"{MAX_LEGACY_BYTES} bytes "
            "(it would be read whole): save it with torch.save's default format"
        )
    if mmap:
        check_torch_zip(path)  # what torch.load extracts, bounded by the file's bytes
    try:
        return torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, OSError, AttributeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StateError(
            f"{shown_path(path)}: cannot read it with torch.load(weights_only=True) (only tensors and plain "
            f"values are read from a checkpoint, nothing is executed): {shown(reason[:300])}"
        ) from None


def _write_state_file(container: Any, path: str) -> None:
    """A checkpoint folder's state file: JSON where its name says so, else ``torch.save``'s."""
    if path.endswith(".json"):
        write_atomic(path, json.dumps(container).encode("utf-8"))
    else:
        _torch_save(container, path)


def _torch_save(container: Any, path: str) -> None:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(container, buffer)
    write_atomic(path, buffer.getvalue())


def _read_trainer(directory: str) -> Checkpoint:
    path = os.path.join(directory, _TRAINER_STATE)
    container = load_state_file(path)
    if not any(True for _ in state_paths(container)):
        raise StateError(
            f"{shown(directory, 200)}: an HF Trainer checkpoint whose {_TRAINER_STATE} holds no shardio "
            "loader state (saved by a plain Trainer?): a ShardioTrainer keeps it among the stateful_callbacks"
        )
    where = state_where(container)
    return Checkpoint(path, "transformers", container, _state_of(container, path, where), where)


def _read_accelerate(directory: str) -> Checkpoint:
    names = sorted(
        name
        for name in os.listdir(directory)
        if name.endswith(".json") or (name.startswith(_CUSTOM) and name.endswith(".pkl"))
    )
    found, unread = [], []
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isfile(path) and not os.path.islink(path):
            if name.endswith(".json"):
                try:
                    container = load_state_file(path)
                except StateError:  # a file of the user's, maybe: named below if no state is found
                    unread.append(name)
                    continue
            else:  # an older shardio's track() registered a pickled object: read as data only
                container = _torch_load(path, mmap=_head(path).startswith(_ZIP))
            if any(True for _ in state_paths(container)):
                found.append((path, container))
    if len(found) != 1:
        what = "no" if not found else f"{len(found)} ({', '.join(os.path.basename(p) for p, _ in found)})"
        raise StateError(
            f"{shown(directory, 200)}: a checkpoint directory holding {what} shardio states (an Accelerate "
            "one keeps it in the JSON file shardio.integrations.accelerate.track writes, an HF Trainer one "
            f"in {_TRAINER_STATE}, a SpeechBrain one in its recoverable's file): give the file"
            + (f"; not JSON states: {shown(unread)}" if unread else "")
        )
    path, container = found[0]
    where = state_where(container)
    return Checkpoint(path, "accelerate", container, _state_of(container, path, where), where)


def _state_of(container: Any, path: str, where: tuple[Any, ...] | None) -> dict[str, Any]:
    if not any(True for _ in state_paths(container)):
        raise StateError(
            f'{path}: no shardio loader state in this checkpoint (a dict with "format": '
            f'"{_FORMAT}", as loader.state_dict() or ShardioCallback saves it)'
        )
    for key in where or ():
        container = container[key]
    return job_state(container).to_dict()
