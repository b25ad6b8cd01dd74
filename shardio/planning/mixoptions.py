"""A mix's options: the corpora's weights and what one epoch of the mix is (:class:`Mix`, :class:`EpochSize`).

They say *what* to draw, checked when made: each corpus's weight (normalised, corpora in name order: the order
of the global id space), whether weights are shares of audio or of samples, whether a batch may draw from
several corpora, and the epoch's size as one pass over a primary corpus, hours of audio, or global batches.
How those become quotas and an epoch's plan is :mod:`shardio.planning.mix`'s; a loader state records
:meth:`Mix.options`. Nothing here imports the planner.

**Weights as the planner uses them.** The planner computes with the normalised floats, so two mixes plan alike
only where those are equal, bit for bit: a state's weights are compared exactly. Normalising weights that are
already normalised can move them by an ulp (``{f: 0.3, a: 1}`` gives ``a = 0.7692307692307692``, whose
normalised sum is not exactly 1), so a mix rebuilt from a state's options takes them through
:func:`recorded_weights`, which keeps them as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checks.options import MAX_INT64, flag, integer, real
from ..errors import OptionError, shown

__all__ = ["WEIGHT_SUM_TOLERANCE", "EpochSize", "Mix", "recorded_weights"]

WEIGHT_SUM_TOLERANCE = 1e-9
"""How far from 1 the sum of weights a state records (normalised, then summed in floats: off by a few ulps)
may be: more is not a shardio state's."""


class _RecordedWeights(dict[str, float]):
    """Weights a loader state records, already normalised: :class:`Mix` keeps them as they are."""


def recorded_weights(weights: Mapping[str, float]) -> Mapping[str, float]:
    """``weights`` as a state's ``options["mix"]["weights"]`` records them (normalised), for a :class:`Mix`
    (or a :class:`~shardio.MixedDataset`) that must plan with exactly those floats: it checks them (positive,
    summing to 1 within :data:`WEIGHT_SUM_TOLERANCE`) instead of normalising them again.

    Args:
        weights: corpus name to weight, as a state records it.

    Returns:
        A mapping that :class:`Mix` takes as already normalised.

    Raises:
        OptionError: where ``weights`` is not a mapping of names to positive numbers summing to 1.
    """
    if not isinstance(weights, Mapping):
        raise OptionError(f"weights must map each corpus name to a positive number, not {shown(weights)}")
    return _RecordedWeights(weights)


def _positive(weight: object) -> bool:
    """Whether ``weight`` is a positive, finite number (not a bool, nor an int beyond a float)."""
    try:
        real("weight", weight, "a number")
    except OptionError:
        return False
    return bool(weight > 0)  # type: ignore[operator]


@dataclass(frozen=True)
class EpochSize:
    """What one epoch of a mix is: give exactly one of the three.

    Args:
        primary: One pass over this corpus (the others in proportion to the weights).
        hours: This many hours of audio, over all corpora.
        batches: Exactly this many global batches (all ranks together).

    Raises:
        OptionError: Not exactly one given, or a value of the wrong type or out of range.
    """

    primary: str | None = None
    hours: float | None = None
    batches: int | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("primary", "hours", "batches") if getattr(self, name) is not None]
        if len(given) != 1:
            raise OptionError(
                f"EpochSize needs exactly one of primary, hours or batches, got {given or 'none'}"
            )
        if self.primary is not None and not isinstance(self.primary, str):
            raise OptionError(f"EpochSize primary must be a corpus name, not {shown(self.primary)}")
        if self.hours is not None:
            object.__setattr__(
                self, "hours", real("EpochSize hours", self.hours, "a positive, finite number")
            )
            if not self.hours > 0:
                raise OptionError(f"EpochSize hours must be a positive number, not {self.hours}")
        if self.batches is not None:
            object.__setattr__(self, "batches", integer("EpochSize batches", self.batches, 1, MAX_INT64))


@dataclass(frozen=True)
class Mix:
    """The corpora's weights (normalised), the epoch size and how batches draw from corpora.

    Args:
        weights: Corpus names to their shares (positive, finite).
        epoch_size: What one epoch is.
        weight_by: `"duration"`: weights are shares of audio seconds; `"samples"`: shares of utterances.
        single_corpus_batches: Every batch draws from one corpus only.

    Raises:
        OptionError: A value of the wrong type or out of range, or a primary corpus not among the weights.
    """

    weights: Mapping[str, float]
    epoch_size: EpochSize
    weight_by: str = "duration"
    single_corpus_batches: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.weights, Mapping):
            raise OptionError(
                f"weights must map each corpus name to a positive number, not {shown(self.weights)}"
            )
        names = [k for k in self.weights if not (isinstance(k, str) and k)]
        if names:  # a state records the names as JSON keys: another type would never load
            raise OptionError(f"weights' corpus names must be non-empty strings, not {shown(names[0])}")
        bad = {k: v for k, v in dict(self.weights).items() if not _positive(v)}
        if not self.weights or bad:
            raise OptionError(
                f"weights must map each corpus name to a positive number, got {shown(dict(self.weights))}"
            )
        if not math.isfinite(float(sum(float(v) for v in self.weights.values()))):
            raise OptionError(f"weights must sum to a finite number, got {shown(dict(self.weights))}")
        if not isinstance(self.epoch_size, EpochSize):
            raise OptionError(f"epoch_size must be a shardio.EpochSize, not {shown(self.epoch_size)}")
        if not isinstance(self.weight_by, str) or self.weight_by not in ("duration", "samples"):
            raise OptionError(f"weight_by must be 'duration' or 'samples', not {shown(self.weight_by)}")
        object.__setattr__(
            self, "single_corpus_batches", flag("single_corpus_batches", self.single_corpus_batches)
        )
        primary = self.epoch_size.primary
        if primary is not None and primary not in self.weights:
            raise OptionError(
                f"EpochSize primary {primary!r} is not one of the corpora {sorted(self.weights)}"
            )
        total = float(sum(self.weights.values()))
        if isinstance(self.weights, _RecordedWeights):  # already normalised: normalising again moves them
            if abs(total - 1.0) > WEIGHT_SUM_TOLERANCE:
                raise OptionError(
                    f"recorded weights must be normalised (summing to 1), not "
                    f"{shown(dict(self.weights))} (sum {total!r})"
                )
            total = 1.0
        object.__setattr__(self, "weights", {k: float(self.weights[k]) / total for k in sorted(self.weights)})

    @property
    def names(self) -> list[str]:
        """Corpus names, in the order of the global id space."""
        return list(self.weights)

    def options(self) -> dict[str, Any]:
        """The mix options as a JSON-ready dict (a loader state records them)."""
        size = {k: v for k, v in vars(self.epoch_size).items() if v is not None}
        return {
            "weights": dict(self.weights),
            "epoch_size": size,
            "weight_by": self.weight_by,
            "single_corpus_batches": self.single_corpus_batches,
        }
