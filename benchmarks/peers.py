"""shardio beside its peers on the same files: WebDataset, Lhotse (Shar), LitData and MosaicML Streaming, each
used as its README writes and reads a dataset: pack time and size; read throughput per CPU-second and per
wall-second (every sample decoded to float32, batches padded to their longest) in batches of 16 and by
duration (<= 60 s, or the longest sample rounded up to 10 s), with 0 and 2 DataLoader workers, FLAC and WAV,
and the time to the first batch; each peer's exact resume (its own mechanism), in one process and after a
SIGKILL, and its batches per rank at world 2 and 8 (benchmarks/peer_reading.py, peer_report.py, peer_kill.py
and peer_streaming.py).

Run ``python benchmarks/peers.py [--quick] [--corpus DIR]`` in an environment holding every peer (LitData's
and MosaicML Streaming's requirements name torchvision, whose CPU build for the project's torch is not on
PyPI; docs/benchmarks/peers.md says how such an environment is made). A peer that does not import is listed
as absent. Corpus: ``--corpus`` (a folder of ``.flac`` or ``.wav``), else the shared LJ Speech clips (FLAC and
WAV), else generated FLAC (``shardio.synth``). Each figure: the median of alternated rounds (3; 1 with
``--quick``) after one warm-up round. Writes ``benchmarks/results/peers.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peer_reading
import peer_report
import soundfile
from peer_corpus import (
    BATCH,
    batches_of,
    corpus_folders,
    cpu_seconds,
    decode,
    decode_floor,
    flac_files,
    text_of,
)
from peer_streaming import streaming_pack, streaming_read

from shardio.bench.report import write_results

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpora"
RESULTS = REPO / "benchmarks" / "results"
LOAD_EVERY = 30.0


# -- each peer: pack(root, out) and read(out) -> samples read ---------------------------------------------


def shardio_pack(root: Path, out: Path) -> None:
    from shardio.packing.pack import default_workers, pack

    pack(root, out, progress=False, workers=default_workers())


def shardio_read(out: Path) -> int:
    from shardio import ShardDataset

    return sum(len(batch["keys"]) for batch in ShardDataset(out, batch_size=BATCH, shuffle=False))


def webdataset_pack(root: Path, out: Path) -> None:
    import webdataset

    out.mkdir(parents=True, exist_ok=True)
    with webdataset.ShardWriter(str(out / "shard-%06d.tar"), maxsize=256 * 10**6, verbose=0) as sink:
        for path in flac_files(root):
            key = path.relative_to(root).with_suffix("").as_posix()
            meta = json.dumps({"text": text_of(path)}).encode()
            sink.write({"__key__": key, path.suffix[1:]: path.read_bytes(), "json": meta})


def webdataset_read(out: Path) -> int:
    import webdataset

    urls = [str(path) for path in sorted(out.glob("shard-*.tar"))]
    dataset = webdataset.WebDataset(urls, shardshuffle=False).map(
        lambda sample: decode(sample.get("flac") or sample["wav"])
    )
    return sum(len(batch) for batch in batches_of(dataset))


def lhotse_pack(root: Path, out: Path) -> None:
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    recordings = RecordingSet.from_recordings(
        Recording.from_file(path, recording_id=path.relative_to(root).with_suffix("").as_posix())
        for path in flac_files(root)
    )
    supervisions = SupervisionSet.from_segments(
        SupervisionSegment(
            id=r.id, recording_id=r.id, start=0, duration=r.duration, text=text_of(root / f"{r.id}.flac")
        )
        for r in recordings
    )
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
    out.mkdir(parents=True, exist_ok=True)
    cuts.to_shar(out, fields={"recording": flac_files(root)[0].suffix[1:]}, shard_size=1000)


def lhotse_read(out: Path) -> int:
    from lhotse import CutSet
    from lhotse.dataset import SimpleCutSampler
    from lhotse.dataset.collation import collate_audio

    cuts = CutSet.from_shar(in_dir=out)
    return sum(len(collate_audio(batch)[0]) for batch in SimpleCutSampler(cuts, max_cuts=BATCH))


def litdata_item(where: tuple[str, str]) -> dict[str, Any]:
    """One sample as LitData's ``optimize`` stores it, keyed by its path in the corpus as the other peers key
    it (``digits/1``: file names repeat between folders); a module's function: its workers are spawned."""
    root, path = Path(where[0]), Path(where[1])
    return {
        "key": path.relative_to(root).with_suffix("").as_posix(),
        "audio": path.read_bytes(),
        "text": text_of(path),
    }


