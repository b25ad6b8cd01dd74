"""Pack throughput: ``shardio.packing.pack`` (none and zstd) beside plain ``tar`` and
``tar | zstd`` over the same files.

Run ``python benchmarks/pack.py [--quick]``. Uses the shared real corpora (``../shared/corpora``: fsdd and
asterisk are WAV, LJ Speech has FLAC and MP3) when present, else a generated speech-like corpus
(``shardio.synth``), and says which. Every figure is the median of 3 runs (1 with ``--quick``) with min and
max; the page cache is warmed first. ``shardio`` runs in-process (no interpreter start-up) and, unlike
``tar``, decodes every file to validate it and fsyncs each shard. Writes ``benchmarks/results/pack.json`` and
``benchmarks/results/pack.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import soundfile

from shardio.bench.report import write_results
from shardio.packing.corpus import read_corpus
from shardio.packing.pack import pack
from shardio.synth import make_corpus

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpora"
RESULTS = REPO / "benchmarks" / "results"
TOOLS = (
    "shardio none",
    "tar",
    "shardio zstd",
    "tar | zstd",
    "shardio zstd -j 2",
    "shardio flac",
    "shardio flac -j 2",
)


def corpora(work: Path, quick: bool, shared: Path = SHARED) -> list[dict[str, Any]]:
    """The corpora to pack: name, input path, and a description saying whether it is real or generated."""
    if shared.is_dir():
        found = [
            dict(name="fsdd", path=shared / "fsdd", about="real: FSDD, 3000 WAV PCM16 8 kHz, 0.14-2.3 s"),
            dict(
                name="asterisk",
                path=shared / "asterisk_core_sounds_en",
                about="real: Asterisk prompts, 568 WAV PCM16 8 kHz, 0.2-73 s",
            ),
        ]
        for ext in ("flac", "mp3"):  # the LJ Speech folder holds each clip three times: link one format
            folder = work / f"ljspeech-{ext}"
            folder.mkdir()
            for path in sorted((shared / "ljspeech_coqui" / "wavs").glob(f"*.{ext}")):
                (folder / path.name).symlink_to(path)
            found.append(
                dict(
                    name=f"ljspeech-{ext}",
                    path=folder,
                    about=f"real: LJ Speech, 32 {ext.upper()} 22.05 kHz, 1.1-10 s",
                )
            )
        return found
    count = 200 if quick else 1000
    made = []
    for ext in ("wav", "flac"):
        make_corpus(
            work / f"synthetic-{ext}", num_files=count, formats=(ext,), min_seconds=1.0, max_seconds=5.0
        )
        made.append(
            dict(
                name=f"synthetic-{ext}",
                path=work / f"synthetic-{ext}",
                about=f"generated (shardio.synth): {count} {ext.upper()} 16 kHz, 1-5 s",
            )
        )
    return made


def timed(action: Any) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def shell(command: str) -> None:
    subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL)


def corpus_figures(corpus: dict[str, Any], files: list[Path]) -> dict[str, Any]:
    """The corpus's name, description, number of files, bytes and hours of audio; every file is read once
    first, to warm the page cache, so that no tool pays for the first read."""
    for path in files:
        path.read_bytes()
    return dict(
        name=corpus["name"],
        about=corpus["about"],
        files=len(files),
        input_bytes=sum(path.stat().st_size for path in files),
        hours=sum(soundfile.info(str(path)).duration for path in files) / 3600,
    )


def measure(corpus: dict[str, Any], work: Path, runs: int) -> dict[str, Any]:
    root: Path = corpus["path"]
    files = [Path(s.audio_path) for s in read_corpus(root)]
    listing = work / f"{corpus['name']}.list"
    listing.write_text("\n".join(p.relative_to(root).as_posix() for p in files) + "\n")
    figures = corpus_figures(corpus, files)
    input_bytes = figures["input_bytes"]
    out = work / "out"
    tar = f"tar -c -h -C '{root}' -T '{listing}'"
    actions = {
        "shardio none": lambda: pack(root, out, compression="none", progress=False),
        "shardio zstd": lambda: pack(root, out, compression="zstd", zstd_level=3, progress=False),
        "shardio zstd -j 2": lambda: pack(
            root, out, compression="zstd", zstd_level=3, progress=False, workers=2
        ),
        "shardio flac": lambda: pack(root, out, transcode="flac", progress=False),
        "shardio flac -j 2": lambda: pack(root, out, transcode="flac", progress=False, workers=2),
        "tar": lambda: shell(f"{tar} -f '{out}/all.tar'"),
        "tar | zstd": lambda: shell(f"{tar} | zstd -3 -T1 -q -o '{out}/all.tar.zst'"),
    }
    results: dict[str, Any] = {}
    for tool in TOOLS:
        seconds, size = [], 0
        for _ in range(runs):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            seconds.append(timed(actions[tool]))
            size = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith(("shard-", "all.")))
        median = statistics.median(seconds)
        results[tool] = dict(
            seconds=median,
            min=min(seconds),
            max=max(seconds),
            runs=len(seconds),
            mb_per_s=input_bytes / 1e6 / median,
            files_per_s=len(files) / median,
            output_bytes=size,
            size_ratio=size / input_bytes,
        )
    shutil.rmtree(out, ignore_errors=True)
    ratios = {
        "shardio none / tar (speed)": results["shardio none"]["mb_per_s"] / results["tar"]["mb_per_s"],
        "shardio zstd / tar | zstd (speed)": results["shardio zstd"]["mb_per_s"]
        / results["tar | zstd"]["mb_per_s"],
        "shardio zstd / tar | zstd (size)": results["shardio zstd"]["output_bytes"]
        / results["tar | zstd"]["output_bytes"],
        "shardio zstd -j 2 / -j 1 (speed)": results["shardio zstd"]["seconds"]
        / results["shardio zstd -j 2"]["seconds"],
        "shardio flac -j 2 / -j 1 (speed)": results["shardio flac"]["seconds"]
        / results["shardio flac -j 2"]["seconds"],
    }
    return dict(figures, tools=results, ratios=ratios)


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Pack throughput",
        "",
        f"`python benchmarks/pack.py{' --quick' if report['quick'] else ''}` on {report['machine']}; "
        f"{report['runs']} run(s) per figure: median (min-max). Corpora: {report['source']}.",
        "",
        "shardio runs in-process and decodes every input to validate it, and fsyncs each shard; tar only "
        "copies bytes. zstd is level 3, one thread, for both; shardio writes one zstd frame per ~64 KiB of "
        "samples (seekable), `tar | zstd` one stream. `shardio flac` transcodes every input to FLAC "
        "(`.tar`); `-j 2` adds a second worker thread (the writing thread reads inputs too with `-j 1`).",
        "",
    ]
    for corpus in report["corpora"]:
        lines += [
            f"## {corpus['name']}",
            "",
            f"{corpus['about']}; {corpus['files']} files, {corpus['input_bytes'] / 1e6:.1f} MB, "
            f"{corpus['hours']:.2f} h.",
            "",
            "| tool | seconds | MB/s | files/s | output MB | output / input |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for tool, r in corpus["tools"].items():
            lines.append(
                f"| {tool.replace('|', '&#124;')} | {r['seconds']:.3f} ({r['min']:.3f}-{r['max']:.3f}) | "
                f"{r['mb_per_s']:.1f} | {r['files_per_s']:.0f} | {r['output_bytes'] / 1e6:.2f} | "
                f"{r['size_ratio']:.3f} |"
            )
        lines += [""] + [
            f"- {name.replace('|', '&#124;')}: {value:.2f}" for name, value in corpus["ratios"].items()
        ]
        lines += [""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="one run per figure (and a smaller generated corpus)"
    )
    parser.add_argument(
        "--corpora",
        type=Path,
        default=SHARED,
        help="the shared corpora folder (default: ../shared/corpora next to the repository)",
    )
    args = parser.parse_args()
    if not (shutil.which("tar") and shutil.which("zstd")):
        sys.exit("this benchmark needs the tar and zstd command-line tools")
    runs = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="shardio-bench-") as tmp:
        work = Path(tmp)
        chosen = corpora(work, args.quick, args.corpora.resolve())
        measured = []
        for corpus in chosen:
            print(f"{corpus['name']}: {corpus['about']}", file=sys.stderr)
            measured.append(measure(corpus, work, runs))
    zstd_version = subprocess.run(["zstd", "--version"], capture_output=True, text=True).stdout.strip()
    report = dict(
        benchmark="pack",
        quick=args.quick,
        runs=runs,
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        source="shared real corpora" if args.corpora.is_dir() else "generated (shared corpora absent)",
        machine=f"{os.cpu_count()} cores, Python {platform.python_version()}, libsndfile "
        f"{soundfile.__libsndfile_version__}, {zstd_version.split(',')[0].strip('* ')}, "
        f"load average {os.getloadavg()[0]:.1f} at the end",
        corpora=measured,
    )
    write_results(RESULTS, "pack", report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
