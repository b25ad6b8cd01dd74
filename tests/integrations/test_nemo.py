"""A NeMo ASR model (``EncDecCTCModel``) trained by Lightning on shardio batches (:func:`nemo_batch`, with
``ShardioCallback``), killed with SIGKILL and resumed from its Lightning checkpoint, compared with a straight
run key for key and weight for weight; and the same run without the callback.

The resume matrix: 1 and 2 processes (2: Lightning's DDP over gloo), 0 and 2 DataLoader workers, a kill
mid-epoch and one in epoch 2 resumed from the checkpoint at epoch 1's last batch, a run killed on 2 processes
resumed on 1; and the model trained on NeMo's own tarred dataset (``audio_{n}.tar``, its manifest) indexed in
place with ``shardio index --nemo-manifest``, killed mid-epoch and resumed.

NeMo runs in an environment of its own (NeMo 3.0 with torch 2.13 CPU: tests/README.md), named by
``SHARDIO_NEMO_PYTHON``; without it these tests skip. The figures: ``SHARDIO_NEMO_PYTHON=... pytest -m slow
tests/integrations/test_nemo.py -s``."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import torch
from job_runs import run_in_session
from process_groups import free_port

from shardio.errors import OptionError
from shardio.integrations.nemo import nemo_batch

JOB = Path(__file__).resolve().parents[1] / "nemo_job.py"
PYTHON = os.environ.get("SHARDIO_NEMO_PYTHON", "")
BATCHES = 8  # 24 utterances in batches of 3, an epoch
UTTERANCES = 24
BATCH = 3
needs_nemo = pytest.mark.skipif(
    not PYTHON or not Path(PYTHON).exists(), reason="SHARDIO_NEMO_PYTHON is not set"
)


def test_nemo_batch_is_the_audio_to_text_batch_nemo_collates() -> None:
    batch = {
        "audio": torch.arange(12, dtype=torch.float32).reshape(2, 1, 6),
        "lengths": torch.tensor([6, 4]),
        "text": ["ab", "c"],
    }
    signal, signal_len, transcript, transcript_len = nemo_batch(
        batch, lambda text: [" abc".index(c) for c in text]
    )
    assert signal.shape == (2, 6) and torch.equal(signal_len, torch.tensor([6, 4]))
    assert transcript.tolist() == [[1, 2], [3, 0]] and transcript_len.tolist() == [2, 1]
    with pytest.raises(OptionError, match="mono"):
        nemo_batch({**batch, "audio": torch.zeros(2, 2, 6)}, list)
    with pytest.raises(OptionError, match="no 'text' field"):
        nemo_batch({"audio": batch["audio"], "lengths": batch["lengths"]}, list)


def _run(work: Path, out: Path, kill_at: int, *options: str, devices: int = 1, killed: bool = False) -> None:
    tests = JOB.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests.parent), os.environ.get("PYTHONPATH", "")]),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(name, None)
    command = [PYTHON, str(JOB), "train", str(work), str(out), str(kill_at), "--devices", str(devices)]
    output, returncode = run_in_session([*command, *options], env=env, cwd=tests, limit=1500)
    assert returncode == (-9 if killed else 0), output[-3000:]


def _trained(out: Path, devices: int = 1) -> list[list[str]]:
    """Each rank's trained batches (keys, space-separated), in order."""
    return [(out / f"trained{rank}.txt").read_text().splitlines() for rank in range(devices)]


def _same_weights(out: Path, reference: Path) -> bool:
    final, expected = (torch.load(run / "final.pt", weights_only=True) for run in (out, reference))
    return final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in expected)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("nemo")
    tests = JOB.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), os.environ.get("PYTHONPATH", "")])}
    output, returncode = run_in_session(
        [PYTHON, str(JOB), "prepare", str(work)], env=env, cwd=tests, limit=600
    )
    assert returncode == 0, output[-3000:]
    return work


