"""The docs' training loop (docs/guides/checkpoint-resume.md), SIGKILLed and resumed: the same batches."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sample_shards import make_uneven_dataset

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "train_example.py"


def _train(dataset: Path, checkpoint: Path, log: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        str(SCRIPT),
        str(dataset),
        "--checkpoint",
        str(checkpoint),
        "--keys-log",
        str(log),
        "--epochs",
        "2",
        "--every",
        "4",
        "--workers",
        "2",
        "--max-duration",
        "2.0",
        *extra,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=240)


def _steps(log: Path) -> dict[int, list[str]]:
    lines = [line.split() for line in log.read_text().splitlines()]
    return {int(parts[0]): parts[1:] for parts in lines}


@pytest.mark.slow
def test_killed_training_resumes_onto_the_same_batches(tmp_path: Path) -> None:
    dataset = tmp_path / "data"
    make_uneven_dataset(dataset, [3, 40, 7, 1, 22], seed=4, compression="zstd")

    straight = _train(dataset, tmp_path / "straight.pt", tmp_path / "straight.log")
    assert straight.returncode == 0, straight.stderr
    expected = _steps(tmp_path / "straight.log")
    assert len(expected) > 15

    killed = _train(dataset, tmp_path / "run.pt", tmp_path / "run.log", "--die-at-step", "14")
    assert killed.returncode == -signal.SIGKILL
    before = _steps(tmp_path / "run.log")
    assert max(before) == 14

    resumed = _train(dataset, tmp_path / "run.pt", tmp_path / "after.log")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at step 12" in resumed.stdout  # the last checkpoint before the kill
    after = _steps(tmp_path / "after.log")
    assert min(after) == 13
    # steps 13-14 were trained twice (after the checkpoint, before the kill): exactly as a real job does
    combined = {**{s: k for s, k in before.items() if s <= 12}, **after}
    assert combined == expected
