"""Exact resume under PyTorch Lightning: real Trainer processes (DDP over gloo on CPU), killed with SIGKILL.

Each case trains ``tests/lightning_job.py`` for two epochs, kills every rank mid-run, resumes from the last
checkpoint it wrote (every 3 steps, and at each epoch end) and checks, per rank, that the batches trained
on after the checkpoint are exactly those of the uninterrupted run (the dataset's own plan, which the killed
run's batches must also follow up to its death). The multi-minute matrix is marked ``matrix`` (left out by
default) (``pytest -m matrix tests/integrations/test_lightning.py``).
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

pytest.importorskip("pytorch_lightning")

from job_runs import run_in_session
from process_groups import free_port
from sample_shards import make_uneven_dataset, planned_keys

from shardio import Ordering

JOB = Path(__file__).parents[1] / "lightning_job.py"
EPOCHS = 2
BATCH = 3
SHARD_SIZES = (7, 5, 9, 4)  # 25 samples: 9 batches of 3 (the last padded) on 1 rank, 5 on 2, 3 on 3


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lightning") / "data"
    make_uneven_dataset(root, SHARD_SIZES, seed=1)
    return root


def planned(data: Path, world_size: int, epochs: int = EPOCHS, **sizes: Any) -> list[list[list[str]]]:
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
    data: Path,
    out: Path,
    *,
    devices: int,
    expect_kill: bool = False,
    expect: str | None = None,
    limit: float = 240,
    **options: Any,
) -> list[list[dict[str, Any]]]:
    """Run the job to its end (or its SIGKILL, or its failure with ``expect`` in its output); every rank's
    trained batches."""
    out.mkdir(parents=True)
    config = {
        "data": str(data),
        "batch_size": BATCH,
        "workers": 0,
        "persistent": False,
        "loader": "plain",
        "callback": "shardio",
        "devices": devices,
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
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONWARNINGS": "ignore",
    }
    # under pytest-timeout's 300 s (or the test's own), to say what hung
    output, returncode = run_in_session(
        [sys.executable, str(JOB), str(out / "config.json")], env=env, cwd=out, limit=limit
    )
    if expect is not None:
        assert returncode == 1 and expect in output, output[-4000:]
    else:
        assert returncode == (-signal.SIGKILL if expect_kill else 0), output[-4000:]
    return [
        [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(out.glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]))
    ]


def last_checkpoint(out: Path) -> tuple[Path, int]:
    """The checkpoint with the highest step (an epoch-end one where both were written at that step)."""
    found = [
        (int(path.stem.rsplit("step=", 1)[1]), path.stem.startswith("end"), path)
        for path in (out / "ckpt").glob("*.ckpt")
    ]
    step, _, path = max(found)
    return path, step


def keys(records: list[dict[str, Any]]) -> list[list[str]]:
    return [record["keys"] for record in records]


def check_resume(data: Path, tmp_path: Path, *, devices: int, kill_at: int, **options: Any) -> int:
    """Kill a run at step ``kill_at``, resume it from its last checkpoint, compare with the plan; the step."""
    plan = planned(data, devices)
    killed = run_job(
        data, tmp_path / "killed", devices=devices, kill_at_step=kill_at, expect_kill=True, **options
    )
    assert [keys(records) for records in killed] == [batches[:kill_at] for batches in plan]
    if "max_duration" not in options:  # fixed batch sizes: every epoch has the first one's length
        estimates = [
            json.loads((tmp_path / "killed" / f"estimate{rank}.json").read_text()) for rank in range(devices)
        ]
        assert [e["estimated_stepping_batches"] for e in estimates] == [len(batches) for batches in plan]
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert 0 < step <= kill_at
    resumed = run_job(data, tmp_path / "resumed", devices=devices, ckpt_path=str(checkpoint), **options)
    assert [keys(records) for records in resumed] == [batches[step:] for batches in plan]
    return step


def test_resume_mid_epoch_with_workers(data: Path, tmp_path: Path) -> None:
    # 9 steps an epoch, a checkpoint every 3: killed at step 14, resumed from step 12 (mid-epoch 1).
    assert check_resume(data, tmp_path, devices=1, kill_at=14, workers=2) == 12


@pytest.mark.slow
def test_resume_mid_epoch_with_the_shard_loader_on_two_ranks(data: Path, tmp_path: Path) -> None:
    # 5 steps an epoch on 2 ranks, each iterating a ShardLoader with 2 workers: killed at 8, resumed at 6.
    assert (
        check_resume(data, tmp_path, devices=2, kill_at=8, workers=2, persistent=True, loader="shardio") == 6
    )


@pytest.mark.slow
def test_resume_ddp_two_ranks_from_epoch_end(data: Path, tmp_path: Path) -> None:
    # 5 steps an epoch on 2 ranks: killed in step 5 (after the epoch-end checkpoint), resumed from step 5.
    assert check_resume(data, tmp_path, devices=2, kill_at=5) == 5


@pytest.mark.matrix
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_from_a_checkpoint_at_a_mid_epoch_validation(data: Path, tmp_path: Path, workers: int) -> None:
    # validation (and a checkpoint) every 4 batches of 9: at steps 4, 8, 9 (the epoch end), 13, 17 ...
    assert check_resume(data, tmp_path, devices=1, kill_at=15, workers=workers, val_every=4) == 13


@pytest.mark.slow
@pytest.mark.timeout(1000)
@pytest.mark.parametrize("strategy", ["ddp_spawn", pytest.param("ddp_fork", marks=pytest.mark.matrix)])
def test_a_dataset_built_before_the_ranks_start_plays_each_ranks_plan(
    data: Path, tmp_path: Path, strategy: str
) -> None:
    """The module builds the dataset in the launcher; ``ddp_spawn`` pickles it to each rank (``ddp_fork``
    forks them), each iterating 2 workers: every rank trains its own plan, and resumes
    it from a checkpoint. Under ``ddp_spawn`` every rank spawns its workers anew each epoch (each importing
    torch): a run took over 240 s on 2 cores shared with other jobs, hence the room."""
    plan = planned(data, 2)
    run = run_job(data, tmp_path / "run", devices=2, strategy=strategy, prebuilt=True, workers=2, limit=480)
    assert [keys(records) for records in run] == plan
    checkpoint = next((tmp_path / "run" / "ckpt").glob("mid-epoch=0-step=3*.ckpt"))
    resumed = run_job(
        data,
        tmp_path / "resumed",
        devices=2,
        strategy=strategy,
        prebuilt=True,
        workers=2,
        ckpt_path=str(checkpoint),
        limit=480,
    )
    assert [keys(records) for records in resumed] == [batches[3:] for batches in plan]


@pytest.mark.slow
@pytest.mark.parametrize("limit", [1.0, 100, 8])  # 8: cut at 8 batches
def test_epochs_of_different_lengths_are_trained_whole(data: Path, tmp_path: Path, limit: float) -> None:
    """Duration batching: epochs 0, 1, 2 have 9, 9 and 10 batches; Lightning would end each after 9 (also with
    an integer ``limit_train_batches`` above 9). A limit below every epoch's length still cuts each there."""
    whole = planned(data, 1, epochs=3, max_duration=1.2)[0]
    plan = [whole[:9], whole[9:18], whole[18:]]
    assert len(whole) == 28 and planned(data, 1, epochs=2, max_duration=1.2)[0] == whole[:18]
    trained = run_job(
        data,
        tmp_path / "run",
        devices=1,
        max_duration=1.2,
        max_epochs=3,
        every_n_steps=100,
        limit_train_batches=limit,
    )
    cut = int(limit) if isinstance(limit, int) else None
    assert keys(trained[0]) == [batch for epoch in plan for batch in epoch[:cut]]


