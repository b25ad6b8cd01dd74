"""The decoded cache (``Reading(decoded_cache=DIR)``): FLAC read from the cache against the same audio packed
as WAV, and the first epoch's cost (which fills the cache) against reading FLAC without it.

Run ``python benchmarks/decoded_cache.py [--repeat 6] [--rounds 5] [--workers 0 2]``. The corpus is the LJ
Speech utterances of the shared real corpora (``../shared/corpora/ljspeech_coqui``, 32 utterances, 22.05 kHz,
the FLACs decode bit-exactly to the WAVs), each repeated ``--repeat`` times under new keys, packed twice: as
FLAC and as WAV. Without the shared corpora, generated 16 kHz noise-and-tone utterances stand in.

Cases, each a ShardDataset (batch 16, shuffled) through a DataLoader with ``--workers`` workers (0: iterated
directly), measured in CPU seconds of the process and its workers, one round after another with the cases'
order alternating:

- ``wav``: the WAV shards, no cache (the lane);
- ``flac``: the FLAC shards, no cache (today);
- ``flac cache epoch 1``: the FLAC shards into a new, empty cache (decode and keep);
- ``flac cache epoch 2+``: the FLAC shards through a cache that holds them all.

Reports audio seconds per CPU second (median, min-max) and the two target ratios: epoch 2+ against WAV
(target >= 0.9) and epoch 1 against no cache (target <= 1.1 in cost, so >= 0.91 in rate). Writes
``benchmarks/results/decoded_cache.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import gc
import io
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
import torch
from torch.utils.data import DataLoader

from shardio import Index, Reading, ShardDataset, ShardWriter
from shardio.bench.data import shared_corpora
from shardio.bench.measure import cpu_seconds, machine_facts
from shardio.bench.report import write_results
from shardio.storage.eviction import segment_sizes

REPO = Path(__file__).resolve().parents[1]
_SHARED = shared_corpora()
LJSPEECH = (_SHARED or REPO) / "ljspeech_coqui" / "wavs"


def _sources() -> list[tuple[bytes, bytes]]:
    """(FLAC bytes, WAV bytes) of each utterance."""
    if LJSPEECH.is_dir():
        return [
            (flac.read_bytes(), flac.with_suffix(".wav").read_bytes())
            for flac in sorted(LJSPEECH.glob("*.flac"))
        ]
    rng = np.random.default_rng(0)
    found = []
    for i in range(32):
        frames = int(rng.integers(16000, 80000))
        t = np.arange(frames) / 16000
        audio = (0.3 * np.sin(2 * np.pi * (200 + 10 * i) * t) + 0.02 * rng.standard_normal(frames)).astype(
            np.float32
        )
        encoded = []
        for kind in ("FLAC", "WAV"):
            buffer = io.BytesIO()
            soundfile.write(buffer, audio, 16000, format=kind, subtype="PCM_16")
            encoded.append(buffer.getvalue())
        found.append((encoded[0], encoded[1]))
    return found


def pack(out: Path, repeat: int) -> dict[str, Path]:
    """The corpus packed as FLAC and as WAV under ``out``."""
    made = {}
    sources = _sources()
    for position, ext in enumerate(("flac", "wav")):
        directory = out / ext
        with ShardWriter(directory, max_bytes=64 << 20) as writer:
            for copy in range(repeat):
                for number, pair in enumerate(sources):
                    info = soundfile.info(io.BytesIO(pair[position]))
                    writer.write(
                        f"u{copy:03d}-{number:04d}",
                        {ext: pair[position]},
                        audio_ext=ext,
                        num_frames=info.frames,
                        sample_rate=info.samplerate,
                        channels=info.channels,
                    )
        made[ext] = directory
    return made


def _loader(directory: Path, workers: int, cache: Path | None) -> Iterable[dict[str, Any]]:
    reading = Reading() if cache is None else Reading(decoded_cache=str(cache))
    dataset = ShardDataset(directory, batch_size=16, reading=reading)
    if workers == 0:
        return dataset
    return DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=True)


def _epoch(loader: Iterable[dict[str, Any]]) -> float:
    """Audio seconds of one epoch, each batch touched as a copy to a GPU would."""
    seconds = 0.0
    for batch in loader:
        seconds += float((batch["lengths"].double() / batch["sample_rate"].double()).sum())
        float(batch["audio"].reshape(-1)[::1024].sum())
    return seconds


def _steady(loader: Iterable[dict[str, Any]]) -> Callable[[], float]:
    """Audio seconds per CPU second of one more epoch of a loader whose workers live on."""

    def run() -> float:
        started = cpu_seconds()
        audio = _epoch(loader)
        return audio / (cpu_seconds() - started)

    return run


def _fresh(directory: Path, workers: int, cache: Path | None) -> Callable[[], float]:
    """Audio seconds per CPU second of a new loader's first epoch (into an empty ``cache``, when given),
    its workers' start included, measured before they stop."""

    def run() -> float:
        gc.collect()  # the last round's loader let go of (its cache's files closed) outside the measure
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)  # and their pages freed here, not in this round
        started = cpu_seconds()
        loader = _loader(directory, workers, cache)
        audio = _epoch(loader)
        return audio / (cpu_seconds() - started)

    return run


