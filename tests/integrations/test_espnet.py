"""ESPnet2's trainer fed by shardio (:mod:`shardio.integrations.espnet`): a real tiny ESPnet ASR training (its
``ASRTask``, ``Trainer``, preprocessor and collate function), killed with SIGKILL and resumed with
``--resume true``, compared with a straight run key for key; and what ESPnet alone does on the same kill.

The resume matrix: 1 and 2 processes (2: ``torchrun``, ESPnet's DDP over gloo with an external launcher),
0 and 2 decoding workers, a kill mid-epoch, one during the validation after an epoch's last batch (ESPnet's
``checkpoint.pth`` not yet written: resumed into the next epoch), one in epoch 2 (ESPnet's epoch-end
checkpoint and shardio's mid-epoch one loaded together), and a run killed on 2 processes resumed on 1.

ESPnet needs a torch/torchaudio pair of its own (installing it is several GB), so these tests run ESPnet's
Python given by ``SHARDIO_ESPNET_PYTHON`` (with shardio installed in it, editable: tests/README.md) and skip
without it. The figures: ``SHARDIO_ESPNET_PYTHON=... pytest -m slow tests/integrations/test_espnet.py -s``."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import torch
from job_runs import run_in_session
from process_groups import free_port

JOB = Path(__file__).resolve().parents[1] / "espnet_job.py"
PYTHON = os.environ.get("SHARDIO_ESPNET_PYTHON", "")
UTTERANCES = 24
BATCH = 3  # --shardio_batch_size: per rank
BATCHES = 8  # 24 utterances in batches of 3, an epoch on 1 process (4 a rank on 2)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(not PYTHON or not Path(PYTHON).exists(), reason="SHARDIO_ESPNET_PYTHON is not set"),
]


def _run(*args: str, processes: int = 1, killed: bool = False) -> None:
    tests = JOB.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests.parent), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [PYTHON, str(JOB), *args]
    if processes > 1:  # ESPnet's external-launcher mode: torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT
        command[1:1] = ["-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
        command[5:5] = ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    output, returncode = run_in_session(command, env=env, cwd=tests, limit=1500)
    if processes == 1:
        assert returncode == (-9 if killed else 0), output[-3000:]
    else:  # torchrun ends the other rank and fails when one is killed
        assert (returncode != 0) == killed, output[-3000:]


def _trained(out: Path, processes: int = 1) -> list[list[str]]:
    """Each rank's trained batches (utterance ids, space-separated), in order."""
    return [(out / f"trained{rank}.txt").read_text().splitlines() for rank in range(processes)]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "2epoch.pth", weights_only=True)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("espnet")
    _run("prepare", str(work))
    return work


@pytest.fixture(scope="module")
def straight(work: Path) -> dict[int, Path]:
    """The uninterrupted runs' output directories, on 1 and on 2 processes (0 workers)."""
    runs = {}
    for processes in (1, 2):
        out = work / f"straight{processes}"
        _run("train", str(work), str(out), "shardio", "0", "3", processes=processes)
        assert [len(ranks) for ranks in _trained(out, processes)] == [2 * BATCHES // processes] * processes
        runs[processes] = out
    return runs


def check_resume(
    work: Path,
    straight: Path,
    run: str,
    *,
    processes: int,
    kill: str,
    save_every: int,
    workers: int,
    trained: int,
    saved: int,
) -> int:
    """Kill a run (``kill``: espnet_job.py's), check that each rank trained ``trained`` batches and the last
    shardio checkpoint is after ``saved``, resume it, and compare both runs with the straight one key for
    key and weight for weight; the batches retrained."""
    out = work / run
    options = [str(save_every), str(workers)]
    _run("train", str(work), str(out), "shardio", kill, *options, processes=processes, killed=True)
    before = _trained(out, processes)
    assert [len(batches) for batches in before] == [trained] * processes
    _run("train", str(work), str(out), "shardio", "0", *options, processes=processes)
    expected = _trained(straight, processes)
    for rank, batches in enumerate(_trained(out, processes)):
        assert batches[:saved] == expected[rank][:saved]  # the killed run followed the plan
        assert batches[:saved] + batches[trained:] == expected[rank]  # key for key, both epochs
    final, reference = _weights(out), _weights(straight)
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[key], reference[key]) for key in final)  # the same model, bit for bit
    return trained - saved


def test_espnet_killed_mid_epoch_resumes_on_exactly_the_straight_runs_batches(
    work: Path, straight: dict[int, Path]
) -> None:
    # killed before the forward of epoch 1's 8th batch (7 trained); shardio's checkpoint after steps 3 and 6
    retrained = check_resume(
        work, straight[1], "mid", processes=1, kill="8", save_every=3, workers=0, trained=7, saved=6
    )
    print(f"\nshardio: killed after 7 batches of epoch 1, retrained {retrained} on resume")
    assert retrained == 1


def test_espnet_killed_in_validation_resumes_into_the_next_epoch_with_workers(
    work: Path, straight: dict[int, Path]
) -> None:
    """Killed during the validation after epoch 1's last batch (shardio's checkpoint after step 8, ESPnet's
    ``checkpoint.pth`` not written yet): the resumed run trains no batch of epoch 1 and all of epoch 2."""
    retrained = check_resume(
        work, straight[1], "valid", processes=1, kill="v8", save_every=4, workers=2, trained=8, saved=8
    )
    print(f"\nshardio, 2 workers: killed in epoch 1's validation, retrained {retrained} on resume")
    assert retrained == 0


