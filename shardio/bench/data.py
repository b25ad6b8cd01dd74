"""Corpora for ``shardio bench``: generate or find them, pack them, and derive the compression variants.

Without a dataset directory the bench makes two corpora under ``out_dir``:

- ``wav16k``: 1-5 s, 16 kHz, PCM16 WAV speech-like utterances (:func:`shardio.synth.make_corpus`, or a
  numpy fallback when that module is absent), packed into ``.tar`` shards;
- ``flac``: the LJ Speech FLACs of the shared real corpora, repeated, when ``../shared/corpora`` is next to
  the repository (it is not on users' clones), else generated 16 kHz FLAC utterances.

Each dataset's variants (``zstd`` levels, ``gzip``, ``bz2``) are made from its samples' tar bytes: zstd ones
with :class:`~shardio.shards.writer.ShardWriter`, the stream codecs by compressing whole ``.tar`` shards and
indexing them with :func:`shardio.packing.indexer.build_index` when that is available.
"""

from __future__ import annotations

import bz2
import gzip
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from ..errors import OptionError
from ..packing.pack import pack
from ..reading.reader import Reader
from ..shards.index import INDEX_JSON, Index
from ..shards.writer import ShardWriter
from ..storage.files import check_output_file, write_atomic

__all__ = [
    "STREAM_COMPRESSORS",
    "Corpus",
    "audio_members",
    "dataset_corpus",
    "make_variant",
    "prepare_corpora",
    "shared_corpora",
    "zstd_frames",
]

logger = logging.getLogger(__name__)

STREAM_COMPRESSORS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": (".tar.gz", lambda data: gzip.compress(data, compresslevel=6, mtime=0)),
    "bz2": (".tar.bz2", lambda data: bz2.compress(data, compresslevel=9)),
}
"""Stream codecs of other tools: suffix and whole-shard compressor (gzip -6, bzip2 -9, their defaults)."""


@dataclass
class Corpus:
    """One packed dataset the bench measures."""

    name: str
    directory: str
    source: str
    """Where the audio came from: ``generated (...)``, ``shared corpora (...)`` or ``user dataset``."""
    audio_format: str
    samples: int
    audio_seconds: float
    shards: int
    shard_bytes: int
    codec: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


def shared_corpora() -> Path | None:
    """``<repository>/../shared/corpora`` when it exists (a development machine), else None."""
    candidate = Path(__file__).resolve().parents[3] / "shared" / "corpora"  # shardio/bench/data.py
    return candidate if candidate.is_dir() else None


def dataset_corpus(directory: str | os.PathLike[str], name: str, source: str) -> Corpus:
    """Describe the shardio dataset at ``directory``."""
    index = Index.load(directory)
    codecs = sorted({s.codec for s in index.shards})
    formats = sorted({index.formats[int(f)] for f in np.unique(index.columns["format"])})
    return Corpus(
        name=name,
        directory=os.fspath(directory),
        source=source,
        audio_format="+".join(formats),
        samples=len(index),
        audio_seconds=round(index.total_duration, 3),
        shards=len(index.shards),
        shard_bytes=sum(s.bytes for s in index.shards),
        codec="+".join(codecs),
    )


def _numpy_corpus(out: Path, num_files: int, ext: str, rate: int) -> None:
    """A fallback corpus: harmonic tones with noise, 1-5 s, when :mod:`shardio.synth` is absent."""
    rng = np.random.default_rng(0)
    for number in range(num_files):
        frames = int(rate * rng.uniform(1.0, 5.0))
        t = np.arange(frames) / rate
        f0 = rng.uniform(90, 240)
        audio = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6)) * 0.2
        audio = (audio + 0.01 * rng.standard_normal(frames)).astype(np.float32)
        path = out / f"spk{number % 4:02d}" / f"utt{number:05d}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        soundfile.write(path, audio, rate, subtype="PCM_16", format=ext.upper())


