"""The demo: shardio's main job on a built-in default corpus, end to end, with no data to download.

:func:`run_demo` makes a synthetic speech corpus (:mod:`shardio.synth`), packs it into zstd shards with
an index (:func:`shardio.packing.pack.pack`), reads one epoch back through :class:`~shardio.ShardDataset` and
a :class:`~shardio.ShardLoader`, interrupting it halfway and resuming from the saved state, and returns (and
logs) what it did and how fast.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..errors import OptionError, StateError
from ..packing.pack import pack
from ..shards.index import INDEX_COLUMNS, INDEX_COLUMNS_V1, INDEX_JSON
from ..synth import make_corpus

__all__ = ["run_demo", "CORPUS_DIR", "DATASET_DIR", "MAX_FILES"]

logger = logging.getLogger(__name__)

CORPUS_DIR = "corpus"
"""The demo's synthetic audio folder, under its output directory."""
DATASET_DIR = "dataset"
"""The demo's packed dataset (shards and index), under its output directory."""
_PREFIX = "shard"
MAX_FILES = 100_000
"""The most utterances a demo makes (about 80 hours of audio, 10 GB)."""
MAX_WORKERS = 32
"""The most loader and pack workers a demo starts: its corpus is small."""
_SAMPLES_PER_SHARD = 50
_MAX_DURATION = 30.0


def run_demo(out_dir: str | Path, *, num_files: int = 200, workers: int = 0) -> dict[str, Any]:
    """Make a synthetic corpus of ``num_files`` utterances, pack it, read it back; return a summary.

    Writes ``out_dir/corpus`` (audio with ``.txt`` transcripts, one folder per speaker) and
    ``out_dir/dataset`` (``shard-NNNNNN.tar.zst`` and the index); running it again rewrites both.
    ``workers`` above 1 packs in that many processes. The summary holds ``files``, ``hours``, ``shards``,
    ``bytes``, ``pack_seconds``, ``read_back_samples``, ``read_back_batches``, ``resumed_at_batch``,
    ``read_back_seconds`` and the two directories.
    """
    if not 1 <= num_files <= MAX_FILES:
        raise OptionError(f"num_files must be from 1 to {MAX_FILES} (a demo corpus), not {num_files}")
    if not 0 <= workers <= MAX_WORKERS:
        raise OptionError(
            f"workers must be from 0 to {MAX_WORKERS} (a demo's corpus is small), not {workers}"
        )
    root = Path(out_dir)
    corpus, dataset = root / CORPUS_DIR, root / DATASET_DIR
    started = time.perf_counter()
    _clear(corpus, ["spk[0-9]*/spk[0-9]*_[0-9]*.wav", "spk[0-9]*/spk[0-9]*_[0-9]*.txt"])
    files = make_corpus(corpus, num_files=num_files)
    synth_seconds = time.perf_counter() - started
    _clear(
        dataset, [INDEX_JSON, INDEX_COLUMNS, INDEX_COLUMNS_V1, f"{_PREFIX}-[0-9]*.tar*"]
    )  # the index goes first
    packed = pack(
        corpus,
        dataset,
        compression="zstd",
        samples_per_shard=_SAMPLES_PER_SHARD,
        workers=max(1, workers),
        prefix=_PREFIX,
        progress=False,
    )
    started = time.perf_counter()
    read = _read_back(dataset, workers)
    read_seconds = time.perf_counter() - started
    samples = read["samples"]
    summary: dict[str, Any] = {
        "files": len(files),
        "hours": packed.hours,
        "shards": packed.shards,
        "bytes": packed.bytes,
        "synth_seconds": synth_seconds,
        "pack_seconds": packed.seconds,
        "read_back_samples": samples,
        "read_back_batches": read["batches"],
        "resumed_at_batch": read["resumed_at_batch"],
        "read_back_seconds": read_seconds,  # two passes over the epoch, worker start-up included
        "corpus_dir": str(corpus),
        "dataset_dir": str(dataset),
    }
    logger.info(
        "demo: %d files (%.3f h) -> %d shards, %.1f MB, packed in %.2f s; read back %d samples in %d "
        "batches, interrupted at batch %d and resumed exactly, in %.1f s; dataset in %s",
        summary["files"],
        summary["hours"],
        summary["shards"],
        summary["bytes"] / 1e6,
        summary["pack_seconds"],
        samples,
        read["batches"],
        read["resumed_at_batch"],
        read_seconds,
        dataset,
    )
    return summary


def _clear(directory: Path, patterns: list[str]) -> None:
    """Remove what an earlier demo run wrote in ``directory`` (files matching ``patterns``), nothing else."""
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.join(glob.escape(str(directory)), pattern))):
            os.unlink(path)


def _read_back(dataset_dir: Path, workers: int) -> dict[str, Any]:
    """Train-style read of one epoch through :class:`ShardDataset` and a
    :class:`ShardLoader`, interrupted halfway.

    The first half of the epoch is read, the loader's state saved, and a fresh dataset and loader resume from
    it; the keys of the two halves must equal an uninterrupted epoch's, or :class:`StateError` is raised.
    """
    from ..datasets.dataset import ShardDataset
    from ..loader.loader import ShardLoader

    def loader() -> ShardLoader:
        return ShardLoader(ShardDataset(dataset_dir, max_duration=_MAX_DURATION, seed=0), num_workers=workers)

    with loader() as whole:
        straight = [list(batch["keys"]) for batch in whole]
    half = len(straight) // 2
    seen: list[list[str]] = []
    with loader() as first:
        state: dict[str, Any] = first.state_dict()
        for batch, _ in zip(first, range(half)):
            seen.append(list(batch["keys"]))
            state = first.state_dict()
    with loader() as resumed:
        resumed.load_state_dict(state)
        seen += [list(batch["keys"]) for batch in resumed]
    if seen != straight:
        raise StateError("the demo's resumed epoch differs from the uninterrupted one")
    samples = sum(len(keys) for keys in straight)
    return {
        "samples": samples,
        "batches": len(straight),
        "resumed_at_batch": half,
        "distinct_samples": len({key for keys in straight for key in keys}),
    }
