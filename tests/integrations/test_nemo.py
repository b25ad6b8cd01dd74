"""A NeMo ASR model (``EncDecCTCModel``) trained by Lightning on shardio batches (:func:`nemo_batch`, with
``ShardioCallback``), killed with SIGKILL mid-epoch and resumed from its Lightning checkpoint, compared with a
straight run key for key and weight for weight; and the same run without the callback.

NeMo runs in an environment of its own (NeMo 3.0 with torch 2.13 CPU: tests/README.md), named by
``SHARDIO_NEMO_PYTHON``; without it these tests skip. The figures: ``SHARDIO_NEMO_PYTHON=... pytest -m slow
tests/integrations/test_nemo.py -s``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from shardio.errors import OptionError
from shardio.integrations.nemo import nemo_batch

JOB = Path(__file__).resolve().parents[1] / "nemo_job.py"
PYTHON = os.environ.get("SHARDIO_NEMO_PYTHON", "")
BATCHES = 8  # 24 utterances in batches of 3, an epoch
KILL_AT = 8  # killed at the start of step 8: 7 trained, the last checkpoint after step 6
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


def _run(*args: str, killed: bool = False) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(JOB.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run([PYTHON, str(JOB), *args], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == (-9 if killed else 0), result.stderr[-3000:]


def _trained(out: Path) -> list[str]:
    return (out / "trained.txt").read_text().splitlines()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("nemo")
    _run("prepare", str(work))
    return work


@needs_nemo
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_nemo_killed_mid_epoch_resumes_on_exactly_the_straight_runs_batches(work: Path) -> None:
    straight, resumed = work / "straight", work / "resumed"
    _run("train", str(work), str(straight), "0")
    expected = _trained(straight)
    assert len(expected) == 2 * BATCHES
    _run("train", str(work), str(resumed), str(KILL_AT), killed=True)
    before = _trained(resumed)
    assert len(before) == KILL_AT - 1
    _run("train", str(work), str(resumed), "0")
    after = _trained(resumed)[len(before) :]
    assert before[:6] + after == expected  # the checkpoint after step 6: step 7 trained again, then the rest
    final, reference = (torch.load(run / "final.pt", weights_only=True) for run in (resumed, straight))
    assert all(torch.equal(final[name], reference[name]) for name in reference)
    print(f"\nNeMo + shardio: killed after {len(before)} batches, retrained {len(before) - 6} on resume")


@needs_nemo
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_nemo_without_the_callback_restarts_the_epochs_batches(work: Path) -> None:
    out = work / "plain"
    _run("train", str(work), str(out), str(KILL_AT), "plain", killed=True)
    before = _trained(out)
    _run("train", str(work), str(out), "0", "plain")
    after = _trained(out)[len(before) :]
    epoch1 = after[:-BATCHES]  # Lightning counts the epoch as 6 batches done; the loader starts it again
    assert epoch1 and epoch1 == before[: len(epoch1)]
    print(
        f"\nNeMo, plain DataLoader: killed after {len(before)} batches, checkpoint after 6; resumed, the "
        f"epoch trained its first {len(epoch1)} batches again and ended: batches 7, 8 never reached the model"
    )