def _generate(out: Path, num_files: int, ext: str, rate: int) -> str:
    """Write a corpus of ``num_files`` 1-5 s utterances; returns how it was made."""
    try:
        from ..synth import make_corpus
    except ImportError:
        _numpy_corpus(out, num_files, ext, rate)
        return f"generated (numpy tones, {rate} Hz)"
    make_corpus(out, num_files=num_files, formats=(ext,), sample_rate=rate, min_seconds=1.0, max_seconds=5.0)
    return f"generated (shardio.synth, {rate} Hz)"


def _ljspeech_flacs(out: Path, shared: Path, repeats: int, limit: int | None) -> str | None:
    """Copy the (first ``limit``) LJ Speech FLACs ``repeats`` times under ``out``; None
    when they are absent."""
    flacs = sorted((shared / "ljspeech_coqui" / "wavs").glob("*.flac"))[:limit]
    if not flacs:
        return None
    for copy in range(repeats):
        for flac in flacs:
            target = out / f"r{copy:02d}" / flac.name
            target.parent.mkdir(parents=True, exist_ok=True)
            check_output_file(target)  # copyfile writes into a FIFO or device there
            shutil.copyfile(flac, target)
    return f"shared corpora (ljspeech_coqui, {len(flacs)} FLACs x {repeats}, 22.05 kHz)"


def _fresh(directory: Path) -> Path:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    return directory


def prepare_corpora(
    out_dir: str | os.PathLike[str],
    *,
    wav_files: int,
    flac_repeats: int,
    flac_files: int,
    samples_per_shard: int,
    flac_limit: int | None = None,
) -> list[Corpus]:
    """Generate (or find) and pack the bench's own corpora under ``out_dir``, as plain ``.tar`` datasets."""
    root = Path(out_dir)
    corpora: list[Corpus] = []
    source_dir = _fresh(root / "corpora" / "wav16k")
    how = _generate(source_dir, wav_files, "wav", 16000)
    corpora.append(_pack(source_dir, root / "datasets" / "wav16k-none", "wav16k", how, samples_per_shard))
    source_dir = _fresh(root / "corpora" / "flac")
    shared = shared_corpora()
    how_flac = _ljspeech_flacs(source_dir, shared, flac_repeats, flac_limit) if shared is not None else None
    if how_flac is None:
        how_flac = _generate(source_dir, flac_files, "flac", 16000)
    corpora.append(_pack(source_dir, root / "datasets" / "flac-none", "flac", how_flac, samples_per_shard))
    return corpora


def _pack(source: Path, dataset: Path, name: str, how: str, samples_per_shard: int) -> Corpus:
    _fresh(dataset)
    pack(source, dataset, samples_per_shard=samples_per_shard, compression="none", progress=False)
    logger.info("packed %s (%s) into %s", name, how, dataset)
    return dataset_corpus(dataset, name, how)


def _sample_members(reader: Reader, sample: int) -> dict[str, bytes]:
    """A sample's members as ``{ext: bytes}``, in their tar order."""
    return {ext: bytes(data) for ext, data in reader.members(sample).items()}


