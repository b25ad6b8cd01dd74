"""shardio: resumable, rank-balanced audio shard loading for PyTorch speech training.

The public API is what this module exports; everything else is private and may change.
"""

import importlib
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
from .version import __version__

if TYPE_CHECKING:
    from .datasets.dataset import ShardDataset, Transform
    from .datasets.mixed import MixedDataset
    from .ledger.quarantine import quarantine, quarantine_report
    from .ledger.remix import remix, remix_report
    from .ledger.trace import Trace
    from .loader.loader import ShardLoader
    from .planning.mixoptions import EpochSize, Mix
    from .planning.plan import Batching, EpochPlan, Ordering, Segment, plan_epoch
    from .planning.planner import Planner
    from .reading.collate import collate
    from .reading.options import Decoding, Reading
    from .shards.index import Index, ShardInfo
    from .shards.writer import ShardWriter
    from .state import LoaderState
    from .storage.retries import RetryPolicy
    from .world import World

# Each public name's module, imported on first use: `shardio pack` starts without the planner, the ledger
# or torch (ShardDataset's), which a command that does not use them would import for nothing.
_MODULES = {
    "ShardDataset": "datasets.dataset",
    "Transform": "datasets.dataset",
    "MixedDataset": "datasets.mixed",
    "quarantine": "ledger.quarantine",
    "quarantine_report": "ledger.quarantine",
    "remix": "ledger.remix",
    "remix_report": "ledger.remix",
    "Trace": "ledger.trace",
    "ShardLoader": "loader.loader",
    "EpochSize": "planning.mixoptions",
    "Mix": "planning.mixoptions",
    "Batching": "planning.plan",
    "EpochPlan": "planning.plan",
    "Ordering": "planning.plan",
    "Segment": "planning.plan",
    "plan_epoch": "planning.plan",
    "Planner": "planning.planner",
    "collate": "reading.collate",
    "Decoding": "reading.options",
    "Reading": "reading.options",
    "Index": "shards.index",
    "ShardInfo": "shards.index",
    "ShardWriter": "shards.writer",
    "LoaderState": "state",
    "RetryPolicy": "storage.retries",
    "World": "world",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'shardio' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
