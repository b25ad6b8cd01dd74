"""A torchdata ``nodes`` source over a :class:`~shardio.ShardDataset`: :class:`ShardNode`.

What torchdata 0.11's nodes do with a source's state (read in ``torchdata/nodes``): ``Loader`` saves its
root's ``state_dict()`` and hands it to ``reset(initial_state)`` at the next ``iter()``; ``ParallelMapper``,
``Prefetcher`` and ``PinMemory`` call ``next()`` on their source in a thread of their own and take the
source's ``state_dict()`` right after each item (``snapshot_frequency=1``), so the state they save is the one
after the last item they handed on: with ``in_order=True`` (their default) the items before it have all been
handed on. ``reset(None)`` comes at every ``iter()`` of the ``Loader`` (every epoch), and from a mapper each
time it starts its thread.

So the node's state is shardio's: ``state_after`` of the last batch it yielded (before any, the state its
iteration began from); ``reset(state)`` loads it into the dataset (O(1): nothing before it is read); and
``reset(None)`` plays the next epoch once the current one has begun (a batch was taken), else the current one
from its start (a pipeline's start-up resets it more than once).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from ..datasets.dataset import ShardDataset
from ..errors import OptionError, StateError
from ..state import LoaderState, check_follows
from ._extras import require

__all__ = ["ShardNode"]

require("torchdata", "torchdata.nodes")
from torchdata.nodes import BaseNode

_STATE_KEY = "shardio"


class ShardNode(BaseNode):
    """The batches of a ShardDataset as a ``torchdata.nodes`` source, resumable exactly::

        node = ShardNode(ShardDataset("data/", max_duration=200.0))
        loader = Loader(Prefetcher(ParallelMapper(node, map_fn=features, num_workers=4), prefetch_factor=4))
        loader.load_state_dict(saved)            # when resuming: the rest of the epoch, then the next ones
        for epoch in range(epochs):
            for batch in loader:
                ...; saved = loader.state_dict()

    Each ``iter()`` of the ``Loader`` plays the dataset's next epoch (the first one plays ``dataset.epoch``:
    0, or the epoch given to ``set_epoch``). The batches are read and decoded in the thread that pulls from
    the node (a mapper's reader thread); the mapper's workers run ``map_fn``. Keep the mappers' default
    ``in_order=True``: out of order, no state says which batches were handed on. To stop mid-epoch and end
    the pipeline's threads, :meth:`close` the node and drain the iterator.

    Args:
        dataset: the ShardDataset (or MixedDataset) to play, in this process (no DataLoader workers).

    Raises:
        OptionError: ``dataset`` is not a ShardDataset.
    """

    def __init__(self, dataset: ShardDataset) -> None:
        super().__init__()
        if not isinstance(dataset, ShardDataset):
            raise OptionError(f"ShardNode takes a ShardDataset, not {type(dataset).__name__}")
        self.dataset = dataset
        self._lock = threading.Lock()
        self._iterator: Iterator[dict[str, Any]] | None = None
        self._state: dict[str, Any] | None = None
        self._begun = self._finished = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start again: from ``initial_state`` (a ``get_state()``), else at the next epoch once this one has
        begun (else this one from its start).

        Raises:
            StateError: ``initial_state`` is not this node's state, or does not fit the dataset.
        """
        super().reset(initial_state)
        with self._lock:
            self._close()
            if initial_state is not None:
                state = initial_state.get(_STATE_KEY) if isinstance(initial_state, dict) else None
                if not isinstance(state, dict):
                    raise StateError(f"a ShardNode state is a dict with a {_STATE_KEY!r} loader state")
                self.dataset.load_state_dict(state)
                self._state = self.dataset.state_dict()
                # a state saved after the epoch's last batch: the next reset(None) plays the next epoch
                self._finished = LoaderState.from_dict(self._state).position >= len(self.dataset)
            else:
                epoch = self.dataset.epoch
                if self._state is not None:
                    epoch = int(self._state["epoch"]) + (self._begun or self._finished)
                self.dataset.set_epoch(epoch)
                self._state, self._finished = self.dataset.state_dict(), False
            self._begun = False
            self._iterator = iter(self.dataset)

    def next(self) -> dict[str, Any]:
        with self._lock:
            if self._iterator is None:
                raise StopIteration
            batch = next(self._iterator)
            state = self.dataset.state_after(batch)
            check_follows(self._state, state)
            self._state, self._begun = state, True
            return batch

    def get_state(self) -> dict[str, Any]:
        with self._lock:
            return {_STATE_KEY: self._state}

    def close(self) -> None:
        """End the epoch here: the node yields no batch until the next ``reset`` (the ``Loader``'s next
        ``iter()``), and its state stays the one after its last batch.

        A pipeline left mid-epoch keeps its threads (a ``ParallelMapper``'s reader, sorter and workers, a
        ``Prefetcher``'s) until the garbage collector reaches it. To end them, close the node and drain the
        iterator you were looping over (``for _ in iterator: pass``): the mappers hand on the few batches they
        hold and their threads end. Take ``loader.state_dict()`` before, as the drain moves it on.
        """
        with self._lock:
            self._close()
            self._iterator = None

    def _close(self) -> None:
        if self._iterator is not None:
            close = getattr(self._iterator, "close", None)
            if close is not None:
                close()