def litdata_pack(root: Path, out: Path) -> None:
    import litdata

    litdata.optimize(
        fn=litdata_item,
        inputs=[(str(root), str(p)) for p in flac_files(root)],
        output_dir=str(out),
        chunk_bytes="64MB",
        num_workers=1,
    )
    multiprocessing.set_start_method("fork", force=True)  # optimize leaves spawn set for every later pool


def litdata_read(out: Path) -> int:
    import litdata

    dataset = litdata.StreamingDataset(f"local:{out}")
    return sum(len(batch) for batch in batches_of(decode(item["audio"]) for item in dataset))


PEERS: dict[str, tuple[str, Callable[[Path, Path], None], Callable[[Path], int]]] = {
    "shardio": ("shardio", shardio_pack, shardio_read),
    "WebDataset": ("webdataset", webdataset_pack, webdataset_read),
    "Lhotse Shar": ("lhotse", lhotse_pack, lhotse_read),
    "LitData": ("litdata", litdata_pack, litdata_read),
    "MosaicML Streaming": (
        "streaming",
        lambda root, out: streaming_pack(root, out, flac_files(root), text_of),
        streaming_read,
    ),
}


def version(module: str) -> str | None:
    try:
        return str(getattr(__import__(module), "__version__", "?"))
    except ImportError:
        return None


def timed(action: Callable[[], object]) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = action()
    return time.perf_counter() - wall, cpu_seconds() - cpu, result


def sample_load(loads: list[float], stop: threading.Event) -> None:
    """Append the machine's 1-minute load average to ``loads`` every :data:`LOAD_EVERY` seconds until
    ``stop``, and once at the start and once at the end."""
    loads.append(os.getloadavg()[0])
    while not stop.wait(LOAD_EVERY):
        loads.append(os.getloadavg()[0])
    loads.append(os.getloadavg()[0])


