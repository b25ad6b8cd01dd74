"""Pack FLAC: ``shardio pack`` (each validation level) beside WebDataset's ``ShardWriter`` on the same files.

Run ``python benchmarks/pack_webdataset.py [--quick] [--corpus DIR ...]``. Corpora: the shared LJ Speech
FLAC clips (``--corpora``, default ``../shared/corpora``, when present), a generated FLAC corpus
(``shardio.synth``, 400 files of 2-16 s; 100 with ``--quick``) and any ``--corpus`` folder of ``.flac`` files
(LibriSpeech's ``train-clean-100``, say).
WebDataset is used as its README writes shards: read each file's bytes, ``ShardWriter.write`` them with a
``.json`` of the transcript beside them, 256 MB shards.

Two ways, each in alternated rounds (the order of the tools rotates every round; the page cache is warmed
first): *in-process* (both libraries imported first; ``pack()`` against the ``ShardWriter`` loop, wall and
CPU seconds of the process, threads included) and *as commands* (``shardio pack`` against a Python script
that does the WebDataset loop, interpreter and imports included; ``import webdataset`` imports torch). Each
figure: the median of the rounds (5; 3 with ``--quick``), with min and max. shardio fsyncs its shards and
writes an index; WebDataset does neither. Writes ``benchmarks/results/pack_webdataset.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import soundfile
from pack import corpus_figures  # benchmarks/ is the script's directory, first on sys.path

from shardio.bench.report import write_results
from shardio.packing.pack import default_workers, pack
from shardio.synth import make_corpus

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpora"
RESULTS = REPO / "benchmarks" / "results"
SHARD_BYTES = 256 * 10**6


def flac_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*.flac"))


def webdataset_pack(root: Path, out: Path) -> int:
    """The WebDataset way: each file's bytes and a JSON of its transcript, by ``ShardWriter``."""
    import webdataset

    out.mkdir(parents=True, exist_ok=True)
    count = 0
    with webdataset.ShardWriter(str(out / "shard-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
        for path in flac_files(root):
            transcript = path.with_suffix(".txt")
            meta = {"text": transcript.read_text().strip()} if transcript.exists() else {}
            key = path.relative_to(root).with_suffix("").as_posix()
            sink.write({"__key__": key, "flac": path.read_bytes(), "json": json.dumps(meta).encode()})
            count += 1
    return count


def corpora(work: Path, quick: bool, shared: Path, extra: list[Path]) -> list[dict[str, Any]]:
    found = []
    lj = shared / "ljspeech_coqui" / "wavs"
    if lj.is_dir():
        folder = work / "ljspeech-flac"
        folder.mkdir()
        for path in sorted(lj.glob("*.flac")):
            (folder / path.name).symlink_to(path)
        found.append(dict(name="ljspeech-flac", path=folder, about="real: LJ Speech FLAC clips, 22.05 kHz"))
    count = 100 if quick else 400
    synthetic = work / "synthetic-flac"
    make_corpus(synthetic, num_files=count, formats=("flac",), min_seconds=2.0, max_seconds=16.0)
    found.append(
        dict(name="synthetic-flac", path=synthetic, about=f"generated (shardio.synth): {count} FLAC, 2-16 s")
    )
    for path in extra:
        found.append(dict(name=path.name, path=path, about=f"given: {path}"))
    return found


def in_process_tools(out: Path) -> dict[str, Callable[[Path], object]]:
    return {
        "shardio structure -j 1": lambda root: pack(root, out, shard_bytes=SHARD_BYTES, progress=False),
        "shardio structure -j 2": lambda root: pack(
            root, out, shard_bytes=SHARD_BYTES, progress=False, workers=2
        ),
        "shardio decode -j 2": lambda root: pack(
            root, out, shard_bytes=SHARD_BYTES, validate="decode", progress=False, workers=2
        ),
        "webdataset": lambda root: webdataset_pack(root, out),
    }


def command_tools(out: Path) -> dict[str, list[str]]:
    shardio = [sys.executable, "-m", "shardio.cli", "pack", "--no-progress", "--shard-size", "256MB"]
    return {
        "shardio pack": [*shardio, "{root}", str(out)],
        "shardio pack --validate decode": [*shardio, "--validate", "decode", "{root}", str(out)],
        "webdataset script": [sys.executable, __file__, "--webdataset-writer", "{root}", str(out)],
    }


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(corpus: dict[str, Any], work: Path, rounds: int) -> dict[str, Any]:
    root: Path = corpus["path"]
    files = flac_files(root)
    figures = corpus_figures(corpus, files)
    input_bytes = figures["input_bytes"]
    out = work / "out"
    inline, commands = in_process_tools(out), command_tools(out)
    names = [*inline, *commands]
    walls: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    for number in range(rounds + 1):  # round 0 warms up, and is not counted
        turn = number % len(names)
        for name in names[turn:] + names[:turn]:
            shutil.rmtree(out, ignore_errors=True)
            start, cpu, child = time.perf_counter(), time.process_time(), children_cpu()
            if name in inline:
                inline[name](root)
            else:
                command = [str(root) if part == "{root}" else part for part in commands[name]]
                subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            spent = (time.process_time() - cpu) if name in inline else children_cpu() - child
            if number:
                walls[name].append(wall)
                cpus[name].append(spent)
    shutil.rmtree(out, ignore_errors=True)
    tools = {
        name: dict(
            wall=statistics.median(walls[name]),
            wall_min=min(walls[name]),
            wall_max=max(walls[name]),
            cpu=statistics.median(cpus[name]),
            mb_per_wall_s=input_bytes / 1e6 / statistics.median(walls[name]),
        )
        for name in names
    }
    ratios = {
        f"{name} / {base} (wall)": tools[name]["wall"] / tools[base]["wall"]
        for base, group in (("webdataset", inline), ("webdataset script", commands))
        for name in group
        if name != base
    }
    return dict(figures, tools=tools, ratios=ratios)


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Pack FLAC: shardio against WebDataset's ShardWriter",
        "",
        f"`python benchmarks/pack_webdataset.py{' --quick' if report['quick'] else ''}` on {report['date']}, "
        f"{report['machine']}; median (min-max) of {report['rounds']} alternated rounds.",
        "",
        "In-process: `shardio.packing.pack.pack()` against WebDataset's `ShardWriter` loop, both libraries "
        "imported first. As commands: `shardio pack` against a Python script doing that loop (start-up "
        "included; `import webdataset` imports torch). shardio's default `-j` here: "
        f"{report['default_workers']}. "
        "`structure` (the default) checks every FLAC frame's CRCs without decoding; `decode` decodes every "
        "file as well. shardio fsyncs its shards and writes an index; WebDataset does neither.",
        "",
    ]
    for corpus in report["corpora"]:
        lines += [
            f"## {corpus['name']}",
            "",
            f"{corpus['about']}; {corpus['files']} files, {corpus['input_bytes'] / 1e6:.1f} MB, "
            f"{corpus['hours']:.2f} h.",
            "",
            "| tool | wall s | CPU s | MB/s (wall) |",
            "|---|---:|---:|---:|",
        ]
        for tool, r in corpus["tools"].items():
            lines.append(
                f"| {tool} | {r['wall']:.3f} ({r['wall_min']:.3f}-{r['wall_max']:.3f}) | {r['cpu']:.3f} | "
                f"{r['mb_per_wall_s']:.1f} |"
            )
        lines += ["", *(f"- {name}: {value:.2f}" for name, value in corpus["ratios"].items()), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds and a smaller generated corpus")
    parser.add_argument("--corpus", type=Path, action="append", default=[], help="a folder of .flac files")
    parser.add_argument("--corpora", type=Path, default=SHARED, help="the shared corpora (../shared/corpora)")
    parser.add_argument("--webdataset-writer", nargs=2, metavar=("ROOT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.webdataset_writer:
        webdataset_pack(Path(args.webdataset_writer[0]), Path(args.webdataset_writer[1]))
        return
    import webdataset

    rounds = 3 if args.quick else 5
    with tempfile.TemporaryDirectory(prefix="shardio-bench-") as tmp:
        work = Path(tmp)
        measured = []
        for corpus in corpora(work, args.quick, args.corpora, [path.resolve() for path in args.corpus]):
            print(f"{corpus['name']}: {corpus['about']}", file=sys.stderr)
            measured.append(measure(corpus, work, rounds))
    report = dict(
        benchmark="pack_webdataset",
        quick=args.quick,
        rounds=rounds,
        date=time.strftime("%Y-%m-%d %H:%M"),
        default_workers=default_workers(),
        machine=f"{os.cpu_count()} cores, Python {platform.python_version()}, libsndfile "
        f"{soundfile.__libsndfile_version__}, webdataset {webdataset.__version__}, load average "
        f"{os.getloadavg()[0]:.1f} at the end",
        corpora=measured,
    )
    write_results(RESULTS, "pack_webdataset", report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
