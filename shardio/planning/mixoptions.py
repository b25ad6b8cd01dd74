"""A mix's options: the corpora's weights and what one epoch of the mix is (:class:`Mix`, :class:`EpochSize`).

They say *what* to draw, checked when made: each corpus's weight (normalised, corpora in name order: the order
of the global id space), whether weights are shares of audio or of samples, whether a batch may draw from
several corpora, and the epoch's size as one pass over a primary corpus, hours of audio, or global batches.
How those become quotas and an epoch's plan is :mod:`shardio.planning.mix`'s; a loader state records
:meth:`Mix.options`. Nothing here imports the planner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError

__all__ = ["EpochSize", "Mix"]


@dataclass(frozen=True)
class EpochSize:
    """What one epoch of a mix is: give exactly one of the three."""

    primary: str | None = None
    """One pass over this corpus (the others in proportion to the weights)."""
    hours: float | None = None
    """This many hours of audio, over all corpora."""
    batches: int | None = None
    """Exactly this many global batches (all ranks together)."""

    def __post_init__(self) -> None:
        given = [name for name in ("primary", "hours", "batches") if getattr(self, name) is not None]
        if len(given) != 1:
            raise OptionError(f"EpochSize needs exactly one of primary, hours or batches, got {given or 'none'}")
        if self.hours is not None and not (self.hours > 0 and math.isfinite(self.hours)):
            raise OptionError(f"EpochSize hours must be a positive number, not {self.hours}")
        if self.batches is not None and (not isinstance(self.batches, int) or self.batches < 1):
            raise OptionError(f"EpochSize batches must be a positive integer, not {self.batches!r}")


@dataclass(frozen=True)
class Mix:
    """The corpora's weights (normalised), the epoch size and how batches draw from corpora."""

    weights: Mapping[str, float]
    epoch_size: EpochSize
    weight_by: str = "duration"
    """``duration``: weights are shares of audio seconds; ``samples``: shares of utterances."""
    single_corpus_batches: bool = False
    """Every batch draws from one corpus only."""

    def __post_init__(self) -> None:
        bad = {k: v for k, v in dict(self.weights).items() if not (isinstance(v, (int, float)) and v > 0
                                                                  and math.isfinite(v))}
        if not self.weights or bad:
            raise OptionError(f"weights must map each corpus name to a positive number, got {dict(self.weights)}")
        if self.weight_by not in ("duration", "samples"):
            raise OptionError(f"weight_by must be 'duration' or 'samples', not {self.weight_by!r}")
        primary = self.epoch_size.primary
        if primary is not None and primary not in self.weights:
            raise OptionError(f"EpochSize primary {primary!r} is not one of the corpora {sorted(self.weights)}")
        total = float(sum(self.weights.values()))
        object.__setattr__(self, "weights", {k: float(self.weights[k]) / total for k in sorted(self.weights)})

    @property
    def names(self) -> list[str]:
        """Corpus names, in the order of the global id space."""
        return list(self.weights)

    def options(self) -> dict[str, Any]:
        """The mix options as a JSON-ready dict (a loader state records them)."""
        size = {k: v for k, v in vars(self.epoch_size).items() if v is not None}
        return {"weights": dict(self.weights), "epoch_size": size, "weight_by": self.weight_by,
                "single_corpus_batches": self.single_corpus_batches}