@pytest.fixture(scope="module")
def straight(work: Path) -> dict[int, Path]:
    """The uninterrupted runs' output directories, on 1 and on 2 processes (0 workers)."""
    runs = {}
    for devices in (1, 2):
        out = work / f"straight{devices}"
        _run(work, out, 0, devices=devices)
        assert [len(batches) for batches in _trained(out, devices)] == [2 * BATCHES // devices] * devices
        runs[devices] = out
    return runs


def check_resume(
    work: Path, reference: Path, run: str, *, devices: int, kill_at: int, every: int, workers: int = 0,
    data: str = "shards",
) -> int:  # fmt: skip
    """Kill a run at the start of step ``kill_at`` (a checkpoint every ``every`` steps), resume it from
    ``last.ckpt``, and compare both runs with ``reference`` key for key and weight for weight; the batches
    retrained (per rank)."""
    out, options = work / run, ["--every", str(every), "--workers", str(workers), "--data", data]
    _run(work, out, kill_at, *options, devices=devices, killed=True)
    before = _trained(out, devices)
    assert [len(batches) for batches in before] == [kill_at - 1] * devices
    _run(work, out, 0, *options, devices=devices)
    saved = (kill_at - 1) // every * every
    expected = _trained(reference, devices)
    for rank, batches in enumerate(_trained(out, devices)):
        assert batches[:saved] + batches[kill_at - 1 :] == expected[rank]  # key for key, both epochs
    assert _same_weights(out, reference)
    return kill_at - 1 - saved


@needs_nemo
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_nemo_killed_mid_epoch_resumes_on_exactly_the_straight_runs_batches(
    work: Path, straight: dict[int, Path]
) -> None:
    # killed at the start of step 8: 7 trained, the last checkpoint after step 6
    retrained = check_resume(work, straight[1], "mid", devices=1, kill_at=8, every=3)
    print(f"\nNeMo + shardio: killed after 7 batches, retrained {retrained} on resume")
    assert retrained == 1


@needs_nemo
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_nemo_with_workers_killed_in_epoch_2_resumes_from_epoch_1s_last_batch(
    work: Path, straight: dict[int, Path]
) -> None:
    # checkpoints after steps 4, 8 (epoch 1's last batch): killed at the start of step 10, resumed at 8
    retrained = check_resume(work, straight[1], "across", devices=1, kill_at=10, every=4, workers=2)
    print(f"\nNeMo + shardio, 2 workers: killed at epoch 2's 2nd batch, retrained {retrained} on resume")
    assert retrained == 1


@needs_nemo
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_nemo_ddp_killed_mid_epoch_resumes_exactly_on_every_rank(
    work: Path, straight: dict[int, Path]
) -> None:
    # 2 ranks, 4 steps an epoch: checkpoint after step 2, killed at the start of step 4
    retrained = check_resume(work, straight[2], "ddp", devices=2, kill_at=4, every=2)
    assert retrained == 1


@needs_nemo
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_nemo_ddp_with_workers_killed_in_epoch_2_resumes_from_epoch_1s_last_batch(
    work: Path, straight: dict[int, Path]
) -> None:
    # checkpoints after steps 2, 4 (epoch 1's last batch): killed at the start of step 6, resumed at 4
    retrained = check_resume(work, straight[2], "ddp_across", devices=2, kill_at=6, every=2, workers=2)
    assert retrained == 1


@needs_nemo
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_nemo_killed_on_2_processes_resumes_on_1_with_each_sample_once(
    work: Path, straight: dict[int, Path]
) -> None:
    """Killed on 2 ranks at the start of step 4 (checkpoint after step 2) and resumed on 1: every utterance
    not trained before the checkpoint is trained once in the rest of the epoch (the last batch may repeat some
    to fill it), then epoch 2 is the 1-process run's epoch 2."""
    out = work / "elastic"
    _run(work, out, 4, "--every", "2", devices=2, killed=True)
    killed = _trained(out, 2)
    _run(work, out, 0, "--every", "2")
    resumed = _trained(out)[0][len(killed[0]) :]
    consumed = {key for batches in killed for batch in batches[:2] for key in batch.split()}
    assert resumed[-BATCHES:] == _trained(straight[1])[0][BATCHES:]
    rest = Counter(key for batch in resumed[:-BATCHES] for key in batch.split())
    everything = {f"utt{number:03d}" for number in range(UTTERANCES)}
    assert len(consumed) == 4 * BATCH and set(rest) == everything - consumed
    repeats = sum(rest.values()) - len(rest)
    assert repeats < BATCH
    print(
        f"\nNeMo + shardio, 2 -> 1 process: {len(consumed)} utterances trained before the checkpoint; the "
        f"rest of the epoch trained the {len(rest)} others once each ({repeats} repeats: last batch)"
    )


@needs_nemo
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_nemo_on_its_own_tarred_shards_killed_mid_epoch_resumes_exactly(work: Path) -> None:
    """NeMo's tarred dataset (4 ``audio_{n}.tar`` and their manifest, one file listed twice: its repeat a
    ``-sub1`` line) indexed in place: the straight run trains every manifest line once an epoch, and a run
    killed at step 5 and resumed from the checkpoint after step 3 trains exactly its batches."""
    reference = work / "tarred_straight"
    _run(work, reference, 0, "--data", "tarred")
    lines = (work / "tarred" / "tarred_audio_manifest.json").read_text().splitlines()
    (batches,) = _trained(reference)
    first_epoch = Counter(key for batch in batches[:BATCHES] for key in batch.split())
    assert len(lines) == UTTERANCES and len(first_epoch) == UTTERANCES and set(first_epoch.values()) == {1}
    assert sum(key.endswith("-sub1") for key in first_epoch) == 1
    retrained = check_resume(work, reference, "tarred", devices=1, kill_at=5, every=3, data="tarred")
    print(
        f"\nNeMo + shardio on NeMo's tarred shards: killed after 4 batches, retrained {retrained} on resume"
    )
    assert retrained == 1


@needs_nemo
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_nemo_without_the_callback_restarts_the_epochs_batches(work: Path) -> None:
    out = work / "plain"
    _run(work, out, 8, "--plain", killed=True)
    (before,) = _trained(out)
    _run(work, out, 0, "--plain")
    after = _trained(out)[0][len(before) :]
    epoch1 = after[:-BATCHES]  # Lightning counts the epoch as 6 batches done; the loader starts it again
    assert epoch1 and epoch1 == before[: len(epoch1)]
    print(
        f"\nNeMo, plain DataLoader: killed after {len(before)} batches, checkpoint after 6; resumed, the "
        f"epoch trained its first {len(epoch1)} batches again and ended: batches 7, 8 never reached the model"
    )
