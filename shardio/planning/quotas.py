"""A mix's quotas: the samples each corpus draws in every epoch, from the weights and the epoch size."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import OptionError
from .mixoptions import Mix
from .occurrences import CorpusColumns, eligible_samples, merge_occurrences
from .order import MIX
from .plan import Batching, Ordering, plan_segments

__all__ = ["MAX_EPOCH_SAMPLES", "check_epoch_size", "mix_quotas"]

MAX_EPOCH_SAMPLES = 1 << 30
"""The most samples one epoch of a mix may draw (a plan holds a few arrays of that length)."""


def _rates(
    corpora: Mapping[str, CorpusColumns], mix: Mix, eligible: Mapping[str, np.ndarray]
) -> dict[str, float]:
    """Samples of each corpus per second of epoch audio."""
    means = {name: float(corpora[name].durations[eligible[name]].mean()) for name in mix.names}
    if mix.weight_by == "duration":
        return {name: w / max(means[name], 1e-9) for name, w in mix.weights.items()}
    per_sample = sum(w * means[name] for name, w in mix.weights.items())
    return {name: w / max(per_sample, 1e-9) for name, w in mix.weights.items()}


def mix_quotas(
    corpora: Mapping[str, CorpusColumns | tuple[np.ndarray, np.ndarray, int]],
    mix: Mix,
    batching: Batching = Batching(),
    *,
    seed: int = 0,
    ordering: Ordering = Ordering(),
) -> dict[str, int]:
    """Samples each corpus contributes to every epoch (the same for every epoch)."""
    columns = {name: CorpusColumns(*value) for name, value in corpora.items()}
    eligible = eligible_samples(columns, mix, batching)
    rates = _rates(columns, mix, eligible)
    size = mix.epoch_size
    if size.primary is not None:
        if not rates[size.primary] > 0:  # a weight so small that its samples per second underflow to 0
            raise OptionError(
                f"EpochSize primary {size.primary!r} has a weight ({mix.weights[size.primary]:.3g}) too "
                "small to plan one pass over it: give it a larger weight, or another epoch_size"
            )
        seconds = float(eligible[size.primary].sum()) / rates[size.primary]
    elif size.hours is not None:
        seconds = size.hours * 3600.0
    else:
        assert size.batches is not None
        per_batch = (
            batching.max_duration
            if batching.max_duration is not None
            else (batching.batch_size or 1) / sum(rates.values())
        )
        # At least `batches` batches (none holds more than this); then shrink toward a 2-5% margin by a few
        # secant steps on calibration plans of epoch 0 (partial batches make the count not proportional).
        seconds = best = size.batches * per_batch
        target, aim = 1.02 * (size.batches + 1), 1.05 * (size.batches + 1)
        for _ in range(4):
            trial = merge_occurrences(
                columns,
                mix,
                batching,
                ordering,
                eligible,
                {n: np.arange(q) for n, q in _quotas(rates, seconds).items()},
                seed=seed,
                epoch=0,
            )
            found = (
                plan_segments(
                    np.arange(trial.global_ids.shape[0]),
                    trial.durations,
                    seed=seed,
                    epoch=0,
                    world_size=1,
                    batching=batching,
                    windows=trial.slices,
                    buckets=trial.buckets,
                    shuffle=ordering.shuffle,
                    purpose=(MIX,),
                ).offsets.shape[0]
                - 1
            )
            if found >= target:
                best = min(best, seconds)
            seconds *= aim / max(found, 1)
        seconds = best
    return _quotas(rates, seconds)


def check_epoch_size(corpora: Mapping[str, CorpusColumns], mix: Mix, batching: Batching) -> None:
    """An :class:`OptionError` where ``mix``'s epoch cannot be planned over ``corpora``: a corpus without an
    eligible sample, a primary whose weight is too small for a pass, or an epoch of more than
    :data:`MAX_EPOCH_SAMPLES` samples (for ``batches``: at the planner's first estimate).
    Cheap: no plan is made."""
    columns = {name: CorpusColumns(*value) for name, value in corpora.items()}
    eligible = eligible_samples(columns, mix, batching)
    rates = _rates(columns, mix, eligible)
    size = mix.epoch_size
    if size.primary is not None:
        if not rates[size.primary] > 0:
            raise OptionError(
                f"EpochSize primary {size.primary!r} has a weight ({mix.weights[size.primary]:.3g}) too "
                "small to plan one pass over it: give it a larger weight, or another epoch_size"
            )
        _quotas(rates, float(eligible[size.primary].sum()) / rates[size.primary])
    elif size.hours is not None:
        _quotas(rates, size.hours * 3600.0)
    elif size.batches is not None:
        per_batch = (
            batching.max_duration
            if batching.max_duration is not None
            else (batching.batch_size or 1) / sum(rates.values())
        )
        _quotas(rates, size.batches * per_batch)


def _quotas(rates: Mapping[str, float], seconds: float) -> dict[str, int]:
    drawn = sum(rate * seconds for rate in rates.values())
    if not drawn <= MAX_EPOCH_SAMPLES:
        raise OptionError(
            f"the mix's epoch_size makes an epoch of about {drawn:.3g} samples, more than shardio plans "
            f"in one epoch ({MAX_EPOCH_SAMPLES}): give a smaller epoch_size"
        )
    return {name: max(1, int(round(rate * seconds))) for name, rate in rates.items()}
