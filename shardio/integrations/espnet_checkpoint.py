"""The mid-epoch checkpoint of ESPnet runs fed by shardio (:mod:`shardio.integrations.espnet`):
``shardio_checkpoint.pth`` in ESPnet's output directory.

It holds the model, optimizers, schedulers and scaler as ESPnet's own ``checkpoint.pth`` holds them, torch's
random state, the loader's state and the epoch's training statistics so far (what ESPnet's ``SubReporter``
gathered, one value a step and key, which ESPnet's epoch results and its best-epoch choice read: a resumed
epoch reports all its steps, not only those after the resume) as JSON text: tensors, numbers and strings
only, so it is read with ``torch.load(weights_only=True)`` and checked field by field; nothing of shardio is
pickled. A version 1 file (without the statistics) still loads.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import StateError, shown
from ..loader.loader import ShardLoader

__all__ = ["CHECKPOINT", "load_checkpoint", "reporter_stats", "resume_checkpoint", "save_checkpoint"]

CHECKPOINT = "shardio_checkpoint.pth"
"""The mid-epoch checkpoint's name in ESPnet's output directory."""
_VERSION = 2
_FIELDS = {"version", "epoch", "step", "model", "optimizers", "schedulers", "scaler", "rng", "loader"}
Stats = dict[str, list[list[float | None]]]
"""Per statistic, one ``[value]`` (ESPnet's ``Average``) or ``[value, weight]`` (``WeightedAverage``) a step;
NaN as None."""


def _module(model: torch.nn.Module) -> torch.nn.Module:
    wrapped = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return model.module if isinstance(model, wrapped) else model


def save_checkpoint(
    path: str,
    model: torch.nn.Module,
    optimizers: Sequence[Any],
    schedulers: Sequence[Any],
    scaler: Any,
    loader: ShardLoader,
    epoch: int,
    step: int,
    stats: Stats | None = None,
) -> None:
    """Write the mid-epoch checkpoint after ``step`` batches of shardio's epoch ``epoch`` (atomically): the
    model, optimizers, schedulers and scaler as ESPnet saves them, torch's random state, ``loader``'s state
    and the epoch's statistics (:func:`reporter_stats`)."""
    state = {
        "version": _VERSION,
        "epoch": epoch,
        "step": step,
        "model": _module(model).state_dict(),
        "optimizers": [o.state_dict() for o in optimizers],
        "schedulers": [s.state_dict() if s is not None else None for s in schedulers],
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": torch.get_rng_state(),
        "loader": json.dumps(loader.state_dict()),
        "reporter": json.dumps(stats or {}),
    }
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict[str, Any]:
    """The mid-epoch checkpoint at ``path``, loaded as data (``weights_only=True``) and checked."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a refusal naming it
        raise StateError(f"{path}: not a shardio ESPnet checkpoint ({shown(str(exc), 200)})") from None
    version = state.get("version") if isinstance(state, dict) else None
    fields = _FIELDS | ({"reporter"} if version == _VERSION else set())
    if version not in (1, _VERSION) or set(state) != fields:
        raise StateError(f"{path}: not a shardio ESPnet checkpoint of version 1 or {_VERSION}")
    state.setdefault("reporter", "{}")
    if not isinstance(state["epoch"], int) or not all(
        isinstance(state[k], str) for k in ("loader", "reporter")
    ):
        raise StateError(f"{path}: its epoch, loader state or statistics are of the wrong type")
    try:
        state["loader"], stats = json.loads(state["loader"]), json.loads(state["reporter"])
    except ValueError:
        raise StateError(f"{path}: its loader state or statistics are not JSON") from None
    steps = {len(values) for values in stats.values()} if isinstance(stats, dict) else set()
    if (
        not isinstance(stats, dict)
        or len(steps) > 1
        or not all(_stat(v) for vs in stats.values() for v in vs)
    ):
        raise StateError(
            f"{path}: its statistics are not, per name, one [value] or [value, weight] a step (as many each)"
        )
    state["reporter"] = stats
    return state


def _stat(value: object) -> bool:
    numbers = (int, float, type(None))
    return (
        isinstance(value, list)
        and len(value) in (1, 2)
        and all(isinstance(v, numbers) and not isinstance(v, bool) for v in value)
    )


def reporter_stats(reporter: Any) -> Stats:
    """The statistics ESPnet's ``SubReporter`` (``reporter``) has gathered in this epoch: its ``stats``, one
    ``Average`` or ``WeightedAverage`` a step and name."""
    found: Stats = {}
    for name, values in getattr(reporter, "stats", {}).items():
        found[str(name)] = [
            [_number(v.value), _number(v.weight)] if hasattr(v, "weight") else [_number(v.value)]
            for v in values
        ]
    return found


def _number(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def _restore_stats(reporter: Any, stats: Stats) -> None:
    """Give ESPnet's ``SubReporter`` the steps ``stats`` holds, as if it had gathered them."""
    from espnet2.train.reporter import Average, WeightedAverage

    def value(v: float | None) -> float:
        return math.nan if v is None else v

    steps = 0
    for name, values in stats.items():
        reporter.stats[name] = [
            WeightedAverage(value(v[0]), value(v[1])) if len(v) == 2 else Average(value(v[0])) for v in values
        ]
        steps = len(values)
    reporter.count += steps
    reporter.total_count += steps


def resume_checkpoint(
    path: str,
    epoch: int,
    loader: ShardLoader,
    model: torch.nn.Module,
    optimizers: Sequence[Any],
    schedulers: Sequence[Any],
    scaler: Any,
    reporter: Any = None,
) -> None:
    """Load the mid-epoch checkpoint at ``path`` into the model, optimizers, schedulers, scaler, torch's
    random state, ``loader`` and ESPnet's ``SubReporter`` (``reporter``: the epoch's statistics) when it is
    of shardio's epoch ``epoch`` (an older one is ESPnet's epoch-end checkpoint's past, and is left); one of a
    later epoch than ESPnet's is a refusal (:class:`StateError`)."""
    state = load_checkpoint(path)
    if state["epoch"] < epoch:
        return
    if state["epoch"] > epoch:
        raise StateError(
            f"{path} is of epoch {state['epoch'] + 1}, after ESPnet's checkpoint.pth (epoch {epoch}): "
            "the output directory holds another run's checkpoints"
        )
    _module(model).load_state_dict(state["model"])
    for optimizer, saved in zip(optimizers, state["optimizers"], strict=True):
        optimizer.load_state_dict(saved)
    for scheduler, saved in zip(schedulers, state["schedulers"], strict=True):
        if scheduler is not None:
            scheduler.load_state_dict(saved)
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    loader.load_state_dict(state["loader"])
    if reporter is not None:
        _restore_stats(reporter, state["reporter"])
