"""Planner: one public, pure value that answers every planning question about a dataset.

Built from an index (its columns: shard ids and durations) and the planning options (:class:`Batching`,
:class:`Ordering`, and for a mix the :class:`~shardio.planning.mixoptions.Mix` and its corpora), it answers:
the plan of epoch ``E`` for ``W`` ranks after the elastic history ``H`` with a state's surgery ``X``
(quarantines, a re-mix: :class:`~shardio.planning.surgery.Surgery`), a rank's share of it, which corpus a
sample belongs to, and whether a saved state fits it. :class:`~shardio.ShardDataset`,
:class:`~shardio.MixedDataset`, :class:`~shardio.Trace`, :func:`~shardio.quarantine` and
:func:`~shardio.remix` each hold one and use only the methods below. No I/O (the columns are the index's,
already mapped) and no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from ..checks.options import integer
from ..checks.planargs import seed_of, segments_of, world_size_of
from ..errors import OptionError, StateError, shown
from ..shards.index import Index
from ..state import LoaderState
from .mix import CorpusColumns, corpus_offsets, mix_quotas, plan_mix, plan_occurrences
from .mixoptions import Mix
from .mixstreams import mix_args
from .options import check_options
from .plan import Batching, EpochPlan, Ordering, Segment, options_of, plan_epoch
from .rankplan import RankPlan, rank_plan
from .surgery import Surgery, check_surgery

__all__ = ["Planner"]

_NONE = Surgery()


@dataclass(frozen=True)
class Planner:
    """The plans of a dataset (see the module docs); a dataset's is its ``planner``.

    Args:
        index: The dataset's samples (a mix's combined index).
        seed: The seed of every epoch's shuffle.
        batching: How samples form batches.
        ordering: How an epoch's samples are ordered.
        mix: A mix's options (``None``: not a mix).
        corpora: A mix's corpora, in name order: ``(name, index)``.

    Raises:
        OptionError: A seed, options, index or mix that is not one; any method's bad argument, named.
    """

    index: Index
    seed: int
    batching: Batching
    ordering: Ordering
    mix: Mix | None = None
    corpora: tuple[tuple[str, Index], ...] = ()
    """A mix's corpora, in name order: ``(name, index)``."""
    _options: dict[str, object] = field(init=False, repr=False, compare=False)
    _samples: int = field(init=False, repr=False, compare=False)
    _shards: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", seed_of(self.seed))
        check_options(self.batching, self.ordering, mixed=self.mix is not None)
        if not isinstance(self.index, Index) or not isinstance(self.mix, (Mix, type(None))):
            raise OptionError(f"index, mix: an Index, a Mix or None, not {shown((self.index, self.mix))}")
        # made once, with the planner: every state saved or loaded compares the options, every plan counts
        options = options_of(self.batching, self.ordering)
        if self.mix is not None:
            corpora = {name: part.fingerprint for name, part in self.corpora}
            options = {**options, "mix": self.mix.options(), "corpora": corpora}
        object.__setattr__(self, "_options", options)
        object.__setattr__(self, "_samples", len(self.index))
        object.__setattr__(self, "_shards", len(self.index.shards))

    @property
    def batched(self) -> bool:
        """Whether samples are batched (``batch_size`` or ``max_duration``), else yielded one by one."""
        return self.batching.batch_size is not None or self.batching.max_duration is not None

    @property
    def planned_batching(self) -> Batching:
        """The batching plans are made with: a sample per batch when unbatched."""
        return self.batching if self.batched else replace(self.batching, batch_size=1)

    @property
    def options(self) -> dict[str, object]:
        """The options that shape a plan, JSON-ready (a state records them; a mix adds its options and each
        corpus's index fingerprint)."""
        return dict(self._options)

    def batch_count(
        self, world_size: int, history: Sequence[Segment] = (), surgery: Surgery = _NONE
    ) -> int | None:
        """Batches per rank in an epoch's current segment, counted without planning where the options make it
        a function of the sample count alone: a fixed batch size (or unbatched), no duration filter, no
        buckets or synchronised rounds, no history, no quarantine, not a mix. Every epoch has that many.

        Args:
            world_size: the ranks the segment is dealt to.
            history: the epoch's finished segments.
            surgery: a loaded state's quarantines and re-mix.

        Returns:
            ``plan(epoch, world_size, history, surgery).num_batches``; ``None`` where only the plan tells.

        Raises:
            OptionError: a world size or history that is not one.
        """
        world_size = world_size_of(world_size)
        history = [Segment(*segment) for segment in segments_of(history)]
        check_surgery(surgery)
        batching = self.planned_batching
        if (
            self.mix is not None
            or self.ordering.node_stable
            or history
            or surgery.quarantines
            or batching.batch_size is None
            or batching.filters
            or batching.bucketed
            or batching.synchronised
        ):
            return None
        batches = -(-self._samples // batching.batch_size)
        if batching.step_batches is not None:  # whole steps, each A batches a rank
            accumulation, k = batching.accumulation(world_size) or 1, batching.step_batches
            return accumulation * (batches // k if batching.remainder == "drop" else -(-batches // k))
        return batches // world_size if batching.remainder == "drop" else -(-batches // world_size)

    def columns(self) -> dict[str, CorpusColumns]:
        """A mix's planner columns per corpus (each corpus's own, as mapped: nothing is concatenated)."""
        return {
            name: CorpusColumns(part.shard_ids, part.durations, len(part.shards))
            for name, part in self.corpora
        }

    def plan(
        self,
        epoch: int,
        world_size: int,
        history: Sequence[Segment] = (),
        surgery: Surgery = _NONE,
        nodes: int = 1,
    ) -> EpochPlan:
        """The plan of ``epoch`` for ``world_size`` ranks after the finished segments ``history``, without the
        samples ``surgery`` quarantines (and, for a mix, with its re-mixed streams).

        Args:
            epoch: the epoch.
            world_size: the ranks the (last) segment is dealt to.
            history: the epoch's finished segments (world-size changes, quarantines).
            surgery: a loaded state's quarantines and re-mix (:attr:`~shardio.LoaderState.surgery`).
            nodes: the nodes of those ranks (1 unless ``Ordering(node_stable=True)``).

        Returns:
            Every rank's batches of the epoch's current segment.

        Raises:
            OptionError: a history segment beyond its plan.
            StateError: a re-mix that does not fit this mix.
        """
        check_surgery(surgery)
        args = self._args(epoch, world_size, history, surgery)
        if self.mix is None:
            shards = self.index.shard_ids, self.index.durations, self._shards
            return plan_epoch(*shards, **args, nodes=nodes)
        return plan_mix(self.columns(), self.mix, **args, **self._streams(epoch, surgery))

    def occurrences(
        self, epoch: int, world_size: int, history: Sequence[Segment] = (), surgery: Surgery = _NONE
    ) -> tuple[EpochPlan, Any]:
        """A mix's plan of an epoch over occurrence numbers, and the occurrences.

        Args:
            epoch: the epoch.
            world_size: the ranks the (last) segment is dealt to.
            history: the epoch's finished segments.
            surgery: a loaded state's quarantines and re-mix.

        Returns:
            The plan, and the occurrences (their global ids, corpus numbers and stream positions:
            :func:`~shardio.planning.mix.plan_occurrences`).

        Raises:
            OptionError: outside a mix.
        """
        check_surgery(surgery)
        args = self._args(epoch, world_size, history, surgery)
        plan, occurrences, _ = plan_occurrences(
            self.columns(), self._mix(), **args, **self._streams(epoch, surgery)
        )
        return plan, occurrences

    def _args(
        self, epoch: int, world_size: int, history: Sequence[Segment], surgery: Surgery
    ) -> dict[str, Any]:
        """The planning functions' common keywords."""
        exclude = surgery.exclusions(epoch) if surgery.quarantines else ()
        args = dict(seed=self.seed, epoch=epoch, world_size=world_size, batching=self.planned_batching)
        return {**args, "ordering": self.ordering, "history": history, "exclude": exclude}

    def quotas(self) -> dict[str, int]:
        """The samples each corpus of a mix contributes to an epoch."""
        return mix_quotas(
            self.columns(), self._mix(), self.planned_batching, seed=self.seed, ordering=self.ordering
        )

    @staticmethod
    def share(plan: EpochPlan, rank: int) -> RankPlan:
        """A rank's share of a plan (O(N / world)).

        Args:
            plan: An epoch's plan (:meth:`plan`).
            rank: The rank.

        Returns:
            The rank's batches.

        Raises:
            OptionError: ``plan`` is not an `EpochPlan`, or ``rank`` not one of its ranks.
        """
        if not isinstance(plan, EpochPlan):
            raise OptionError(f"plan must be an EpochPlan, not {shown(plan)}")
        return rank_plan(plan, rank)

    def corpus(self, sample_id: int) -> str | None:
        """The corpus of a mix that a sample belongs to.

        Args:
            sample_id: The sample's (global) id.

        Returns:
            The corpus's name; ``None`` outside a mix.

        Raises:
            OptionError: ``sample_id`` is not an id of the index.
        """
        sample_id = integer("sample_id", sample_id, 0, self._samples - 1)
        if not self.corpora:
            return None
        return self.corpora[int(np.searchsorted(self._offsets, sample_id, side="right")) - 1][0]

    @cached_property
    def _offsets(self) -> np.ndarray:
        return corpus_offsets([len(part) for _, part in self.corpora])

    def fields(self, sample_id: int) -> dict[str, Any]:
        """The fields a sample has before its metadata.

        Args:
            sample_id: The sample's (global) id.

        Returns:
            A mix's ``corpus``; nothing outside a mix.
        """
        corpus = self.corpus(sample_id)
        return {} if corpus is None else {"corpus": corpus}

    def differences(self, state: LoaderState) -> list[str]:
        """What differs between ``state`` and these plans.

        Args:
            state: a parsed state (:meth:`LoaderState.from_dict`).

        Returns:
            One line per difference (index fingerprint, seed, options); empty when the state was saved from
            them.
        """
        return state.differences(seed=self.seed, index=self.index.fingerprint, options=self.options)

    def check(self, state: LoaderState) -> EpochPlan:
        """The plan of a job-level ``state``'s current segment, once the state is found to fit: its seed,
        index and options are these, its quarantines name samples of this index and its position lies in the
        plan.

        Args:
            state: a job-level state (:func:`~shardio.jobstate.job_state`).

        Returns:
            The plan of the state's epoch and current segment, for its world.

        Raises:
            StateError: what does not fit.
        """
        problems = self.differences(state)
        if problems:
            raise StateError(
                "the saved loader state does not fit this dataset:\n  - " + "\n  - ".join(problems)
            )
        surgery = state.surgery
        surgery.check_ids(self._samples, lambda i: self.index.keys[i], self.corpus)
        try:
            plan = self.plan(state.epoch, state.world_size, state.history, surgery, state.nodes)
        except OptionError as exc:  # the planner refuses a history segment beyond its plan
            raise StateError(f"state field history does not fit epoch {state.epoch}'s plan: {exc}") from None
        if state.position > plan.num_batches:
            raise StateError(
                f"state field start: the state is at batch {state.position} of epoch {state.epoch}, "
                f"which has only {plan.num_batches} batches per rank"
            )
        return plan

    def _mix(self) -> Mix:
        if self.mix is None:
            raise OptionError("this dataset is not a mix")
        return self.mix

    def _streams(self, epoch: int, surgery: Surgery) -> dict[str, Any]:
        return mix_args(surgery.mix_streams, epoch, [name for name, _ in self.corpora])