def measure(corpora: dict[str, Path], work: Path, workers: int, rounds: int) -> dict[str, list[float]]:
    """Audio seconds per CPU second of each case, round by round."""
    fill = _loader(corpora["flac"], workers, work / f"warm-{workers}")
    _epoch(fill)  # the cache now holds every sample
    wav = _loader(corpora["wav"], workers, None)
    _epoch(wav)  # workers started, files mapped
    cases: dict[str, Callable[[], float]] = {
        "wav": _steady(wav),
        "flac": _fresh(corpora["flac"], workers, None),
        "flac cache epoch 1": _fresh(corpora["flac"], workers, work / "fresh"),
        "flac cache epoch 2+": _steady(fill),
    }
    rates: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for number in range(rounds):
        for name in names if number % 2 == 0 else names[::-1]:
            rates[name].append(cases[name]())
    return rates


def half_bound(corpora: dict[str, Path], work: Path, epochs: int = 3) -> dict[str, Any]:
    """The FLAC corpus read for ``epochs`` epochs (0 workers) through a cache bounded to about half its
    decoded audio: each epoch's hit rate, audio seconds per CPU second, and the cache's bytes."""
    index = Index.load(corpora["flac"])
    index_bytes = int((index.columns["num_frames"] * index.columns["channels"]).sum()) * 2
    bound = max(index_bytes // 2, 4 << 20)
    cache = work / "half"
    dataset = ShardDataset(
        corpora["flac"], batch_size=16, reading=Reading(decoded_cache=str(cache), decoded_cache_bytes=bound)
    )
    found = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        decoded = dataset._decoded
        hits = 0 if decoded is None else decoded.hits
        started = cpu_seconds()
        audio = _epoch(dataset)
        seconds = cpu_seconds() - started
        assert dataset._decoded is not None
        used = sum(size for size, _ in segment_sizes(str(cache)).values())
        found.append(
            {
                "epoch": epoch,
                "hit_rate": (dataset._decoded.hits - hits) / len(index),
                "audio_s_per_cpu_s": audio / seconds,
                "cache_bytes": used,
            }
        )
    return {"bound": bound, "decoded_bytes": index_bytes, "epochs": found}


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def _ratios(rates: dict[str, list[float]], one: str, other: str) -> dict[str, Any]:
    return _summary([a / b for a, b in zip(rates[one], rates[other])])


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Decoded cache: FLAC read once per node",
        "",
        f"`{report['command']}`; {report['audio_seconds']:.0f} s of audio, {report['samples']} utterances "
        f"({report['corpus']}); audio seconds per CPU second (process and workers), median (min-max) of "
        f"{report['rounds']} alternated rounds.",
        "",
        "| workers | case | audio s / CPU s |",
        "|---:|---|---:|",
    ]
    for workers, result in report["results"].items():
        for name, stat in result["rates"].items():
            lines.append(
                f"| {workers} | {name} | {stat['median']:,.0f} ({stat['min']:,.0f}-{stat['max']:,.0f}) |"
            )
    lines += ["", "| workers | ratio (per round, median) | value | target |", "|---:|---|---:|---|"]
    for workers, result in report["results"].items():
        two, one = result["epoch 2+ / wav"], result["epoch 1 / no cache"]
        lines.append(f"| {workers} | FLAC epoch 2+ / WAV | {two['median']:.2f} | >= 0.90 |")
        lines.append(f"| {workers} | FLAC epoch 1 / FLAC without cache | {one['median']:.2f} | >= 0.91 |")
    half = report["half_bound"]
    lines += [
        "",
        f"A cache bounded to {half['bound'] / 1e6:.1f} MB, about half the corpus's "
        f"{half['decoded_bytes'] / 1e6:.1f} MB of decoded audio (0 workers, one run):",
        "",
        "| epoch | hit rate | audio s / CPU s | cache bytes |",
        "|---:|---:|---:|---:|",
    ]
    for row in half["epochs"]:
        rate, used = row["audio_s_per_cpu_s"], row["cache_bytes"]
        lines.append(f"| {row['epoch']} | {row['hit_rate']:.2f} | {rate:,.0f} | {used:,} |")
    return "\n".join(lines) + "\n"


def _shown(argv: list[str] | None) -> list[str]:
    """The command's arguments, a ``--corpora`` directory shown as its default (no path of this machine)."""
    given = list(argv if argv is not None else sys.argv[1:])
    if "--corpora" in given[:-1]:
        given[given.index("--corpora") + 1] = "../shared/corpora"
    return given


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument(
        "--corpora", default=None, help="the shared real corpora (default: ../shared/corpora)"
    )
    args = parser.parse_args(argv)
    if args.corpora:
        global LJSPEECH
        LJSPEECH = Path(args.corpora) / "ljspeech_coqui" / "wavs"
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="decoded-cache-") as temporary:
        work = Path(temporary)
        corpora = pack(work / "corpora", args.repeat)
        samples = args.repeat * len(_sources())
        audio = _epoch(ShardDataset(corpora["wav"], batch_size=16))
        results = {}
        for workers in args.workers:
            rates = measure(corpora, work, workers, args.rounds)
            results[str(workers)] = {
                "rates": {name: _summary(values) for name, values in rates.items()},
                "epoch 2+ / wav": _ratios(rates, "flac cache epoch 2+", "wav"),
                "epoch 1 / no cache": _ratios(rates, "flac cache epoch 1", "flac"),
            }
            print(workers, {name: round(statistics.median(v)) for name, v in rates.items()}, flush=True)
        halved = half_bound(corpora, work)
    report = {
        "command": "python benchmarks/decoded_cache.py " + " ".join(_shown(argv)),
        "corpus": "LJ Speech FLAC/WAV, 22.05 kHz" if LJSPEECH.is_dir() else "generated 16 kHz",
        "samples": samples,
        "audio_seconds": audio,
        "rounds": args.rounds,
        "machine": machine_facts(),
        "results": results,
        "half_bound": halved,
    }
    write_results(args.results, "decoded_cache", report, markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
