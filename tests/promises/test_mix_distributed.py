"""A real gloo job over a mix of three corpora of very different sizes (90, 11 and 3 samples).

Each rank is a process of its own (forked from a ``forkserver`` that imported torch once), with the
environment ``torchrun`` sets, reading a :class:`MixedDataset` through ``DataLoader(batch_size=None,
num_workers=1)`` and taking part in one all-reduce per batch, as a DDP step would: a rank with one batch more
than another would block there, and every group runs under a timeout, so a hang fails the test.

- 3 ranks, a whole epoch: every rank yields the planned batches (computed here, without any collective),
  the same number on every rank; rank 0 saves ``state_after(batch)`` after ``STOP`` batches;
- 2 ranks resume that state: the occurrences the first group consumed in its first ``STOP`` batches and
  the rest of the epoch re-planned for 2 ranks add up to the epoch exactly (each corpus pass exactly once).
"""

from __future__ import annotations

import json
import os
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import process_groups
import pytest

pytestmark = pytest.mark.slow

SIZES = {"big": [30, 25, 20, 15], "mid": [6, 5], "tiny": [3]}
RANGES = {"big": (0.1, 0.3), "mid": (0.6, 1.2), "tiny": (0.2, 0.4)}
WEIGHTS = {"big": 0.5, "mid": 0.3, "tiny": 0.2}
STOP = 2
GROUP_TIMEOUT_S = 120.0


def make(sources: dict[str, str], world: Any = None) -> Any:
    """The mixed dataset every rank (and the test) builds."""
    from shardio.datasets.mixed import MixedDataset
    from shardio.planning.mixoptions import EpochSize
    from shardio.planning.plan import Batching, Ordering

    return MixedDataset(
        sources,
        WEIGHTS,
        EpochSize(primary="big"),
        seed=5,
        ordering=Ordering(shuffle_shards=2),
        world=world,
        batching=Batching(max_duration=1.5, num_buckets=2),
    )


def rank_main(rank: int, world_size: int, port: int, config: dict[str, Any]) -> None:
    """One rank: read the mix for an epoch, one all-reduce per batch; write what it saw as JSON."""
    out = Path(config["out"])
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader

        os.environ.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
            }
        )
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
        dataset = make(config["sources"])
        if config.get("load"):
            dataset.load_state_dict(json.loads(Path(config["load"]).read_text()))
        seen = []
        for batch in DataLoader(dataset, batch_size=None, num_workers=1):
            step = torch.ones(1)
            dist.all_reduce(step)
            seen.append([list(pair) for pair in zip(batch["corpus"], batch["keys"])])
            if rank == 0 and len(seen) == STOP and config.get("save"):
                Path(config["save"]).write_text(json.dumps(dataset.state_after(batch)))
        counts = [None] * world_size
        dist.all_gather_object(counts, len(seen))
        (out / f"rank{rank}.json").write_text(json.dumps({"seen": seen, "counts": counts}))
        dist.destroy_process_group()
    except BaseException:
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        raise


def run_group(world_size: int, config: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """Run ``world_size`` ranks of :func:`rank_main`; each rank's result (see :mod:`process_groups`)."""
    return process_groups.run_group(rank_main, world_size, config, out, timeout_s=GROUP_TIMEOUT_S)


def named(dataset: Any, ids: Any) -> list[tuple[str, str]]:
    return [(dataset.index.corpus(i), dataset.index.keys[i]) for i in ids.tolist()]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from sample_shards import make_uneven_dataset

    root = tmp_path_factory.mktemp("mixdist")
    for seed, (name, sizes) in enumerate(SIZES.items()):
        make_uneven_dataset(root / name, sizes, seed=seed, duration_range=RANGES[name])
    return {name: str(root / name) for name in SIZES}


def test_a_mix_over_gloo_ranks_has_equal_batches_and_resumes_elastically(
    sources: dict[str, str], tmp_path: Path
) -> None:
    from shardio import World

    state = tmp_path / "state.json"
    full = run_group(3, {"sources": sources, "save": str(state)}, tmp_path / "full")
    expected = []
    for rank, result in enumerate(full):  # each rank's batches are the plan's, computed here independently
        dataset = make(sources, World(rank, 3))
        plan = dataset.plan()
        expected.append([named(dataset, plan.batch(rank, j)) for j in range(plan.num_batches)])
        assert [[tuple(pair) for pair in batch] for batch in result["seen"]] == expected[-1]
        assert result["counts"] == [plan.num_batches] * 3 and plan.num_batches > STOP
    epoch = Counter(named(dataset, plan.samples))
    assert {corpus for corpus, _ in epoch} == set(SIZES)
    assert all(n == 1 for (corpus, _), n in epoch.items() if corpus == "big")  # the primary: one pass
    assert (
        sum(n for (corpus, _), n in epoch.items() if corpus == "tiny") > 3 * 3
    )  # tiny repeats, pass after pass

    rest = run_group(2, {"sources": sources, "load": str(state)}, tmp_path / "elastic")
    assert rest[0]["counts"] == rest[1]["counts"] == [len(rest[0]["seen"])] * 2
    resumed = make(sources, World(0, 2))
    resumed.load_state_dict(json.loads(state.read_text()))
    left = named(resumed, resumed.plan().samples)
    yielded = {tuple(pair) for result in rest for batch in result["seen"] for pair in batch}
    assert yielded == set(left)
    consumed = [pair for batches in expected for batch in batches[:STOP] for pair in batch]
    assert Counter(consumed) + Counter(left) == epoch  # every occurrence exactly once across both groups
