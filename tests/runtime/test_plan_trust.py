"""A node's cache is often shared scratch space: plan files planted there, a FIFO in a plan's place, a plan
file truncated while ranks read it never change what any rank plays, never hang it and never kill its workers.

Each case plays two ranks (``World(r, 2)``, 2 fork DataLoader workers each) and compares their keys with a run
on a clean cache. Planted files are made from real plans: the name is learned by running the same job on
another cache directory, as anyone on the node could.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

import shardio
from shardio import ShardDataset, World

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
WORLD_SIZE = 2
FOREIGN_UID = 54321


def played(
    root: str,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    seed: int = 5,
    truncate_after_first: Path | None = None,
) -> list[list[list[str]]]:
    """Each rank's batches of epoch 0 on 2 fork DataLoader workers, with ``cache`` as the cache directory (and
    ``truncate_after_first``, if given, truncated to nothing once the rank's first batch has arrived)."""
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(cache))
    ranks = []
    for rank in range(WORLD_SIZE):
        dataset = ShardDataset(root, batch_size=3, seed=seed, world=World(rank, WORLD_SIZE))
        dataset.set_epoch(0)  # the training process reads its share; the workers inherit it
        loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
        batches = []
        for batch in loader:
            batches.append(list(batch["keys"]))
            if truncate_after_first is not None and len(batches) == 1:
                os.truncate(truncate_after_first, 0)
        ranks.append(batches)
    return ranks


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The dataset, its keys played on a clean cache, and the plan files (by name) of seed 5 and of seed 6."""
    base = tmp_path_factory.mktemp("trust")
    root = make_uneven_dataset(base / "ds", [40, 30, 50, 20], duration_range=(0.01, 0.02)).root
    found: dict[str, Any] = {"root": root}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for seed in (5, 6):
            cache = base / f"learn-{seed}"
            found[f"keys-{seed}"] = played(root, cache, monkeypatch, seed=seed)
            (name,) = os.listdir(cache / "plans")
            found[f"name-{seed}"] = name
            found[f"files-{seed}"] = {
                file: (cache / "plans" / name / file).read_bytes()
                for file in os.listdir(cache / "plans" / name)
            }
    assert found["keys-5"] != found["keys-6"]
    return found


def crafted(job: dict[str, Any], content: str, directory: Path) -> None:
    """Plant plan ``content`` as seed 5's plan in ``directory`` (its digests, where there are, left as they
    were: whoever plants files can write any, which is why another user's files are refused)."""
    files = dict(job["files-6" if content == "another seed's order" else "files-5"])
    directory.mkdir(parents=True)
    for file, data in files.items():
        (directory / file).write_bytes(data)
    ids, starts, offsets = (np.load(directory / f"{n}.npy") for n in ("ids", "starts", "offsets"))
    if content == "one utterance":
        np.save(directory / "ids.npy", np.zeros_like(ids))
    elif content == "rank 1 plays rank 0's":
        ids[starts[1] :] = np.resize(ids[: starts[1]], len(ids) - starts[1])
        np.save(directory / "ids.npy", ids)
    elif content == "empty batches":
        offsets[1, 1:-1] = 0
        np.save(directory / "offsets.npy", offsets)


@pytest.mark.parametrize(
    ("content", "trust"),
    [
        ("another seed's order", "another user's"),
        ("one utterance", "another user's"),
        ("rank 1 plays rank 0's", "another user's"),
        ("empty batches", "another user's"),
        ("one utterance", "group-writable files"),
        ("rank 1 plays rank 0's", "world-writable directory"),
        ("another seed's order", "this user's"),
        ("empty batches", "this user's"),
    ],
)  # this user's: the digests
def test_planted_plan_files_change_nothing(
    job: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    trust: str,
    content: str,
) -> None:
    plans = tmp_path / "cache" / "plans"
    planted = plans / job["name-5"]
    crafted(job, content, planted)
    if trust == "another user's":
        if os.geteuid() != 0:
            pytest.skip("files of another user are made with chown, as root")
        for path in [planted, *planted.iterdir()]:
            os.chown(path, FOREIGN_UID, FOREIGN_UID)
    elif trust == "group-writable files":
        for path in planted.iterdir():
            path.chmod(0o664)
    elif trust == "world-writable directory":
        plans.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="shardio.runtime"):
        assert played(job["root"], tmp_path / "cache", monkeypatch) == job["keys-5"]
    refusals = [record.getMessage() for record in caplog.records if "not used" in record.getMessage()]
    assert len(refusals) == 1, refusals  # one warning, naming what was refused
    assert str(plans if trust == "world-writable directory" else planted) in refusals[0]
    if trust == "world-writable directory":
        assert sorted(os.listdir(plans)) == [job["name-5"]]  # nothing written there


def fifo_run(root: str, cache: str) -> None:
    """Print both ranks' batches with ``cache`` as the cache directory (in a subprocess, under a limit)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        print(json.dumps(played(root, Path(cache), monkeypatch)))


@pytest.mark.parametrize("file", ["ids.npy", "starts.npy", "digests"])
def test_a_fifo_in_a_plan_files_place_never_blocks(job: dict[str, Any], tmp_path: Path, file: str) -> None:
    planted = tmp_path / "cache" / "plans" / job["name-5"]
    crafted(job, "as written", planted)
    (planted / file).unlink(missing_ok=True)
    os.mkfifo(planted / file)
    package = Path(shardio.__file__).resolve().parents[1]  # the shardio under test
    folders = [str(package), str(Path(__file__).parent), str(REPO / "tests")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(folders)}
    code = f"import test_plan_trust; test_plan_trust.fifo_run({job['root']!r}, {str(tmp_path / 'cache')!r})"
    try:
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a FIFO planted as a plan file blocked a rank")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == job["keys-5"]
    assert "not a regular file" in result.stderr


def test_a_plan_file_truncated_mid_epoch_kills_no_worker(
    job: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Truncated to nothing while both ranks' workers play from it: a mapped file SIGBUSed the workers."""
    ids = tmp_path / "cache" / "plans" / job["name-5"] / "ids.npy"
    assert played(job["root"], tmp_path / "cache", monkeypatch, truncate_after_first=ids) == job["keys-5"]