@pytest.mark.matrix
def test_naive_callback_restarts_the_epoch(data: Path, tmp_path: Path) -> None:
    """The pitfall: a state loaded in a training hook comes after Lightning's first ``iter()``, which has
    started the epoch with the dataset as it was; the state applies to the next iteration only. (Loaded in
    ``on_train_start``, before the first batch, it may or may not reach workers still starting up: only
    ``ShardioCallback.attach`` in ``train_dataloader()`` is on time in every configuration.)"""
    plan = planned(data, 1)[0]
    run_job(
        data, tmp_path / "killed", devices=1, callback="naive", workers=2, kill_at_step=5, expect_kill=True
    )
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert step == 3
    resumed = keys(
        run_job(
            data, tmp_path / "resumed", devices=1, callback="naive", workers=2, ckpt_path=str(checkpoint)
        )[0]
    )
    assert resumed[: 9 - step] == plan[: 9 - step]  # epoch 0 again from its first batch, cut at Lightning's
    assert resumed != plan[step:]


@pytest.mark.matrix
@pytest.mark.parametrize("loader", ["plain", "stateful", "shardio"])
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("devices,kill_at", [(1, 7), (1, 10), (2, 8), (3, 5)])
def test_resume_matrix(
    data: Path, tmp_path: Path, loader: str, workers: int, persistent: bool, devices: int, kill_at: int
) -> None:
    check_resume(
        data,
        tmp_path,
        devices=devices,
        kill_at=kill_at,
        workers=workers,
        persistent=persistent,
        loader=loader,
    )


