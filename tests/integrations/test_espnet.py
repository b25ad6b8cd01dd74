"""ESPnet2's trainer fed by shardio (:mod:`shardio.integrations.espnet`): a real tiny ESPnet ASR training (its
``ASRTask``, ``Trainer``, preprocessor and collate function), killed with SIGKILL mid-epoch and resumed with
``--resume true``, compared with a straight run key for key; and what ESPnet alone does on the same kill.

ESPnet needs a torch/torchaudio pair of its own (installing it is several GB), so these tests run ESPnet's
Python given by ``SHARDIO_ESPNET_PYTHON`` (with shardio installed in it, editable: tests/README.md) and skip
without it. The figures: ``SHARDIO_ESPNET_PYTHON=... pytest -m slow tests/integrations/test_espnet.py -s``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

JOB = Path(__file__).resolve().parents[1] / "espnet_job.py"
PYTHON = os.environ.get("SHARDIO_ESPNET_PYTHON", "")
BATCHES = 8  # 24 utterances in batches of 3, an epoch
KILL_AT = 8  # killed before the forward of epoch 1's 8th batch: 7 trained
SAVE_EVERY = 3  # shardio's mid-epoch checkpoint after steps 3 and 6

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not PYTHON or not Path(PYTHON).exists(), reason="SHARDIO_ESPNET_PYTHON is not set"),
]


def _run(*args: str, killed: bool = False) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(JOB.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run([PYTHON, str(JOB), *args], env=env, capture_output=True, text=True, timeout=1200)
    if killed:
        assert result.returncode == -9, result.stderr[-3000:]
    else:
        assert result.returncode == 0, result.stderr[-3000:]


def _trained(out: Path) -> list[str]:
    return (out / "trained.txt").read_text().splitlines()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("espnet")
    _run("prepare", str(work))
    return work


def test_espnet_killed_mid_epoch_resumes_on_exactly_the_straight_runs_batches(work: Path) -> None:
    straight = work / "straight"
    _run("train", str(work), str(straight), "shardio", "0", str(SAVE_EVERY))
    expected = _trained(straight)
    assert len(expected) == 2 * BATCHES

    resumed = work / "resumed"
    _run("train", str(work), str(resumed), "shardio", str(KILL_AT), str(SAVE_EVERY), killed=True)
    before = _trained(resumed)
    assert len(before) == KILL_AT - 1 and (resumed / "shardio_checkpoint.pth").exists()
    assert not (resumed / "checkpoint.pth").exists()  # ESPnet's own: only at an epoch's end
    _run("train", str(work), str(resumed), "shardio", "0", str(SAVE_EVERY))
    after = _trained(resumed)[len(before) :]
    saved = (KILL_AT - 1) // SAVE_EVERY * SAVE_EVERY
    assert before[:saved] + after == expected  # key for key, both epochs
    final, reference = (torch.load(run / "2epoch.pth", weights_only=True) for run in (resumed, straight))
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[name], reference[name]) for name in final)  # the same model, bit for bit
    retrained = len(before) - saved
    print(f"\nshardio: killed after {len(before)} batches of epoch 1, retrained {retrained} on resume")
    assert retrained == (KILL_AT - 1) % SAVE_EVERY


def test_espnet_alone_retrains_the_interrupted_epoch_from_its_start(work: Path) -> None:
    out = work / "alone"
    _run("train", str(work), str(out), "espnet", str(KILL_AT), "0", killed=True)
    before = _trained(out)
    _run("train", str(work), str(out), "espnet", "0", "0")
    after = _trained(out)[len(before) :]
    assert len(after) == 2 * BATCHES  # epoch 1 again from its first batch, then epoch 2
    assert after[: len(before)] == before
    print(
        f"\nESPnet alone: killed after {len(before)} batches of epoch 1, "
        f"retrained all {len(before)} on resume"
    )
