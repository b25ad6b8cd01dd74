"""Exact resume under SpeechBrain's ``Brain.fit``: real recipe processes (alone, or 2 under torchrun with
gloo), killed with SIGKILL, recovered by ``Checkpointer.recover_if_possible`` in a new process.

``tests/speechbrain_job.py`` trains two epochs with an intra-epoch checkpoint every 3 steps
(``ckpt_interval_steps``) and one at each epoch end; every rank kills itself at a given batch; the run
recovered from the latest checkpoint trains, per rank, on exactly the batches of the uninterrupted run (the
dataset's plan) after it. Where the checkpoint stands is read from SpeechBrain's own files (the epoch counter
and the Brain's step), not from shardio's. The fast tier runs one case (one process); two processes under
torchrun are ``slow``; the rest is marked ``matrix``
(``pytest -m matrix tests/integrations/test_speechbrain.py``).

SpeechBrain imports torchaudio, which loads only against the torch it was built for, so SpeechBrain runs in a
virtualenv of its own, made as ``shardio[speechbrain]`` installs it (torch 2.9 with torchaudio 2.9), named by
``SHARDIO_SPEECHBRAIN_PYTHON`` (tests/README.md; CI makes one); without it these tests skip.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_runs import SPEECHBRAIN_PYTHON, job_environment, needs_speechbrain, run_in_session, run_python
from process_groups import free_port
from sample_shards import make_uneven_dataset, planned_keys

from shardio import Ordering

speechbrain = needs_speechbrain()
JOB = Path(__file__).parents[1] / "speechbrain_job.py"
EPOCHS = 2
BATCH = 3
SHARD_SIZES = (7, 5, 9, 4)  # 25 samples: 9 batches of 3 on 1 rank, 5 per rank on 2 (the last round padded)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("speechbrain") / "data"
    make_uneven_dataset(root, SHARD_SIZES, seed=1)
    return root


def planned(data: Path, world_size: int) -> list[list[list[str]]]:
    """Per rank, the keys of every batch of the uninterrupted run (both epochs, in step order)."""
    return planned_keys(
        data, world_size, EPOCHS, batch_size=BATCH, seed=5, ordering=Ordering(shuffle_shards=2)
    )


def run_job(
    data: Path,
    out: Path,
    *,
    processes: int,
    expect_kill: bool = False,
    ckpt_dir: Path | None = None,
    **options: Any,
) -> list[list[list[str]]]:
    """Run the recipe (under torchrun for 2 processes) to its end or its SIGKILL; each rank's trained keys."""
    out.mkdir(parents=True)
    config = {
        "data": str(data),
        "batch_size": BATCH,
        "workers": 0,
        "epochs": EPOCHS,
        "ckpt_steps": 3,
        "out": str(out),
        "ckpt_dir": str(ckpt_dir or out / "ckpt"),
        **options,
    }
    (out / "config.json").write_text(json.dumps(config))
    env = {**job_environment(SPEECHBRAIN_PYTHON), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [SPEECHBRAIN_PYTHON, str(JOB), str(out / "config.json")]
    if processes > 1:  # SpeechBrain's DDP: torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT
        command[1:1] = [
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(processes),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
        ]
    output, returncode = run_in_session(command, env=env, cwd=out, limit=280)  # under pytest-timeout's 300 s
    (out / "output.txt").write_text(output)
    assert (returncode != 0) == expect_kill, output[-4000:]
    ranks = []
    for rank in range(processes):
        log = out / f"rank{rank}.jsonl"
        ranks.append(
            [json.loads(line)["keys"] for line in log.read_text().splitlines()] if log.exists() else []
        )
    return ranks


def checkpoint_step(ckpt_dir: Path, steps_per_epoch: int) -> int:
    """The batches trained (per rank) before SpeechBrain's latest checkpoint, from its epoch counter and the
    Brain's own step count (the latest by the ``unixtime`` of its meta file, as
    ``recover_if_possible`` picks)."""

    def unixtime(path: Path) -> float:
        return next(
            float(line.split(":", 1)[1])
            for line in (path / "CKPT.yaml").read_text().splitlines()
            if line.startswith("unixtime:")
        )

    latest = max(ckpt_dir.glob("CKPT+*"), key=unixtime)
    epoch = int((latest / "counter.ckpt").read_text())
    step = next(
        int(line.split(":", 1)[1])
        for line in (latest / "brain.ckpt").read_text().splitlines()
        if line.startswith("step:")
    )
    return (epoch - 1) * steps_per_epoch + step


def check_resume(data: Path, tmp_path: Path, *, processes: int, kill_at: int, **options: Any) -> int:
    plan = planned(data, processes)
    killed = run_job(
        data, tmp_path / "killed", processes=processes, kill_at_step=kill_at, expect_kill=True, **options
    )
    assert killed == [batches[:kill_at] for batches in plan]
    step = checkpoint_step(tmp_path / "killed" / "ckpt", len(plan[0]) // EPOCHS)
    resumed = run_job(
        data, tmp_path / "resumed", processes=processes, ckpt_dir=tmp_path / "killed" / "ckpt", **options
    )
    assert resumed == [batches[step:] for batches in plan]
    return step


@speechbrain
def test_resume_mid_epoch_one_process(data: Path, tmp_path: Path) -> None:
    # 9 steps an epoch; checkpoints after steps 3, 6, 9 (the epoch end), 12: killed at 5, resumed at 3.
    assert check_resume(data, tmp_path, processes=1, kill_at=5, workers=2) == 3


@speechbrain
@pytest.mark.slow
def test_resume_mid_epoch_two_processes(data: Path, tmp_path: Path) -> None:
    # 5 steps an epoch on 2 ranks; checkpoints after steps 3, 5 (epoch end), 8, 10: killed at 4, resumed at 3.
    assert check_resume(data, tmp_path, processes=2, kill_at=4, workers=2) == 3


@speechbrain
@pytest.mark.matrix
@pytest.mark.parametrize("processes", [1, 2])
def test_a_straight_run_trains_on_the_plan(data: Path, tmp_path: Path, processes: int) -> None:
    assert run_job(data, tmp_path / "run", processes=processes, workers=2) == planned(data, processes)


@speechbrain
@pytest.mark.matrix
@pytest.mark.parametrize("loader", ["plain", "shardio"])
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize(
    "processes,kill_at,resumed_at",
    [
        (1, 5, 3),
        (1, 10, 9),  # 9 steps an epoch: intra-epoch checkpoints after 3, 6, 9 (the last batch), 12
        (2, 4, 3),
        (2, 6, 5),
        (2, 9, 8),  # 5 steps an epoch: 6 resumes at the epoch end (5), across the boundary
    ],
)
def test_resume_matrix(
    data: Path,
    tmp_path: Path,
    loader: str,
    workers: int,
    persistent: bool,
    processes: int,
    kill_at: int,
    resumed_at: int,
) -> None:
    assert (
        check_resume(
            data,
            tmp_path,
            processes=processes,
            kill_at=kill_at,
            workers=workers,
            persistent=persistent,
            loader=loader,
        )
        == resumed_at
    )


@speechbrain
@pytest.mark.matrix
def test_resume_on_one_process_after_two(data: Path, tmp_path: Path) -> None:
    """A 2-process checkpoint recovered by 1 process: every sample not yet trained on in the epoch, once."""
    plan = planned(data, 2)
    run_job(data, tmp_path / "killed", processes=2, kill_at_step=4, expect_kill=True, workers=2)
    step = checkpoint_step(tmp_path / "killed" / "ckpt", len(plan[0]) // EPOCHS)
    assert step == 3
    (resumed,) = run_job(
        data, tmp_path / "resumed", processes=1, ckpt_dir=tmp_path / "killed" / "ckpt", workers=2
    )
    consumed = {key for batches in plan for batch in batches[:step] for key in batch}
    one_rank = planned(data, 1)
    second_epoch = one_rank[0][len(one_rank[0]) // EPOCHS :]
    assert resumed[len(resumed) - len(second_epoch) :] == second_epoch
    rest = Counter(key for batch in resumed[: len(resumed) - len(second_epoch)] for key in batch)
    everything = {f"s{s:03d}_{i:05d}" for s, size in enumerate(SHARD_SIZES) for i in range(size)}
    assert set(rest) == everything - consumed
    assert sum(rest.values()) - len(rest) < BATCH  # only the last batch's padding repeats a sample


@speechbrain
@pytest.mark.matrix
def test_speechbrain_alone_restarts_the_epoch(data: Path, tmp_path: Path) -> None:
    """Without the integration, SpeechBrain recovers the model, optimizer, epoch counter and step count, but
    nothing of the IterableDataset: the resumed process trains epoch 0's plan again from its first batch."""
    plan = planned(data, 1)[0]
    killed = run_job(data, tmp_path / "killed", processes=1, kill_at_step=5, expect_kill=True, track=False)
    assert killed[0] == plan[:5]
    step = checkpoint_step(tmp_path / "killed" / "ckpt", len(plan) // EPOCHS)
    assert step == 3
    (resumed,) = run_job(
        data, tmp_path / "resumed", processes=1, ckpt_dir=tmp_path / "killed" / "ckpt", track=False
    )
    assert resumed == plan  # not plan[3:]: epoch 0 again from its first batch, 3 batches trained twice


def _python(code: str) -> str:
    """Run ``code`` in a new interpreter of SpeechBrain's environment; its output."""
    return run_python(code, timeout=120, python=SPEECHBRAIN_PYTHON)


def test_a_missing_extra_is_named() -> None:
    out = run_python(
        "import sys\nsys.modules['speechbrain'] = None\n"
        "try:\n    import shardio.integrations.speechbrain\nexcept ImportError as exc:\n    print(exc)",
        timeout=120,
    )
    assert "pip install 'shardio[speechbrain]'" in out


@speechbrain
def test_a_torchaudio_that_does_not_load_is_named(tmp_path: Path) -> None:
    """A torchaudio built for another torch fails in its C++ extension with an OSError, which SpeechBrain's
    import passes on: an ImportError that says so (here a torchaudio package whose import raises it)."""
    (tmp_path / "torchaudio").mkdir()
    (tmp_path / "torchaudio" / "__init__.py").write_text(
        "raise OSError('Could not load this library: x.so')\n"
    )
    out = _python(
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
        "try:\n    import shardio.integrations.speechbrain\nexcept ImportError as exc:\n    print(exc)"
    )
    assert "the torchaudio installed does not load against this torch" in out


def test_importing_shardio_imports_no_speechbrain() -> None:
    out = run_python(
        "import sys, shardio, shardio.integrations\nprint('speechbrain' in sys.modules)", timeout=120
    )
    assert out.strip() == "False"


@speechbrain
def test_refusals(data: Path, tmp_path: Path) -> None:
    """What track and the recoverable refuse, each with the error that names it; a checkpoint's file is JSON,
    never unpickled (a pickle that would run code when loaded is a StateError, and runs nothing)."""
    hostile = tmp_path / "hostile.ckpt"
    missing = tmp_path / "other.ckpt"
    hostile.write_bytes(b"cos\nsystem\n(S'touch " + str(tmp_path / "ran").encode() + b"'\ntR.")
    (tmp_path / "other.ckpt").write_text('{"step": 3}')
    out = _python(f"""
import torch, speechbrain as sb
from speechbrain.utils.checkpoints import Checkpointer
from shardio import ShardDataset, World, ShardioError
from shardio.integrations.speechbrain import LoaderProgress, track

class B(sb.Brain):
    pass

def brain(checkpointer):
    return B(modules={{"l": torch.nn.Linear(1, 1)}}, run_opts={{"device": "cpu", "noprogressbar": True}},
             checkpointer=checkpointer)

data = {str(data)!r}
ckpt = Checkpointer({str(tmp_path / "ckpt")!r})
cases = {{
    "not a dataset": lambda: track(brain(ckpt), [1, 2]),
    "no checkpointer": lambda: track(brain(None), ShardDataset(data, batch_size=2)),
    "dataloader name": lambda: track(brain(ckpt), ShardDataset(data, batch_size=2), name="train_dataloader"),
    "other ranks": lambda: track(brain(ckpt), ShardDataset(data, batch_size=2, world=World(1, 2))),
    "epoch 0": lambda: LoaderProgress(ShardDataset(data, batch_size=2)).set_epoch(0),
    "no set_epoch": lambda: LoaderProgress(ShardDataset(data, batch_size=2)).update(
        next(iter(ShardDataset(data, batch_size=2)))),
    "pickle": lambda: LoaderProgress(ShardDataset(data, batch_size=2)).load({str(hostile)!r}, False),
    "no state": lambda: LoaderProgress(ShardDataset(data, batch_size=2)).load({str(missing)!r}, False),
}}
for name, case in cases.items():
    try:
        case()
        print(name, "accepted")
    except ShardioError as exc:
        print(name, type(exc).__name__, str(exc).splitlines()[0])
b = brain(ckpt)
b.train_sampler = object()
try:
    track(b, ShardDataset(data, batch_size=2))
except ShardioError as exc:
    print("sampler", type(exc).__name__, exc)
""")
    assert "not a dataset OptionError track takes a ShardDataset, not list" in out
    assert "no checkpointer OptionError the Brain has no checkpointer" in out
    assert "dataloader name OptionError track's name 'train_dataloader'" in out
    assert "other ranks OptionError the dataset plans for rank 1 of 2, the Brain runs rank 0 of 1" in out
    assert "epoch 0 OptionError SpeechBrain's epochs count from 1" in out
    assert "no set_epoch StateError Brain.fit did not call LoaderProgress.set_epoch" in out
    assert "pickle StateError" in out and "cannot read a JSON loader state" in out
    assert "no state StateError" in out
    assert "sampler OptionError the Brain already has a train_sampler (object)" in out
    assert "accepted" not in out
    assert not (tmp_path / "ran").exists()


@speechbrain
@pytest.mark.matrix
def test_resume_a_mixed_dataset(data: Path, tmp_path: Path) -> None:
    """A MixedDataset (this corpus and another, epochs sized by this one), 2 ranks, 2 workers: the recovered
    run trains on the straight run's batches after the checkpoint, key for key (``corpus/key``)."""
    other = tmp_path / "other"
    make_uneven_dataset(other, (4, 6), seed=2)
    straight = run_job(data, tmp_path / "straight", processes=2, workers=2, mix=str(other))
    assert all(len(batches) > 4 for batches in straight)
    assert {key.split("/")[0] for batches in straight for batch in batches for key in batch} == {"a", "b"}
    killed = run_job(
        data, tmp_path / "killed", processes=2, kill_at_step=4, expect_kill=True, workers=2, mix=str(other)
    )
    assert killed == [batches[:4] for batches in straight]
    step = checkpoint_step(tmp_path / "killed" / "ckpt", steps_per_epoch=0)  # killed in the first epoch
    assert step == 3
    resumed = run_job(
        data,
        tmp_path / "resumed",
        processes=2,
        ckpt_dir=tmp_path / "killed" / "ckpt",
        workers=2,
        mix=str(other),
    )
    assert resumed == [batches[step:] for batches in straight]


# -- Batching(step_batches=K): the same optimizer steps on another number of processes ---------------------


def planned_steps(data: Path, world_size: int) -> list[list[str]]:
    """The keys of every optimizer step over every rank (both epochs, in order, sorted within a step), as the
    dataset plans them with ``step_batches=4`` (batches of 1) on ``world_size`` ranks."""
    from shardio import Batching, ShardDataset, World

    steps: list[list[str]] = []
    for epoch in range(EPOCHS):
        found: dict[int, list[str]] = {}
        for rank in range(world_size):
            dataset = ShardDataset(
                data,
                seed=5,
                ordering=Ordering(shuffle_shards=2),
                batching=Batching(batch_size=1, step_batches=4),
                world=World(rank, world_size),
            )
            dataset.set_epoch(epoch)
            for batch in dataset:
                found.setdefault(batch["batch_index"] // dataset.accumulation, []).extend(batch["keys"])
        steps += [sorted(found[step]) for step in sorted(found)]
    return steps


def optimizer_steps(out: Path, processes: int) -> list[list[str]]:
    """Each optimizer step's keys over every rank, sorted: a rank's batches up to the next that ended a step
    (SpeechBrain's ``should_step``)."""
    per_rank = []
    for rank in range(processes):
        steps, current = [], []
        for line in (out / f"rank{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            current += record["keys"]
            if record["sync"]:
                steps.append(current)
                current = []
        assert not current, f"rank {rank}: batches after its last optimizer step"
        per_rank.append(steps)
    assert len({len(steps) for steps in per_rank}) == 1, "ranks of unequal optimizer step counts"
    return [sorted(key for steps in per_rank for key in steps[s]) for s in range(len(per_rank[0]))]


@speechbrain
@pytest.mark.slow
@pytest.mark.parametrize(
    "before,after,kill_at,resumed_at,workers",
    [
        (2, 1, 4, 3, 0),  # the intra-epoch checkpoint after step 3
        (2, 1, 8, 7, 2),  # the epoch-end checkpoint after step 7 (epoch 0's last)
        (1, 2, 4, 3, 0),
    ],
)
def test_accumulated_steps_killed_and_resumed_on_another_world(
    data: Path, tmp_path: Path, before: int, after: int, kill_at: int, resumed_at: int, workers: int
) -> None:
    """``step_batches=4`` (batches of 1: 7 optimizer steps an epoch): ``before`` processes x
    ``grad_accumulation_factor=4 / before`` (an intra-epoch checkpoint every 3 optimizer steps), killed with
    SIGKILL at optimizer step ``kill_at``, recovered from the latest checkpoint on ``after`` processes x
    ``4 / after``, train the straight run's optimizer steps from that checkpoint's on. SpeechBrain recovers
    its own batch count of the epoch (the Brain's ``step``, by which it decides ``should_step``): counted on
    the old world, it must not decide the new world's steps."""
    straight = planned_steps(data, before)
    assert planned_steps(data, after) == straight and len(straight) == 14
    accumulation = {processes: 4 // processes for processes in (before, after)}
    killed = run_job(
        data,
        tmp_path / "killed",
        processes=before,
        kill_at_step=kill_at * accumulation[before],
        expect_kill=True,
        step_batches=4,
        batch_size=1,
        ckpt_steps=3 * accumulation[before],
        workers=workers,
    )
    assert optimizer_steps(tmp_path / "killed", before) == straight[:kill_at]
    assert killed  # every rank's log read
    ckpt = tmp_path / "killed" / "ckpt"
    assert checkpoint_step(ckpt, 7 * accumulation[before]) == resumed_at * accumulation[before]
    run_job(
        data,
        tmp_path / "resumed",
        processes=after,
        ckpt_dir=ckpt,
        step_batches=4,
        batch_size=1,
        ckpt_steps=3 * accumulation[after],
        workers=workers,
    )
    assert optimizer_steps(tmp_path / "resumed", after) == straight[resumed_at:]


@speechbrain
@pytest.mark.slow
def test_accumulation_after_an_epoch_end_checkpoint(data: Path, tmp_path: Path) -> None:
    """Without steps, ``grad_accumulation_factor=2`` on 1 process (9 batches an epoch): recovered from the
    checkpoint at epoch 0's end, epoch 1 steps after its batches 2, 4, 6, 8 as the straight run's does.
    SpeechBrain alone recovers its batch count as saved (9) and stepped after batches 1, 3, 5, 7, 9."""
    plan = planned(data, 1)[0]
    run_job(data, tmp_path / "killed", processes=1, kill_at_step=10, expect_kill=True, accumulation=2)
    ckpt = tmp_path / "killed" / "ckpt"
    assert checkpoint_step(ckpt, 9) == 9
    (resumed,) = run_job(data, tmp_path / "resumed", processes=1, ckpt_dir=ckpt, accumulation=2)
    assert resumed == plan[9:]
    records = [json.loads(line) for line in (tmp_path / "resumed" / "rank0.jsonl").read_text().splitlines()]
    assert [record["sync"] for record in records] == [batch % 2 == 0 for batch in range(1, 10)]