@pytest.mark.slow
def test_reloaded_dataloaders_train_every_epoch_with_workers(data: Path, tmp_path: Path) -> None:
    """``reload_dataloaders_every_n_epochs``: Lightning calls ``iter()`` on each new loader in ``setup_data``
    (its workers begin the epoch and prefetch) and again in the epoch loop; the callback stops the first
    iterator's workers and sets the epoch between the two, so the second plays the epoch, not the next."""
    plan = planned(data, 1, epochs=3)[0]
    assert keys(run_job(data, tmp_path / "run", devices=1, workers=2, reload=1, max_epochs=3)[0]) == plan


@pytest.mark.matrix
@pytest.mark.parametrize(
    "loader,persistent", [("plain", True), ("stateful", False), ("stateful", True), ("shardio", True)]
)
def test_reloaded_dataloaders_matrix(data: Path, tmp_path: Path, loader: str, persistent: bool) -> None:
    plan = planned(data, 1, epochs=3)[0]
    trained = run_job(
        data,
        tmp_path / "run",
        devices=1,
        workers=2,
        reload=1,
        max_epochs=3,
        loader=loader,
        persistent=persistent,
    )
    assert keys(trained[0]) == plan


# -- without ShardioCallback: what Lightning 2.6 trains (docs/trainers/lightning.md, "Without the callback")
# ---------------------------------


@pytest.mark.matrix
@pytest.mark.parametrize("loader,workers", [("plain", 0), ("stateful", 2)])
def test_without_the_callback_a_fresh_run_trains_each_epochs_plan(
    data: Path, tmp_path: Path, loader: str, workers: int
) -> None:
    """Lightning calls ``iter()`` once per epoch (without reloads), and each iteration without ``set_epoch``
    plays the next epoch: epoch e trains epoch e's plan."""
    trained = run_job(
        data, tmp_path / "run", devices=1, callback="none", loader=loader, workers=workers, max_epochs=3
    )
    assert keys(trained[0]) == planned(data, 1, epochs=3)[0]