def test_espnet_ddp_killed_mid_epoch_resumes_exactly_on_every_rank(
    work: Path, straight: dict[int, Path]
) -> None:
    # 2 ranks, 4 batches each an epoch: killed before each rank's 4th, shardio's checkpoint after step 2
    retrained = check_resume(
        work, straight[2], "ddp", processes=2, kill="4", save_every=2, workers=0, trained=3, saved=2
    )
    print(f"\nshardio, 2 processes: killed after 3 batches a rank, retrained {retrained} a rank on resume")
    assert retrained == 1


def test_espnet_ddp_with_workers_killed_in_epoch_2_resumes_from_both_checkpoints(
    work: Path, straight: dict[int, Path]
) -> None:
    """Killed before each rank's 4th batch of epoch 2: ESPnet's ``checkpoint.pth`` of epoch 1 and shardio's
    after epoch 2's step 2 are both loaded."""
    retrained = check_resume(
        work, straight[2], "ddp_epoch2", processes=2, kill="8", save_every=2, workers=2, trained=7, saved=6
    )
    assert retrained == 1


def test_espnet_killed_on_2_processes_resumes_on_1_with_each_sample_once(
    work: Path, straight: dict[int, Path]
) -> None:
    """A 2-process run killed mid-epoch 1 (shardio's checkpoint after each rank's 2nd batch) and resumed on 1
    process: every utterance not trained before the checkpoint is trained once in the rest of the epoch (the
    last batch may repeat some to fill it), then epoch 2 is the 1-process run's epoch 2."""
    out = work / "elastic"
    _run("train", str(work), str(out), "shardio", "4", "2", "0", processes=2, killed=True)
    killed = _trained(out, 2)
    _run("train", str(work), str(out), "shardio", "0", "2", "0")
    resumed = _trained(out)[0][len(killed[0]) :]
    consumed = {key for batches in killed for batch in batches[:2] for key in batch.split()}
    second_epoch = _trained(straight[1])[0][BATCHES:]
    assert resumed[-BATCHES:] == second_epoch
    rest = Counter(key for batch in resumed[:-BATCHES] for key in batch.split())
    everything = {f"utt{number:03d}" for number in range(UTTERANCES)}
    assert len(consumed) == 4 * BATCH and set(rest) == everything - consumed
    assert sum(rest.values()) - len(rest) < BATCH
    repeats = sum(rest.values()) - len(rest)
    print(
        f"\nshardio, 2 -> 1 process: {len(consumed)} utterances trained before the checkpoint; the rest of "
        f"the epoch trained the other {len(rest)} once each ({repeats} repeats filling its last batch)"
    )


def test_espnet_alone_retrains_the_interrupted_epoch_from_its_start(work: Path) -> None:
    out = work / "alone"
    _run("train", str(work), str(out), "espnet", "8", "0", killed=True)
    (before,) = _trained(out)
    _run("train", str(work), str(out), "espnet", "0", "0")
    after = _trained(out)[0][len(before) :]
    assert len(after) == 2 * BATCHES  # epoch 1 again from its first batch, then epoch 2
    assert after[: len(before)] == before
    print(
        f"\nESPnet alone: killed after {len(before)} batches of epoch 1, "
        f"retrained all {len(before)} on resume"
    )


def test_espnet_alone_killed_in_validation_retrains_the_whole_epoch(work: Path) -> None:
    out = work / "alone_valid"
    _run("train", str(work), str(out), "espnet", "v8", "0", killed=True)
    (before,) = _trained(out)
    assert len(before) == BATCHES
    _run("train", str(work), str(out), "espnet", "0", "0")
    after = _trained(out)[0][len(before) :]
    assert len(after) == 2 * BATCHES and after[:BATCHES] == before
    print(f"\nESPnet alone: killed in epoch 1's validation, retrained all {BATCHES} batches of epoch 1")


PICKLED = """
import pickle, subprocess, sys
from espnet2.tasks.asr import ASRTask
from shardio.integrations.espnet import shardio_task

Task = shardio_task(ASRTask)
assert shardio_task(ASRTask) is Task
child = "import pickle, sys; f = pickle.loads(sys.stdin.buffer.read()); print(f.__self__.__name__,f.__name__)"
data = pickle.dumps(Task.main_worker)
done = subprocess.run([sys.executable, "-c", child], input=data, capture_output=True)
print(done.stdout.decode(), done.stderr.decode()[-2000:])
"""


def test_espnets_own_multi_gpu_launch_can_unpickle_the_task_in_a_new_process(tmp_path: Path) -> None:
    """``--ngpu N`` (ESPnet's ``multiprocessing_distributed``) starts each rank with the spawn method and
    ``target=cls.main_worker``: the task class must be found again by name in a new interpreter."""
    env = {**os.environ, "PYTHONPATH": str(JOB.parents[1])}
    output, returncode = run_in_session([PYTHON, "-c", PICKLED], env=env, cwd=tmp_path, limit=600)
    assert returncode == 0 and "ShardioASRTask main_worker" in output, output[-3000:]
