"""Exact resume under HF Transformers' Trainer: real Trainer processes (torchrun over gloo on CPU), SIGKILLed.

Each case trains ``tests/transformers_job.py`` (checkpoints every 3 steps), kills every rank at a given step,
resumes from the last checkpoint in a new process and checks, per rank, that the batches trained on after the
checkpoint are exactly those of the uninterrupted run (the dataset's plan, which the killed run's batches must
also follow up to its death), and that the resumed process read only the batches it trained on. The plain
Trainer (no shardio integration) is measured too: it reads and throws away every batch before the checkpoint.
The matrix is marked ``matrix`` (``pytest -m matrix tests/integrations/test_transformers.py``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from job_runs import run_in_session
from process_groups import free_port
from sample_shards import make_uneven_dataset, planned_keys

from shardio import Ordering

JOB = Path(__file__).parents[1] / "transformers_job.py"
BATCH = 3
SHARD_SIZES = (7, 5, 9, 4)  # 25 samples: 9 batches of 3 (the last padded) on 1 rank, 5 on 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("transformers") / "data"
    make_uneven_dataset(root, SHARD_SIZES, seed=1)
    return root


def planned(data: Path, world_size: int, epochs: int = 2, **sizes: Any) -> list[list[list[str]]]:
    """Per rank, the keys of every batch of the uninterrupted run (every epoch, in step order)."""
    return planned_keys(
        data,
        world_size,
        epochs,
        seed=5,
        ordering=Ordering(shuffle_shards=2),
        **(sizes or {"batch_size": BATCH}),
    )


def run_job(
    data: Path, out: Path, *, processes: int = 1, expect_kill: bool = False, **options: Any
) -> list[list[dict[str, Any]]]:
    """Run the job (under torchrun for several processes) to its end or its SIGKILL; every rank's records."""
    out.mkdir(parents=True)
    config = {"data": str(data), "batch_size": BATCH, "out": str(out), **options}
    (out / "config.json").write_text(json.dumps(config))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path]),
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    launch = (
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(processes),
            "--master_port",
            str(free_port()),
        ]
        if processes > 1
        else [sys.executable]
    )
    output, returncode = run_in_session(
        [*launch, str(JOB), str(out / "config.json")], env=env, cwd=out, limit=280
    )  # under pytest-timeout's 300 s, to say what hung
    (out / "output.txt").write_text(output)
    assert (returncode != 0) == expect_kill, output[-4000:]
    if expect_kill and processes == 1:
        assert returncode == -signal.SIGKILL, output[-4000:]
    return [
        [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
        for rank in range(processes)
    ]


def last_checkpoint(out: Path) -> tuple[Path, int]:
    return max(
        ((path, int(path.name.split("-")[1])) for path in (out / "ckpt").glob("checkpoint-*")),
        key=lambda found: found[1],
    )


def keys(records: list[dict[str, Any]]) -> list[list[str]]:
    return [record["keys"] for record in records]


def check_resume(
    data: Path,
    tmp_path: Path,
    *,
    kill_at: int,
    processes: int = 1,
    epochs: int = 2,
    sizes: dict[str, Any] | None = None,
    **options: Any,
) -> int:
    """Kill a run at step ``kill_at``, resume it from its last checkpoint, compare with the plan; the step."""
    plan = planned(data, processes, epochs, **(sizes or {}))
    options.update(epochs=epochs, **(sizes or {}))
    killed = run_job(
        data, tmp_path / "killed", processes=processes, kill_at_step=kill_at, expect_kill=True, **options
    )
    assert [keys(records) for records in killed] == [batches[:kill_at] for batches in plan]
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert 0 < step <= kill_at
    resumed = run_job(data, tmp_path / "resumed", processes=processes, resume_from=str(checkpoint), **options)
    assert [keys(records) for records in resumed] == [batches[step:] for batches in plan]
    assert [records[0]["step"] for records in resumed] == [step] * processes
    if not options.get("workers"):  # the resumed process read the batches it trained on, none before them
        assert all(records[0]["read"] == len(records[0]["keys"]) for records in resumed)
    return step


def test_resume_mid_epoch_one_process(data: Path, tmp_path: Path) -> None:
    # 9 steps an epoch; killed at step 13, resumed at 12 (mid-epoch 1, after an epoch boundary)
    assert check_resume(data, tmp_path, kill_at=13) == 12


@pytest.mark.matrix
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("processes,kill_at,step", [(1, 7, 6), (1, 10, 9), (1, 13, 12), (2, 4, 3), (2, 8, 6)])
def test_resume_matrix(
    data: Path, tmp_path: Path, workers: int, persistent: bool, processes: int, kill_at: int, step: int
) -> None:
    # 1 process: 9 steps an epoch (9: the epoch's end); 2 processes: 5 (8 -> 6: after the epoch boundary)
    assert (
        check_resume(
            data, tmp_path, kill_at=kill_at, processes=processes, workers=workers, persistent=persistent
        )
        == step
    )


@pytest.mark.matrix
@pytest.mark.parametrize("processes,kill_at,step", [(1, 7, 6), (2, 8, 6)])
def test_resume_seq2seq(data: Path, tmp_path: Path, processes: int, kill_at: int, step: int) -> None:
    """ShardioSeq2SeqTrainer (the same overrides over Seq2SeqTrainer, with Seq2SeqTrainingArguments)."""
    assert (
        check_resume(data, tmp_path, kill_at=kill_at, processes=processes, trainer="seq2seq", workers=2)
        == step
    )


@pytest.mark.matrix
def test_restored_callback_states(data: Path, tmp_path: Path) -> None:
    """``restore_callback_states_from_checkpoint`` replaces the callbacks with copies made from the
    checkpoint: the loader state still reaches the dataset, and later checkpoints save the new position."""
    plan = planned(data, 1)[0]
    run_job(data, tmp_path / "killed", kill_at_step=4, restore_callbacks=True, expect_kill=True)
    resumed = run_job(
        data,
        tmp_path / "resumed",
        kill_at_step=13,
        restore_callbacks=True,
        expect_kill=True,
        resume_from=str(tmp_path / "killed" / "ckpt" / "checkpoint-3"),
    )
    assert keys(resumed[0]) == plan[3:13]
    again = run_job(
        data,
        tmp_path / "again",
        restore_callbacks=True,
        resume_from=str(tmp_path / "resumed" / "ckpt" / "checkpoint-12"),
    )
    assert keys(again[0]) == plan[12:]


@pytest.mark.matrix
def test_a_straight_run_trains_the_plan(data: Path, tmp_path: Path) -> None:
    trained = run_job(data, tmp_path / "run", processes=2, workers=2)
    assert [keys(records) for records in trained] == planned(data, 2)


@pytest.mark.matrix
def test_epochs_of_varying_length(data: Path, tmp_path: Path) -> None:
    """Duration batching: 11, 11 and 12 batches. The Trainer takes every epoch's length from the first
    (``len(loader)`` once) and ``max_steps`` from it (33): the third epoch's last batch would be dropped."""
    sizes = {"max_duration": 1.0}
    assert [len(batches) for batches in planned(data, 1, 3, **sizes)] == [34]
    assert check_resume(data, tmp_path, kill_at=23, epochs=3, sizes=sizes, workers=2) == 21


@pytest.mark.matrix
def test_max_steps_stops_there(data: Path, tmp_path: Path) -> None:
    plan = planned(data, 1)[0]
    run_job(data, tmp_path / "killed", kill_at_step=8, max_steps=12, expect_kill=True)
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    resumed = run_job(data, tmp_path / "resumed", resume_from=str(checkpoint), max_steps=12)
    assert keys(resumed[0]) == plan[step:12]


@pytest.mark.matrix
def test_gradient_accumulation(data: Path, tmp_path: Path) -> None:
    """2 batches a step: 5 steps an epoch of 9 batches (the last step one batch); a checkpoint every 3
    steps."""
    plan = planned(data, 1)[0]
    run_job(data, tmp_path / "killed", kill_at_step=7, accumulation=2, expect_kill=True)
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert step == 6  # 9 + 2 batches
    resumed = run_job(data, tmp_path / "resumed", resume_from=str(checkpoint), accumulation=2)
    assert keys(resumed[0]) == plan[11:]


@pytest.mark.matrix
def test_resume_on_fewer_processes(data: Path, tmp_path: Path) -> None:
    """A 2-process checkpoint resumed on 1: every sample not yet trained on in the epoch, once; then the new
    world's whole next epoch."""
    plan = planned(data, 2)
    run_job(data, tmp_path / "killed", processes=2, kill_at_step=4, expect_kill=True)
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert step == 3  # mid-epoch 0 (5 steps an epoch on 2 ranks)
    resumed = run_job(data, tmp_path / "resumed", resume_from=str(checkpoint))[0]
    consumed = {key for batches in plan for batch in batches[:step] for key in batch}
    rest = [record for record in resumed if record["epoch"] < 1]
    trained = Counter(key for record in rest for key in record["keys"])
    everything = {f"s{s:03d}_{i:05d}" for s, size in enumerate(SHARD_SIZES) for i in range(size)}
    assert set(trained) == everything - consumed
    assert sum(trained.values()) - len(trained) < BATCH  # repeats: the padding of one last round at most
    assert keys(resumed[len(rest) :]) == planned(data, 1)[0][9:]


# -- without shardio's integration: what the Trainer does on its own ---------------------------------------


@pytest.mark.matrix
def test_the_plain_trainer_reads_every_batch_before_the_checkpoint_again(data: Path, tmp_path: Path) -> None:
    """The plain Trainer over an unbatched ShardDataset (batched by its DataLoader, prepared by Accelerate):
    resumed at step 6, it iterates the epoch from its start through ``skip_first_batches`` and throws away the
    6 batches before the checkpoint (18 samples read and decoded for nothing), then trains the rest."""
    plan = planned(data, 1)[0]
    run_job(data, tmp_path / "killed", trainer="plain", kill_at_step=8, expect_kill=True)
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert step == 6
    resumed = run_job(data, tmp_path / "resumed", trainer="plain", resume_from=str(checkpoint))[0]
    assert keys(resumed) == plan[step:]
    assert resumed[0]["read"] >= (step + 1) * BATCH  # ShardioTrainer: BATCH, the first batch it trains on


# -- Batching(step_batches=K): the same optimizer steps on another number of processes ---------------------


def planned_steps(
    data: Path, world_size: int, epochs: int = 2, **sizes: Any
) -> dict[tuple[int, int], list[str]]:
    """Each (epoch, optimizer step)'s keys over every rank, sorted, as the dataset plans them with
    ``step_batches=4`` on ``world_size`` ranks (global steps counted across epochs)."""
    from shardio import Batching, ShardDataset, World

    batching = Batching(**(sizes or {"batch_size": 1}), step_batches=4)
    found: dict[tuple[int, int], list[str]] = {}
    first = 0
    for epoch in range(epochs):
        steps = 0
        for rank in range(world_size):
            dataset = ShardDataset(
                data,
                seed=5,
                ordering=Ordering(shuffle_shards=2),
                batching=batching,
                world=World(rank, world_size),
            )
            dataset.set_epoch(epoch)
            for batch in dataset:
                step = first + batch["batch_index"] // dataset.accumulation
                found.setdefault((epoch, step), []).extend(batch["keys"])
            steps = len(dataset) // dataset.accumulation
        first += steps
    return {step: sorted(keys) for step, keys in found.items()}


def trained_steps(ranks: list[list[dict[str, Any]]]) -> dict[tuple[int, int], list[str]]:
    """Each (epoch, optimizer step)'s keys over every rank, sorted: the Trainer's ``global_step`` at each
    batch's forward pass is the optimizer step it accumulates into."""
    found: dict[tuple[int, int], list[str]] = {}
    for records in ranks:
        for record in records:
            found.setdefault((record["epoch"], record["step"]), []).extend(record["keys"])
    return {step: sorted(keys) for step, keys in found.items()}


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("before,after", [(2, 1), (1, 2)])
def test_accumulated_steps_killed_and_resumed_on_another_world(
    data: Path, tmp_path: Path, workers: int, before: int, after: int
) -> None:
    """``step_batches=4`` (batches of 1: 7 optimizer steps an epoch): ``before`` processes x
    ``gradient_accumulation_steps=4 / before``, killed with SIGKILL at optimizer step 4, resumed from step 3's
    checkpoint on ``after`` processes x ``4 / after``, train the straight run's optimizer steps from step 3
    on, into the second epoch; the Trainer's own step and epoch counts follow the optimizer steps (its
    epoch's fraction was counted in the new world's rest of the epoch: 0.25 at step 4, not 4 / 7)."""
    straight = planned_steps(data, before)
    assert planned_steps(data, after) == straight and len(straight) == 14
    options = {"step_batches": 4, "batch_size": 1, "workers": workers}
    killed = run_job(data, tmp_path / "killed", processes=before, kill_at_step=4, expect_kill=True, **options)
    assert trained_steps(killed) == {at: keys for at, keys in straight.items() if at[1] < 4}
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert step == 3
    resumed = run_job(data, tmp_path / "resumed", processes=after, resume_from=str(checkpoint), **options)
    assert trained_steps(resumed) == {at: keys for at, keys in straight.items() if at[1] >= step}
    # the TrainerState's epoch at step S's batches (7 steps an epoch): S / 7, on the new world too
    for record in (record for records in [*killed, *resumed] for record in records):
        assert record["trainer_epoch"] == pytest.approx(record["step"] / 7), record
