"""A NeMo tarred dataset read in place (``shardio index --nemo-manifest``) against packed into new shards
(``shardio pack tarred_audio_manifest.json``).

Run ``python benchmarks/nemo_index.py [--samples 2000] [--shards 8] [--runs 3]``. It writes a NeMo-style
dataset (``audio_{n}.tar`` of 16 kHz 16-bit WAVs of 0.5-1.5 s, one in 50 files listed again as a ``-sub1``
repeat, and ``tarred_audio_manifest.json``) into a temporary directory, then, round by round (the two ways
side by side in each round): indexes it in place and packs it (wall time, ``time.perf_counter``), and reads
one epoch of each with ``ShardDataset(batch_size=16)`` in this process. Reports the medians of ``--runs``
rounds and the disk each way adds. Writes ``benchmarks/results/nemo_index.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from shardio import ShardDataset
from shardio.bench.report import write_results
from shardio.integrations.importers.nemo_index import index_nemo
from shardio.packing.pack import pack

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def write_dataset(root: Path, samples: int, shards: int) -> None:
    """The NeMo-style dataset described in the module docstring."""
    rng = np.random.default_rng(0)
    lines = []
    for shard in range(shards):
        with tarfile.open(root / f"audio_{shard}.tar", "w") as archive:
            for number in range(shard, samples, shards):
                audio = rng.uniform(-0.3, 0.3, int(16000 * rng.uniform(0.5, 1.5))).astype(np.float32)
                buffer = io.BytesIO()
                sf.write(buffer, audio, 16000, format="WAV", subtype="PCM_16")
                info = tarfile.TarInfo(f"utt{number:06d}.wav")
                info.size = buffer.tell()
                archive.addfile(info, io.BytesIO(buffer.getvalue()))
                lines.append({"audio_filepath": info.name, "shard_id": shard, "text": f"text {number}"})
                if number % 50 == 0:
                    lines.append(
                        {"audio_filepath": f"utt{number:06d}-sub1.wav", "shard_id": shard, "text": "again"}
                    )
    (root / "tarred_audio_manifest.json").write_text("".join(json.dumps(line) + "\n" for line in lines))


def epoch(directory: Path) -> int:
    """Samples read in one epoch of the dataset at ``directory``."""
    return sum(len(batch["keys"]) for batch in ShardDataset(directory, batch_size=16, seed=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {
        "index_in_place": [],
        "pack_copy": [],
        "epoch_in_place": [],
        "epoch_packed": [],
    }
    with tempfile.TemporaryDirectory() as scratch:
        source, packed = Path(scratch) / "nemo", Path(scratch) / "packed"
        source.mkdir()
        write_dataset(source, args.samples, args.shards)
        for _ in range(args.runs):
            for name in ("index.json", "index.columns"):
                (source / name).unlink(missing_ok=True)
            shutil.rmtree(packed, ignore_errors=True)
            start = time.perf_counter()
            index = index_nemo(source)
            times["index_in_place"].append(time.perf_counter() - start)
            start = time.perf_counter()
            pack(source / "tarred_audio_manifest.json", packed, progress=False)
            times["pack_copy"].append(time.perf_counter() - start)
            for label, directory in (("epoch_in_place", source), ("epoch_packed", packed)):
                start = time.perf_counter()
                epoch(directory)
                times[label].append(time.perf_counter() - start)
        added = {
            "in_place": sum((source / n).stat().st_size for n in ("index.json", "index.columns")),
            "packed": sum(p.stat().st_size for p in packed.iterdir()),
        }
        tars = sum(p.stat().st_size for p in source.glob("audio_*.tar"))
    report: dict[str, Any] = {
        "command": f"python benchmarks/nemo_index.py --samples {args.samples} --shards {args.shards} "
        f"--runs {args.runs}",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_average": list(os.getloadavg()),
        },
        "samples": len(index),
        "tar_bytes": tars,
        "added_bytes": added,
        "median_s": {name: round(statistics.median(values), 4) for name, values in times.items()},
        "runs_s": {name: [round(v, 4) for v in values] for name, values in times.items()},
    }
    med = report["median_s"]
    text = "\n".join(
        [
            "# NeMo tarred dataset: indexed in place vs packed",
            "",
            f"`{report['command']}` on {report['machine']['cpu']} ({report['machine']['cores']} cores, load "
            f"average {report['machine']['load_average'][0]:.1f}: a shared machine; medians of {args.runs} "
            "rounds, the two ways side by side in each round).",
            "",
            f"{report['samples']} samples ({args.samples} files + repeats) in {args.shards} tars, "
            f"{tars / 1e6:.1f} MB.",
            "",
            "| | in place (`shardio index --nemo-manifest`) | packed (`shardio pack manifest`) |",
            "|---|---|---|",
            f"| build (s) | {med['index_in_place']:.3f} | {med['pack_copy']:.3f} |",
            f"| one epoch, batch 16, in process (s) | {med['epoch_in_place']:.3f} | "
            f"{med['epoch_packed']:.3f} |",
            f"| disk added (MB) | {added['in_place'] / 1e6:.3f} | {added['packed'] / 1e6:.1f} |",
            "",
        ]
    )
    write_results(RESULTS, "nemo_index", report, text)
    print(text)


if __name__ == "__main__":
    main()
