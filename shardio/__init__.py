"""shardio: resumable, rank-balanced audio shard loading for PyTorch speech training.

The public API is what this module exports; everything else is private and may change.
"""

from typing import TYPE_CHECKING, Any

from .errors import (
    DecodeError,
    FormatError,
    InputError,
    InputProblem,
    IntegrityError,
    OptionError,
    OutputError,
    RangeNotSupported,
    ReadError,
    ShardChanged,
    ShardioError,
    StateError,
)
from .ledger.quarantine import quarantine, quarantine_report
from .ledger.remix import remix, remix_report
from .ledger.trace import Trace
from .planning.mixoptions import EpochSize, Mix
from .planning.plan import Batching, EpochPlan, Ordering, Segment, plan_epoch
from .planning.planner import Planner
from .reading.options import Decoding, Reading
from .shards.index import Index, ShardInfo
from .shards.writer import ShardWriter
from .state import LoaderState
from .storage.retries import RetryPolicy
from .version import __version__
from .world import World

if TYPE_CHECKING:
    from .datasets.dataset import ShardDataset, Transform
    from .datasets.mixed import MixedDataset
    from .loader.loader import ShardLoader
    from .reading.collate import collate


def __getattr__(name: str) -> Any:
    # ShardDataset needs torch; importing it lazily keeps `shardio pack` and its workers quick to start.
    if name in ("ShardDataset", "Transform"):
        from .datasets import dataset

        return getattr(dataset, name)
    if name == "collate":
        from .reading.collate import collate

        return collate
    if name == "ShardLoader":
        from .loader.loader import ShardLoader

        return ShardLoader
    if name == "MixedDataset":
        from .datasets.mixed import MixedDataset

        return MixedDataset
    raise AttributeError(f"module 'shardio' has no attribute {name!r}")


__all__ = [
    "__version__",
    "ShardDataset",
    "MixedDataset",
    "ShardLoader",
    "collate",
    "Mix",
    "EpochSize",
    "Transform",
    "ShardWriter",
    "Index",
    "ShardInfo",
    "World",
    "Batching",
    "Ordering",
    "Planner",
    "Decoding",
    "Reading",
    "Segment",
    "EpochPlan",
    "plan_epoch",
    "LoaderState",
    "Trace",
    "quarantine",
    "quarantine_report",
    "remix",
    "remix_report",
    "RetryPolicy",
    "ShardioError",
    "OptionError",
    "InputError",
    "InputProblem",
    "FormatError",
    "IntegrityError",
    "ReadError",
    "RangeNotSupported",
    "ShardChanged",
    "DecodeError",
    "OutputError",
    "StateError",
]
