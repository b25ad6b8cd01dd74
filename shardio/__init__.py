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
    ShardioError,
    StateError,
)
from .index import Index, ShardInfo
from .mix import EpochSize, Mix
from .plan import Batching, EpochPlan, Ordering, Segment, plan_epoch
from .quarantine import quarantine, quarantine_report
from .reader import RetryPolicy
from .remix import remix
from .state import LoaderState
from .trace import Trace
from .world import World
from .writer import ShardWriter

if TYPE_CHECKING:
    from .dataset import ShardDataset, Transform
    from .mixed import MixedDataset

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # ShardDataset needs torch; importing it lazily keeps `shardio pack` and its workers quick to start.
    if name in ("ShardDataset", "Transform"):
        from . import dataset

        return getattr(dataset, name)
    if name == "MixedDataset":
        from .mixed import MixedDataset

        return MixedDataset
    raise AttributeError(f"module 'shardio' has no attribute {name!r}")

__all__ = [
    "__version__",
    "ShardDataset",
    "MixedDataset",
    "Mix",
    "EpochSize",
    "Transform",
    "ShardWriter",
    "Index",
    "ShardInfo",
    "World",
    "Batching",
    "Ordering",
    "Segment",
    "EpochPlan",
    "plan_epoch",
    "LoaderState",
    "Trace",
    "quarantine",
    "quarantine_report",
    "remix",
    "RetryPolicy",
    "ShardioError",
    "OptionError",
    "InputError",
    "InputProblem",
    "FormatError",
    "IntegrityError",
    "ReadError",
    "RangeNotSupported",
    "DecodeError",
    "OutputError",
    "StateError",
]
