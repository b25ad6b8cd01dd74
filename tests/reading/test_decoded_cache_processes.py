"""The decoded cache across real processes: two ranks of one node (each with DataLoader workers) fill and read
one cache at once, and a process that cannot write (a file-size limit: ``EFBIG``, as a full disk's
``ENOSPC``) warns and reads on; in every case each rank's batches are bit-identical to batches read without
the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.reading.test_decoded_cache import make_corpus

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "decoded_cache_job.py"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("dc_ranks"), "flac", count=26, rate=16000)


def _start(config: dict[str, Any]) -> subprocess.Popen[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, str(JOB), json.dumps(config)],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str], out: Path) -> tuple[list[Any], str]:
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr
    return json.loads(out.read_text()), stderr


def _run(tmp_path: Path, name: str, **config: Any) -> list[Any]:
    out = tmp_path / f"{name}.json"
    return _finish(_start({**config, "out": str(out)}), out)[0]


def test_two_ranks_of_a_node_share_the_cache(corpus: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    base = {"data": str(corpus), "world": 2, "epochs": 2, "workers": 2}
    expected = [_run(tmp_path, f"plain{rank}", **base, rank=rank, cache=None) for rank in range(2)]
    for attempt in range(2):  # the first fills the cache at once from two ranks, the second reads it
        outs = [tmp_path / f"rank{rank}-{attempt}.json" for rank in range(2)]
        started = [
            _start({**base, "rank": rank, "cache": str(cache), "out": str(outs[rank])}) for rank in range(2)
        ]
        for rank in range(2):
            assert _finish(started[rank], outs[rank])[0] == expected[rank]
    segments = [name for _, _, names in os.walk(cache) for name in names if name.endswith(".seg")]
    assert segments  # written by several processes, one segment each


def test_a_process_that_cannot_write_warns_and_reads_on(corpus: Path, tmp_path: Path) -> None:
    base = {"data": str(corpus), "world": 1, "rank": 0, "epochs": 2, "workers": 0}
    expected = _run(tmp_path, "plain", **base, cache=None)
    out = tmp_path / "limited.json"
    process = _start({**base, "cache": str(tmp_path / "cache"), "out": str(out), "fsize_limit": 4 << 20})
    found, stderr = _finish(process, out)
    assert found == expected
    assert "cannot write" in stderr and "reading on without caching" in stderr
