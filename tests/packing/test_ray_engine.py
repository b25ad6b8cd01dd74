"""The Ray engine on a real local Ray cluster (loopback, 2 worker CPUs): a worker killed mid-task is retried
and the dataset is byte-identical to the local engine's ``-j 1``."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from audio_factory import make_folder_corpus

from shardio.packing.engines import pack_partitioned
from shardio.packing.partitions import PARTS_DIR

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")


def files(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _kill_a_busy_worker(out: Path, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the first Ray worker seen running a partition while that partition's attempt is on disk."""
    while not stop.is_set() and not killed:
        parts = out / PARTS_DIR
        if parts.is_dir() and any(p.name.startswith(".attempt-") for p in parts.iterdir()):
            for process in psutil.process_iter(["pid", "cmdline"]):
                if any("ray::pack_partition" in part for part in process.info["cmdline"] or ()):
                    os.kill(process.info["pid"], signal.SIGKILL)
                    killed.append(process.info["pid"])
                    return
        time.sleep(0.005)


@pytest.mark.slow
def test_ray_local_cluster_survives_a_killed_worker(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 60, seconds=(0.5, 1.5), sample_rate=16000, seed=5)
    options = dict(
        partition_bytes=200_000, samples_per_shard=5, compression="zstd", transcode="flac", progress=False
    )
    reference = tmp_path / "j1"
    pack_partitioned(corpus, reference, workers=1, **options)  # type: ignore[arg-type]
    out = tmp_path / "ray"
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_a_busy_worker, args=(out, stop, killed), daemon=True)
    killer.start()
    try:
        pack_partitioned(corpus, out, engine="ray", workers=2, **options)  # type: ignore[arg-type]
    finally:
        stop.set()
        killer.join()
    assert killed, "no Ray worker was seen running a partition"
    assert files(out) == files(reference)
