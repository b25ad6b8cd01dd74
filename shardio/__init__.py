"""shardio: resumable, rank-balanced audio shard loading for PyTorch speech training.

The public API is what this module exports; everything else is private and may change.
"""

from .dataset import ShardDataset, Transform
from .errors import (
    DecodeError,
    FormatError,
    InputError,
    InputProblem,
    IntegrityError,
    OptionError,
    ReadError,
    ShardioError,
    StateError,
)
from .index import Index, ShardInfo
from .plan import Batching, EpochPlan, Ordering, Segment, plan_epoch
from .reader import RetryPolicy
from .state import LoaderState
from .world import World
from .writer import ShardWriter

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "ShardDataset",
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
    "RetryPolicy",
    "ShardioError",
    "OptionError",
    "InputError",
    "InputProblem",
    "FormatError",
    "IntegrityError",
    "ReadError",
    "DecodeError",
    "StateError",
]
