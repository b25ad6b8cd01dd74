"""Exact resume under HF Accelerate: ``accelerate launch`` with 2 CPU processes (gloo), killed with SIGKILL.

``tests/accelerate_job.py`` trains two epochs with ``accelerator.save_state`` every 3 steps and at each epoch
end; every rank kills itself at a given step; the run resumed with ``accelerator.load_state`` from the last
checkpoint trains, per rank, on exactly the batches of the uninterrupted run (the dataset's plan) after it.
``accelerate launch --cpu`` with several processes runs one process (its multi-CPU path expects MPI), so the
launch is ``--multi_gpu`` (torch.distributed.run underneath) and the script asks for
``Accelerator(cpu=True)``.
The rest of the matrix is marked ``matrix``, left out by default
(``pytest -m matrix tests/integrations/test_accelerate.py``).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")

from job_runs import run_in_session
from process_groups import free_port
from sample_shards import make_uneven_dataset, planned_keys

from shardio import Ordering

JOB = Path(__file__).parents[1] / "accelerate_job.py"
EPOCHS = 2
BATCH = 3
SHARD_SIZES = (7, 5, 9, 4)  # 25 samples: 9 batches of 3, 5 per rank on 2 ranks (the last round padded)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("accelerate") / "data"
    make_uneven_dataset(root, SHARD_SIZES, seed=1)
    return root


def planned(data: Path, world_size: int) -> list[list[list[str]]]:
    """Per rank, the keys of every batch of the uninterrupted run (both epochs, in step order)."""
    return planned_keys(
        data, world_size, EPOCHS, batch_size=BATCH, seed=5, ordering=Ordering(shuffle_shards=2)
    )


def run_job(
    data: Path, out: Path, *, processes: int = 2, expect_kill: bool = False, **options: Any
) -> list[list[dict[str, Any]]]:
    """Run the job under ``accelerate launch`` to its end (or its SIGKILL); every rank's trained batches."""
    out.mkdir(parents=True)
    config = {
        "data": str(data),
        "batch_size": BATCH,
        "workers": 0,
        "persistent": False,
        "max_epochs": EPOCHS,
        "every_n_steps": 3,
        "out": str(out),
        "ckpt_dir": str(out / "ckpt"),
        **options,
    }
    (out / "config.json").write_text(json.dumps(config))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path]),
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu" if processes > 1 else "--cpu",  # --multi_gpu refuses one process
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        str(JOB),
        str(out / "config.json"),
    ]
    output, returncode = run_in_session(command, env=env, cwd=out, limit=280)  # under pytest-timeout's 300 s
    assert (returncode != 0) == expect_kill, output[-4000:]
    if expect_kill:
        assert "SIGKILL" in output or options.get("prepare"), output[-4000:]
    (out / "output.txt").write_text(output)
    return [
        [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
        for rank in range(processes)
    ]


def last_checkpoint(out: Path) -> tuple[Path, int]:
    return max(
        ((path, int(path.name.split("-")[1])) for path in (out / "ckpt").glob("step-*")),
        key=lambda found: found[1],
    )


def keys(records: list[dict[str, Any]]) -> list[list[str]]:
    return [record["keys"] for record in records]


def check_resume(data: Path, tmp_path: Path, *, kill_at: int, **options: Any) -> int:
    plan = planned(data, 2)
    killed = run_job(data, tmp_path / "killed", kill_at_step=kill_at, expect_kill=True, **options)
    assert [keys(records) for records in killed] == [batches[:kill_at] for batches in plan]
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    resumed = run_job(data, tmp_path / "resumed", resume_from=str(checkpoint), **options)
    assert [keys(records) for records in resumed] == [batches[step:] for batches in plan]
    return step


def test_resume_mid_epoch_two_processes(data: Path, tmp_path: Path) -> None:
    # 5 steps an epoch on 2 ranks; checkpoints at steps 3, 5 (epoch end), 6, 9, 10: killed at 8, resumed at 6.
    assert check_resume(data, tmp_path, kill_at=8, workers=2) == 6


@pytest.mark.slow
def test_resume_mid_epoch_two_processes_with_the_shard_loader(data: Path, tmp_path: Path) -> None:
    assert check_resume(data, tmp_path, kill_at=8, workers=2, loader="shardio") == 6


@pytest.mark.matrix
@pytest.mark.parametrize("loader", ["plain", "shardio"])
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("kill_at", [4, 5, 8])  # resumed at step 3, the epoch end (5), 6
def test_resume_matrix(
    data: Path, tmp_path: Path, loader: str, workers: int, persistent: bool, kill_at: int
) -> None:
    check_resume(data, tmp_path, kill_at=kill_at, workers=workers, persistent=persistent, loader=loader)


@pytest.mark.matrix
def test_resume_on_three_processes(data: Path, tmp_path: Path) -> None:
    """A 2-process checkpoint resumed on 3: every sample not yet trained on in the epoch, once."""
    plan = planned(data, 2)
    run_job(data, tmp_path / "killed", kill_at_step=4, expect_kill=True)
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert step == 3
    resumed = run_job(data, tmp_path / "resumed", processes=3, resume_from=str(checkpoint))
    consumed = {key for batches in plan for batch in batches[:step] for key in batch}
    rest = Counter(
        key for records in resumed for record in records if record["epoch"] == 0 for key in record["keys"]
    )
    everything = {f"s{s:03d}_{i:05d}" for s, size in enumerate(SHARD_SIZES) for i in range(size)}
    assert set(rest) == everything - consumed
    assert sum(rest.values()) - len(rest) < 3 * BATCH
    assert [keys([r for r in records if r["epoch"] == 1]) for records in resumed] == [
        batches[len(batches) // EPOCHS :] for batches in planned(data, 3)
    ]


@pytest.mark.matrix
def test_a_prepared_loader_fails(data: Path, tmp_path: Path) -> None:
    """``prepare()`` dispatches an IterableDataset's batches from rank 0, concatenating them: shardio batches
    (keys, metadata lists) cannot be, and rank 0 would be the only rank planning anyway."""
    run_job(data, tmp_path / "run", prepare=True, expect_kill=True)
    assert "Can only concatenate tensors" in (tmp_path / "run" / "output.txt").read_text()


@pytest.mark.slow
def test_a_loader_prepared_without_dispatch_is_refused(data: Path, tmp_path: Path) -> None:
    """With ``dispatch_batches=False``, ``prepare()`` wraps the dataset in ``IterableDatasetShard``, which
    splits each rank's stream again: an unbatched dataset batched by ``shardio.collate`` trained, per epoch,
    on 14 of the 25 samples (4 of them twice) before the dataset refused the wrapper. It
    fails, naming the fix."""
    run_job(data, tmp_path / "run", prepare=True, dispatch_batches=False, collate=True, expect_kill=True)
    output = (tmp_path / "run" / "output.txt").read_text()
    assert "IterableDatasetShard iterates this ShardDataset" in output and "not the loader" in output


@pytest.mark.matrix
def test_a_batched_loader_prepared_without_dispatch_fails(data: Path, tmp_path: Path) -> None:
    """``DataLoader(batch_size=None)`` has no batch size for ``IterableDatasetShard``: ``prepare()`` fails."""
    run_job(data, tmp_path / "run", prepare=True, dispatch_batches=False, expect_kill=True)
    assert "TypeError" in (tmp_path / "run" / "output.txt").read_text()


def optimizer_steps(ranks: list[list[dict[str, Any]]]) -> list[list[str]]:
    """Each optimizer step's keys over every rank: a rank's batches up to its next ``sync``."""
    per_rank = []
    for records in ranks:
        steps, current = [], []
        for record in records:
            current += record["keys"]
            if record["sync"]:
                steps.append(current)
                current = []
        assert not current, "batches after the last optimizer step"
        per_rank.append(steps)
    assert len({len(steps) for steps in per_rank}) == 1, "ranks of unequal optimizer step counts"
    return [sorted(key for steps in per_rank for key in steps[s]) for s in range(len(per_rank[0]))]


@pytest.mark.slow
@pytest.mark.parametrize("new", [1, 4])
def test_accumulated_steps_killed_and_resumed_on_another_world(data: Path, tmp_path: Path, new: int) -> None:
    """``step_batches=4``: 2 processes x ``gradient_accumulation_steps=2`` killed with SIGKILL at optimizer
    step 4, resumed from step 3's checkpoint on ``new`` processes x ``4 / new``, train the straight run's
    optimizer steps from step 3 on (Accelerate's own micro-batch count resumes at the step's boundary)."""
    options = {"step_batches": 4, "batch_size": 1, "every_n_steps": 3}
    straight = optimizer_steps(run_job(data, tmp_path / "straight", **options))
    killed = run_job(data, tmp_path / "killed", kill_at_step=4, expect_kill=True, **options)
    assert optimizer_steps(killed) == straight[:4]
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert step == 3
    resumed = run_job(data, tmp_path / "resumed", processes=new, resume_from=str(checkpoint), **options)
    assert optimizer_steps(resumed) == straight[step:]