@pytest.mark.matrix
@pytest.mark.parametrize("loader,kill_at,step,rest", [("plain", 13, 12, 6), ("stateful", 10, 9, 9)])
def test_without_the_callback_a_resumed_run_restarts_the_dataset_at_epoch_0(
    data: Path, tmp_path: Path, loader: str, kill_at: int, step: int, rest: int
) -> None:
    """The resumed process's dataset starts at epoch 0 while Lightning is in epoch 1: a plain loader saves no
    state (resumed mid-epoch 1 at step 12, Lightning's 6 remaining batches are epoch 0's first 6), and
    Lightning restores a StatefulDataLoader's state only mid-epoch (from the epoch-end checkpoint at step 9,
    epoch 1 trains epoch 0's plan); every later epoch trains the plan of one epoch
    earlier than Lightning's."""
    plan = planned(data, 1, epochs=3)[0]
    run_job(
        data,
        tmp_path / "killed",
        devices=1,
        callback="none",
        loader=loader,
        workers=2,
        max_epochs=3,
        kill_at_step=kill_at,
        expect_kill=True,
    )
    checkpoint, found = last_checkpoint(tmp_path / "killed")
    assert found == step
    resumed = run_job(
        data,
        tmp_path / "resumed",
        devices=1,
        callback="none",
        loader=loader,
        workers=2,
        max_epochs=3,
        ckpt_path=str(checkpoint),
    )[0]
    assert [record["epoch"] for record in resumed] == [1] * rest + [2] * 9
    assert keys(resumed) == plan[:rest] + plan[9:18] != plan[step:]


@pytest.mark.matrix
@pytest.mark.parametrize("workers", [0, 2])
def test_without_the_callback_a_stateful_loader_resumes_mid_epoch_exactly(
    data: Path, tmp_path: Path, workers: int
) -> None:
    """Lightning restores a StatefulDataLoader's own state before its first ``iter()``: from a mid-epoch
    checkpoint, the rest of the epoch and the epochs after it are the uninterrupted run's."""
    plan = planned(data, 1, epochs=3)[0]
    run_job(
        data,
        tmp_path / "killed",
        devices=1,
        callback="none",
        loader="stateful",
        workers=workers,
        max_epochs=3,
        kill_at_step=13,
        expect_kill=True,
    )
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert step == 12
    resumed = run_job(
        data,
        tmp_path / "resumed",
        devices=1,
        callback="none",
        loader="stateful",
        workers=workers,
        max_epochs=3,
        ckpt_path=str(checkpoint),
    )
    assert keys(resumed[0]) == plan[step:]


@pytest.mark.slow
def test_a_checkpoint_saved_without_the_callback_resumes_at_an_epoch_end_and_is_refused_mid_epoch(
    data: Path, tmp_path: Path
) -> None:
    """The callback added to a run whose checkpoints lack its state: from the epoch-end checkpoint the next
    epoch is the uninterrupted run's; from a mid-epoch one the run stops before its first batch with a
    StateError (it trained epoch 1's first 6 batches as its last 6)."""
    plan = planned(data, 1)[0]
    run_job(
        data, tmp_path / "killed", devices=1, callback="none", workers=2, kill_at_step=13, expect_kill=True
    )
    ckpt = tmp_path / "killed" / "ckpt"
    resumed = run_job(
        data, tmp_path / "end", devices=1, workers=2, ckpt_path=str(ckpt / "end-epoch=0-step=9.ckpt")
    )
    assert keys(resumed[0]) == plan[9:]
    refused = run_job(
        data,
        tmp_path / "mid",
        devices=1,
        workers=2,
        ckpt_path=str(ckpt / "mid-epoch=1-step=12.ckpt"),
        expect="StateError: the checkpoint",
    )
    assert refused == []


@pytest.mark.matrix
def test_without_the_callback_reloaded_dataloaders_replay_epoch_0(data: Path, tmp_path: Path) -> None:
    """``reload_dataloaders_every_n_epochs`` builds a new dataset each epoch, at epoch 0 (with workers, the
    extra ``iter()`` of ``setup_data`` may have begun it: the next, then, or epoch 0 again)."""
    plan = planned(data, 1, epochs=3)[0]
    trained = run_job(data, tmp_path / "run", devices=1, callback="none", workers=0, max_epochs=3, reload=1)
    assert keys(trained[0]) == plan[:9] * 3


@pytest.mark.matrix
@pytest.mark.parametrize("reload", [0, 1])
@pytest.mark.parametrize("before,after", [(2, 3), (3, 2), (2, 1)])
def test_resume_on_another_number_of_ranks(
    data: Path, tmp_path: Path, before: int, after: int, reload: int
) -> None:
    check_resume_on_another_number_of_ranks(data, tmp_path, before, after, reload)


