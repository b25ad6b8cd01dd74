"""The loader state in an HF Trainer checkpoint's ``trainer_state.json``, read as untrusted data.

:class:`~shardio.integrations.transformers.ShardioTrainer` keeps the state in the checkpoint's
``trainer_state.json``, at ``stateful_callbacks.ShardioLoaderState.attributes.loader_state``. The file is read
as every state file (:func:`~shardio.storage.statefiles.load_state_file`: a regular file, bounded in size,
nesting and values, then JSON), and what the Trainer does with it next (``TrainerState(**fields)``, the
callbacks' entries) is checked first, so a tampered file is a :class:`~shardio.StateError` naming the value,
never the Trainer's ``TypeError`` or ``AttributeError`` halfway through a resume.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import StateError, shown
from ..storage.statefiles import load_state_file

__all__ = ["TRAINER_STATE", "loader_state_in"]

TRAINER_STATE = "trainer_state.json"
"""The file of an HF Trainer checkpoint that holds its ``TrainerState``."""

_CALLBACK = "ShardioLoaderState"


def loader_state_in(checkpoint: str) -> dict[str, Any]:
    """The loader state a ShardioTrainer saved in the checkpoint folder ``checkpoint``.

    Args:
        checkpoint: an HF Trainer checkpoint folder.

    Returns:
        The shardio state (checked by the dataset when it loads it).

    Raises:
        StateError: no ``trainer_state.json``, one that is not a regular file, too large or deep, not JSON,
            not a ``TrainerState`` the Trainer can load, or one without a shardio state (a plain Trainer's).
    """
    path = os.path.join(checkpoint, TRAINER_STATE)
    where = shown(path, 200)
    if not os.path.lexists(path):
        raise StateError(f"the checkpoint {shown(checkpoint, 200)} has no {TRAINER_STATE}")
    saved = load_state_file(path)
    if not isinstance(saved, dict):
        raise StateError(f"{where}: a TrainerState is a JSON object, not {shown(saved)}")
    _check_trainer_state(saved, where)
    entry = (saved.get("stateful_callbacks") or {}).get(_CALLBACK)
    if isinstance(entry, list):  # the Trainer's form for several callbacks of one class
        entry = entry[-1] if entry else None
    if entry is not None and not (isinstance(entry, dict) and isinstance(entry.get("attributes"), dict)):
        raise StateError(
            f"{where}: stateful_callbacks.{_CALLBACK} is not {{'attributes': {{'loader_state': ...}}}}: "
            f"{shown(entry)}"
        )
    state = entry["attributes"].get("loader_state") if entry is not None else None
    if state is None:
        raise StateError(
            f"the checkpoint {shown(checkpoint, 200)} holds no shardio loader state (was it saved by a plain "
            "Trainer?): resuming would restart or skip batches; resume a ShardioTrainer checkpoint"
        )
    if not isinstance(state, dict):
        raise StateError(f"{where}: the shardio loader state is not a JSON object: {shown(state)}")
    return state


def _check_trainer_state(saved: dict[str, Any], where: str) -> None:
    """Refuse what the Trainer would fail on when it loads ``saved`` (``TrainerState(**saved)``, then its
    ``global_step`` and ``stateful_callbacks``)."""
    from transformers import TrainerState

    fields = set(TrainerState.__dataclass_fields__)
    unknown = sorted(key for key in saved if key not in fields)
    if unknown:
        raise StateError(f"{where}: not a TrainerState: unknown field(s) {shown(unknown)}")
    step = saved.get("global_step", 0)
    if type(step) is not int or step < 0:
        raise StateError(f"{where}: global_step is not an integer >= 0: {shown(step)}")
    callbacks = saved.get("stateful_callbacks")
    if callbacks is not None and not isinstance(callbacks, dict):
        raise StateError(f"{where}: stateful_callbacks is not a JSON object: {shown(callbacks)}")
