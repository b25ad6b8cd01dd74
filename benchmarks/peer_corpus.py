"""The corpus side of ``benchmarks/peers.py``: the audio files of a folder, the folders of each format (a
given corpus and its lossless FLAC copy, the shared LJ Speech clips, or generated FLAC), batches padded as
every peer's reader pads them, and what decoding alone costs (soundfile's and shardio's decoders on the same
bytes)."""

from __future__ import annotations

import argparse
import io
import resource
import shutil
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from shardio.synth import make_corpus

BATCH = 16


def padded(audios: list[np.ndarray]) -> np.ndarray:
    """A batch: each 1-D float32 array in a row, zero-padded to the longest."""
    batch = np.zeros((len(audios), max(len(a) for a in audios)), np.float32)
    for row, audio in enumerate(audios):
        batch[row, : len(audio)] = audio
    return batch


def batches_of(audios: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    group: list[np.ndarray] = []
    for audio in audios:
        group.append(audio)
        if len(group) == BATCH:
            yield padded(group)
            group = []
    if group:
        yield padded(group)


def decode(data: bytes) -> np.ndarray:
    audio, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return audio[:, 0]


def flac_files(root: Path) -> list[Path]:
    """The corpus's audio files: ``.flac`` or ``.wav`` (a corpus of one format)."""
    return sorted([*root.rglob("*.flac"), *root.rglob("*.wav")])


def text_of(path: Path) -> str:
    transcript = path.with_suffix(".txt")
    return transcript.read_text().strip() if transcript.exists() else ""


def cpu_seconds() -> float:
    """CPU seconds of this process (its threads too) and of its children that ended (LitData's workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def flac_copy(root: Path, out: Path) -> Path:
    """A lossless FLAC copy of the WAV corpus ``root`` under ``out`` (same folders and names), written by
    soundfile at the WAVs' own sample size: it decodes to the same samples."""
    for path in flac_files(root):
        audio, rate = soundfile.read(str(path), dtype="int32", always_2d=True)
        subtype = soundfile.info(str(path)).subtype
        target = out / path.relative_to(root).with_suffix(".flac")
        target.parent.mkdir(parents=True, exist_ok=True)
        soundfile.write(
            str(target), audio, rate, subtype=subtype if subtype in ("PCM_16", "PCM_24") else "PCM_16"
        )
        transcript = path.with_suffix(".txt")
        if transcript.exists():
            shutil.copyfile(transcript, target.with_suffix(".txt"))
    return out


def corpus_folders(args: argparse.Namespace, work: Path) -> dict[str, tuple[Path, str]]:
    """Per format: a folder of its files and what it is."""
    lj = args.corpora / "ljspeech_coqui" / "wavs"
    if args.corpus is not None:
        root = args.corpus.resolve()
        fmt = "FLAC" if any(path.suffix == ".flac" for path in flac_files(root)) else "WAV"
        if fmt == "WAV" and args.flac_copy:
            copy = flac_copy(root, work / "flac-copy")
            return {
                "FLAC": (copy, f"{args.corpus.name} as FLAC (a lossless copy made with soundfile)"),
                "WAV": (root, f"{args.corpus.name} (WAV)"),
            }
        return {fmt: (root, f"{args.corpus.name} ({fmt})")}
    if lj.is_dir():
        found = {}
        for fmt in ("flac", "wav"):
            root = work / f"ljspeech-{fmt}"
            for copy in range(args.tile):  # each copy in a folder of its own: its keys differ
                (root / f"copy{copy:02d}").mkdir(parents=True)
                for path in sorted(lj.glob(f"*.{fmt}")):
                    (root / f"copy{copy:02d}" / path.name).symlink_to(path)
            tiled = f", each {args.tile} times" if args.tile > 1 else ""
            found[fmt.upper()] = (root, f"LJ Speech {fmt.upper()} clips (22.05 kHz{tiled})")
        return found
    count = 50 if args.quick else 300
    root = work / "synthetic-flac"
    make_corpus(root, num_files=count, formats=("flac",), min_seconds=2.0, max_seconds=16.0)
    return {"FLAC": (root, f"{count} generated FLAC (shardio.synth), 2-16 s")}


def decode_floor(root: Path, rounds: int) -> dict[str, Any]:
    """What decoding alone costs: every file's bytes, already in memory, decoded to float32 and padded in
    batches of 16, by soundfile from a ``BytesIO`` (as the peers but shardio decode) and by shardio's decoder
    (``shardio.reading.decode.decode_audio``); median CPU seconds of ``rounds`` alternated after a warm-up,
    with the corpus's files, audio seconds and sample rates."""
    from shardio.reading.decode import decode_audio

    paths = flac_files(root)
    blobs = [(path.read_bytes(), path.suffix[1:]) for path in paths]
    decoders: dict[str, Callable[[bytes, str], np.ndarray]] = {
        "soundfile": lambda data, ext: decode(data),
        "shardio": lambda data, ext: decode_audio(data, ext)[0][0],
    }
    times: dict[str, list[float]] = {name: [] for name in decoders}
    for number in range(rounds + 1):
        for name in list(decoders)[number % 2 :] + list(decoders)[: number % 2]:
            cpu = cpu_seconds()
            batches = batches_of(decoders[name](data, ext) for data, ext in blobs)
            assert sum(len(batch) for batch in batches) == len(blobs)
            if number:
                times[name].append(cpu_seconds() - cpu)
    infos = [soundfile.info(str(path)) for path in paths]
    return dict(
        cpu=statistics.median(times["soundfile"]),
        shardio_cpu=statistics.median(times["shardio"]),
        files=len(blobs),
        seconds=sum(info.duration for info in infos),
        rates=sorted({int(info.samplerate) for info in infos}),
    )