@pytest.mark.slow
def test_resume_on_fewer_ranks_trains_the_whole_rest_of_the_epoch(data: Path, tmp_path: Path) -> None:
    """2 ranks resumed on 1: Lightning counts the resumed epoch on from the checkpoint's 2 batches and ended
    it at the 1-rank segment's length (5), so 3 of its 5 batches were trained and 2 never, until the
    callback made the epoch end where the segment does."""
    check_resume_on_another_number_of_ranks(data, tmp_path, 2, 1, 0)


def check_resume_on_another_number_of_ranks(
    data: Path, tmp_path: Path, before: int, after: int, reload: int
) -> None:
    """Every sample not trained on before the checkpoint is trained on once in the rest of the epoch (and
    the planned padding of the new world's last round); the next epoch is the new world's whole epoch."""
    plan = planned(data, before)
    options = {"every_n_steps": 1, "reload": reload}
    run_job(data, tmp_path / "killed", devices=before, kill_at_step=2, expect_kill=True, **options)
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert step == 2  # mid-epoch 0 for both worlds (5 and 3 steps an epoch)
    resumed = run_job(data, tmp_path / "resumed", devices=after, ckpt_path=str(checkpoint), **options)
    consumed = {key for batches in plan for batch in batches[:step] for key in batch}
    rest = Counter(
        key for records in resumed for record in records if record["epoch"] == 0 for key in record["keys"]
    )
    everything = {f"s{s:03d}_{i:05d}" for s, size in enumerate(SHARD_SIZES) for i in range(size)}
    assert set(rest) == everything - consumed
    assert sum(rest.values()) - len(rest) < after * BATCH  # repeats: the padding of one last round at most
    assert [keys([r for r in records if r["epoch"] == 1]) for records in resumed] == [
        batches[len(batches) // EPOCHS :] for batches in planned(data, after)
    ]


def steps_of(ranks: list[list[dict[str, Any]]]) -> dict[tuple[int, int], list[str]]:
    """Each (epoch, optimizer step)'s keys over every rank, sorted."""
    found: dict[tuple[int, int], list[str]] = {}
    for records in ranks:
        for record in records:
            found.setdefault((record["epoch"], record["step"]), []).extend(record["keys"])
    return {step: sorted(keys) for step, keys in found.items()}


def test_accumulate_grad_batches_resumes_on_another_number_of_ranks_onto_the_same_steps(
    data: Path, tmp_path: Path
) -> None:
    """2 ranks x accumulate_grad_batches=2 (step_batches=4), killed with SIGKILL mid-epoch, resumed on 1
    rank x 4 from the last checkpoint (at an optimizer step): every later step trains on the straight run's
    samples."""
    from shardio import Batching, ShardDataset, World

    batching = Batching(batch_size=BATCH, step_batches=4)
    straight: dict[tuple[int, int], list[str]] = {}
    first = 0
    for epoch in range(EPOCHS):
        length = 0
        for rank in range(2):
            ds = ShardDataset(
                data, seed=5, ordering=Ordering(shuffle_shards=2), batching=batching, world=World(rank, 2)
            )
            ds.set_epoch(epoch)
            for batch in ds:
                step = first + batch["batch_index"] // ds.accumulation
                straight.setdefault((epoch, step), []).extend(batch["keys"])
            length = len(ds) // ds.accumulation
        first += length
    straight = {step: sorted(keys) for step, keys in straight.items()}
    options = {"every_n_steps": 1, "step_batches": 4}
    killed = run_job(
        data, tmp_path / "killed", devices=2, accumulate=2, kill_at_step=2, expect_kill=True, **options
    )
    assert steps_of(killed) == {step: keys for step, keys in straight.items() if step[1] < 2}
    checkpoint, step = last_checkpoint(tmp_path / "killed")
    assert step == 2
    resumed = run_job(
        data, tmp_path / "resumed", devices=1, accumulate=4, ckpt_path=str(checkpoint), **options
    )
    assert steps_of(resumed) == {at: keys for at, keys in straight.items() if at[1] >= 2}