def make_variant(
    source: Corpus, codec: str, out_dir: str | os.PathLike[str], *, level: int = 3, samples: int | None = None
) -> Corpus | None:
    """Re-write ``source``'s first ``samples`` samples (all by default) with another
    codec; None if impossible.

    ``codec`` is ``none``, ``zstd`` (at ``level``), ``gzip`` or ``bz2``. The shard boundaries are kept.
    Stream codecs need :func:`shardio.packing.indexer.build_index`; without it the shards are written but not
    indexed and None is returned (the caller may still read them with WebDataset).
    """
    index = Index.load(source.directory)
    count = len(index) if samples is None else min(samples, len(index))
    label = f"{codec}-{level}" if codec == "zstd" else codec
    directory = _fresh(
        Path(out_dir) / f"{source.name}-{label}"
        if samples is None
        else Path(out_dir) / f"{source.name}-{count}-{label}"
    )
    reader = Reader(index)
    keys, formats = index.keys, index.formats
    c = index.columns
    if codec in ("none", "zstd"):
        per_shard = max(s.samples for s in index.shards)  # keeps the boundaries of equal-sized shards
        with ShardWriter(
            directory, compression=codec, zstd_level=level, max_samples=per_shard, overwrite=True
        ) as writer:
            for sample in range(count):
                writer.write(
                    keys[sample],
                    _sample_members(reader, sample),
                    audio_ext=formats[int(c["format"][sample])],
                    num_frames=int(c["num_frames"][sample]),
                    sample_rate=int(c["sample_rate"][sample]),
                    channels=int(c["channels"][sample]),
                )
        reader.close()
        return dataset_corpus(directory, source.name, source.source)
    if codec not in STREAM_COMPRESSORS:
        raise OptionError(f"unknown bench codec {codec!r}")
    suffix, compress = STREAM_COMPRESSORS[codec]
    plain = make_variant(source, "none", Path(out_dir) / ".plain", samples=count)
    assert plain is not None
    paths = []
    for shard in Index.load(plain.directory).shards:
        data = Path(plain.directory, shard.name).read_bytes()
        path = directory / shard.name.replace(".tar", suffix)
        write_atomic(str(path), compress(data))
        paths.append(path)
    shutil.rmtree(Path(out_dir) / ".plain")
    try:
        from ..packing.indexer import build_index
    except ImportError:
        logger.warning(
            "shardio.packing.indexer is not available: %s shards are read with WebDataset only", codec
        )
        return Corpus(
            name=source.name,
            directory=str(directory),
            source=source.source,
            audio_format=source.audio_format,
            samples=count,
            audio_seconds=0.0,
            shards=len(paths),
            shard_bytes=sum(p.stat().st_size for p in paths),
            codec=codec,
        )
    build_index(paths, directory, progress=False)  # a step of the bench's own bars
    return dataset_corpus(directory, source.name, source.source)


def shard_files(corpus: Corpus) -> list[str]:
    """The shard files of ``corpus`` (indexed or not), sorted."""
    if (Path(corpus.directory) / INDEX_JSON).is_file():
        index = Index.load(corpus.directory)
        return [index.shard_path(s) for s in range(len(index.shards))]
    return sorted(str(p) for p in Path(corpus.directory).glob("*.tar*"))


def audio_members(corpus: Corpus, limit: int | None = None) -> list[tuple[str, bytes]]:
    """``(ext, bytes)`` of the audio member of each sample of ``corpus`` (the first
    ``limit``), in index order."""
    index = Index.load(corpus.directory)
    reader = Reader(index)
    found: list[tuple[str, bytes]] = []
    try:
        for sample in range(len(index) if limit is None else min(limit, len(index))):
            ext = index.formats[int(index.columns["format"][sample])]
            found.append((ext, _sample_members(reader, sample)[ext]))
    finally:
        reader.close()
    return found


def zstd_frames(corpus: Corpus) -> list[tuple[bytes, float]]:
    """``(compressed frame, audio seconds)`` of each sample of the ``.tar.zst`` ``corpus``, in index order
    (samples that share a frame share its bytes)."""
    index = Index.load(corpus.directory)
    reader = Reader(index)
    c = index.columns
    frames: dict[tuple[int, int], bytes] = {}
    found = []
    try:
        for sample in range(len(index)):
            shard, offset = int(c["shard"][sample]), int(c["frame_offset"][sample])
            if (shard, offset) not in frames:
                frames[shard, offset] = reader.read_range(shard, offset, int(c["frame_size"][sample]))
            found.append(
                (frames[shard, offset], int(c["num_frames"][sample]) / int(c["sample_rate"][sample]))
            )
    finally:
        reader.close()
    return found
