"""What ``shardio verify`` costs, and what its structure checks add (docs/guides/packing.md, "What each level
catches"): CPU seconds of ``verify_dataset`` without ``decode`` (hashes, tar members, the structure checks of
every audio member), the same with the structure checks left out (what verify did before them: hashes and tar
members only), and with ``decode=True``; on a corpus packed as FLAC and as WAV.

Run ``python benchmarks/verify.py [--corpus DIR] [--rounds 5]``. Corpus: ``--corpus`` (a folder of WAV), else
the shared Asterisk prompts (``../shared/corpora/asterisk_core_sounds_en``, 568 WAV at 8 kHz), else generated
WAV (``shardio.synth``); the FLAC is a lossless copy made with soundfile. Each figure: the median of
alternated rounds after a warm-up. Writes ``benchmarks/results/verify.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import soundfile

import shardio.packing.verification as verification
from shardio.bench.report import write_results
from shardio.packing.pack import pack
from shardio.synth import make_corpus

REPO = Path(__file__).resolve().parents[1]
ASTERISK = REPO.parent / "shared" / "corpora" / "asterisk_core_sounds_en"
CASES = ("hashes and members only", "with the structure checks", "with --decode")


def flac_copy(root: Path, out: Path) -> None:
    for path in sorted(root.rglob("*.wav")):
        audio, rate = soundfile.read(str(path), dtype="int16")
        target = out / path.relative_to(root).with_suffix(".flac")
        target.parent.mkdir(parents=True, exist_ok=True)
        soundfile.write(str(target), audio, rate, subtype="PCM_16")


def verify_cpu(dataset: Path, case: str) -> float:
    """CPU seconds of one verify of ``dataset``; "hashes and members only" stubs the structure checks out."""
    real = verification.structure_facts
    if case == CASES[0]:
        verification.structure_facts = lambda data, ext: None  # type: ignore[assignment]
    try:
        cpu = time.process_time()
        assert verification.verify_dataset(dataset, decode=case == CASES[2], progress=False) == []
        return time.process_time() - cpu
    finally:
        verification.structure_facts = real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=None, help="a folder of WAV files")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shardio-verify-") as tmp:
        work = Path(tmp)
        root = args.corpus or (ASTERISK if ASTERISK.is_dir() else None)
        if root is None:
            root = work / "synth"
            make_corpus(root, num_files=300, formats=("wav",), min_seconds=1.0, max_seconds=8.0)
        about = args.corpus.name if args.corpus else root.name
        flac_copy(root, work / "flac")
        datasets = {"FLAC": work / "ds-flac", "WAV": work / "ds-wav"}
        pack(work / "flac", datasets["FLAC"], progress=False)
        pack(root, datasets["WAV"], progress=False)
        files = sorted(root.rglob("*.wav"))
        hours = sum(soundfile.info(str(path)).duration for path in files) / 3600
        runs = [(fmt, case) for fmt in datasets for case in CASES]
        times: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
        for number in range(args.rounds + 1):  # round 0 warms up
            turn = number % len(runs)
            for fmt, case in runs[turn:] + runs[:turn]:
                cpu = verify_cpu(datasets[fmt], case)
                if number:
                    times[fmt, case].append(cpu)
    report: dict[str, Any] = dict(
        benchmark="verify",
        date=time.strftime("%Y-%m-%d %H:%M"),
        corpus=f"{about}: {len(files)} files, {hours:.2f} h",
        machine=f"{os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{os.getloadavg()[0]:.1f} at the end",
        rounds=args.rounds,
        cpu_s={fmt: {case: statistics.median(times[fmt, case]) for case in CASES} for fmt in datasets},
    )
    lines = [
        "# What verify costs",
        "",
        f"`python benchmarks/verify.py` on {report['date']}, {report['machine']}; {report['corpus']}; CPU "
        f"seconds of one verify, medians of {args.rounds} alternated rounds.",
        "",
        f"| packed as | {' | '.join(CASES)} |",
        f"|---|{'---:|' * len(CASES)}",
    ]
    for fmt, row in report["cpu_s"].items():
        lines.append(f"| {fmt} | {' | '.join(f'{row[case]:.3f}' for case in CASES)} |")
    write_results(REPO / "benchmarks" / "results", "verify", report, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