def measure(root: Path, work: Path, rounds: int) -> dict[str, Any]:
    present = {name: peer for name, peer in PEERS.items() if version(peer[0]) is not None}
    files = flac_files(root)
    for path in files:
        path.read_bytes()
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in present}
    sizes: dict[str, int] = {}
    names = list(present)
    for number in range(rounds + 1):  # round 0 warms up
        for name in names[number % len(names) :] + names[: number % len(names)]:
            _, pack, read = present[name]
            out = work / name.replace(" ", "_")
            shutil.rmtree(out, ignore_errors=True)
            pack_wall, pack_cpu, _ = timed(lambda pack=pack, out=out: pack(root, out))  # type: ignore[misc]
            read_wall, read_cpu, samples = timed(lambda read=read, out=out: read(out))  # type: ignore[misc]
            assert samples == len(files), (name, samples, len(files))
            sizes[name] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            if number:
                for key, value in (
                    ("pack_wall", pack_wall),
                    ("pack_cpu", pack_cpu),
                    ("read_wall", read_wall),
                    ("read_cpu", read_cpu),
                ):
                    figures[name].setdefault(key, []).append(value)
    return {
        name: {
            **{key: statistics.median(values) for key, values in figures[name].items()},
            "samples_per_cpu_s": len(files) / statistics.median(figures[name]["read_cpu"]),
            "samples_per_wall_s": len(files) / statistics.median(figures[name]["read_wall"]),
            "output_mb": sizes[name] / 1e6,
        }
        for name in present
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# shardio and its peers",
        "",
        f"`{report['command']}` on {report['date']}, "
        f"{report['machine']}; {report['corpus']}; medians of {report['rounds']} alternated rounds.",
        "",
    ]
    for fmt, peers in report["packs"].items():
        lines += [
            f"### Packing {fmt}, then reading it in batches of 16 with 0 workers",
            "",
            "| peer | version | pack wall s | pack CPU s | output MB | read per CPU-s | read per wall-s |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for name, r in peers.items():
            lines.append(
                f"| {name} | {report['versions'][name]} | {r['pack_wall']:.2f} | {r['pack_cpu']:.2f} | "
                f"{r['output_mb']:.1f} | {r['samples_per_cpu_s']:.0f} | {r['samples_per_wall_s']:.0f} |"
            )
        lines.append("")
    lines += peer_report.markdown(report)
    absent = [name for name, v in report["versions"].items() if v is None]
    if absent:
        lines += [f"Absent (not importable here): {', '.join(absent)}.", ""]
    lines.append(f"![samples per CPU-second]({report['name']}.png)")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="one round (the generated corpus, when it is used, is smaller)"
    )
    parser.add_argument("--corpus", type=Path, default=None, help="a folder of .flac or .wav files")
    parser.add_argument(
        "--flac-copy",
        action="store_true",
        help="with a --corpus of WAV: measure a lossless FLAC copy of it too (made with soundfile)",
    )
    parser.add_argument(
        "--tile",
        type=int,
        default=1,
        help="without --corpus: the LJ Speech clips this many times over (a larger corpus of the same clips)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="alternated rounds (default 3; --quick 1)")
    parser.add_argument("--corpora", type=Path, default=SHARED, help="the shared corpora (../shared/corpora)")
    parser.add_argument(
        "--name", default="peers", help="the results' name: benchmarks/results/NAME.{json,md,png}"
    )
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    packs: dict[str, Any] = {}
    floors: dict[str, Any] = {}
    outs: dict[str, dict[str, Path]] = {}
    loads: list[float] = []
    sampling = threading.Event()
    sampler = threading.Thread(target=sample_load, args=(loads, sampling), daemon=True)
    sampler.start()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shardio-peers-") as tmp:
        work = Path(tmp)
        abouts = []
        for fmt, (root, about) in corpus_folders(args, work).items():
            files = flac_files(root)
            durations = [soundfile.info(str(p)).duration for p in files]
            hours, longest = sum(durations) / 3600, max(durations)
            abouts.append(f"{about}, {len(files)} files, {hours:.2f} h")
            print(abouts[-1], file=sys.stderr)
            packs[fmt] = measure(root, work / "out" / fmt, rounds)
            floors[fmt] = decode_floor(root, rounds)
            outs[fmt] = {name: work / "out" / fmt / name.replace(" ", "_") for name in packs[fmt]}
        lj = args.corpora / "ljspeech_coqui" / "wavs"
        if args.corpus is not None and lj.is_dir():  # the decoders at another rate and length, for comparison
            for fmt in ("flac", "wav"):
                clips = work / f"ljspeech-{fmt}"
                clips.mkdir()
                for path in sorted(lj.glob(f"*.{fmt}")):
                    (clips / path.name).symlink_to(path)
                floors[f"{fmt.upper()}, LJ Speech clips"] = decode_floor(clips, rounds)
        # shardio leaves a sample longer than max_duration out of its plan: every sample must fit a batch
        peer_reading.MAX_SECONDS = max(60.0, 10.0 * math.ceil(longest / 10.0))
        reads = peer_report.read_figures(outs, len(files), rounds)
        traits = peer_report.traits(next(iter(outs.values())), len(files))
    sampling.set()
    sampler.join()
    report = dict(
        benchmark="peers",
        name=args.name,
        command=" ".join(["python benchmarks/peers.py", *sys.argv[1:]]),
        quick=args.quick,
        rounds=rounds,
        date=time.strftime("%Y-%m-%d %H:%M"),
        corpus="; ".join(abouts),
        machine=f"{os.cpu_count()} cores, Python {platform.python_version()}, load average (1 min) "
        f"{min(loads):.1f}-{max(loads):.1f}, median {statistics.median(loads):.1f}, sampled every "
        f"{LOAD_EVERY:.0f} s over the {(time.perf_counter() - started) / 60:.0f} minutes of the run",
        loads=loads,
        versions={name: version(module) for name, (module, _, _) in PEERS.items()},
        packs=packs,
        floors=floors,
        max_seconds=peer_reading.MAX_SECONDS,
        reads=reads,
        traits=traits,
    )
    write_results(RESULTS, args.name, report, markdown(report))
    peer_report.plot(report, RESULTS / f"{args.name}.png")
    print(markdown(report))


if __name__ == "__main__":
    main()
