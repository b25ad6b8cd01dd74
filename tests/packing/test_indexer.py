"""build_index for shards written by other tools: webdataset.ShardWriter (.tar, .tar.gz), the tar + zstd CLIs,
and shardio's own shards (re-indexed as seekable zstd)."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import webdataset
import zstandard
from audio_factory import audio_bytes, tone

from shardio.errors import DecodeError, FormatError, OptionError, ReadError
from shardio.packing.indexer import build_index
from shardio.packing.pack import pack
from shardio.packing.verification import verify_dataset
from shardio.shards.index import Index
from shardio.shards.tarformat import parse_members

SPECS = [
    ("wav", 8000, 1, 0.3),
    ("flac", 16000, 2, 0.5),
    ("ogg", 22050, 1, 0.4),
    ("mp3", 16000, 1, 0.6),
    ("wav", 16000, 2, 0.2),
    ("flac", 8000, 1, 0.25),
    ("wav", 8000, 1, 0.1),
]


def webdataset_samples(long_keys: bool = False) -> list[dict]:
    samples = []
    for i, (ext, rate, channels, seconds) in enumerate(SPECS):
        key = f"spk{i % 2}/utt{i:03d}" + ("_" + "x" * 120 if long_keys and i % 3 == 0 else "")
        samples.append(
            {
                "__key__": key,
                ext: audio_bytes(tone(seconds, rate, channels, seed=i), rate, ext),
                "json": json.dumps({"text": f"sample {i}"}).encode(),
                "txt": f"sample {i}".encode(),
            }
        )
    return samples


def write_webdataset(pattern: Path, samples: list[dict], maxcount: int = 3) -> list[Path]:
    pattern.parent.mkdir(parents=True, exist_ok=True)
    with webdataset.ShardWriter(str(pattern), maxcount=maxcount, verbose=0) as writer:
        for sample in samples:
            writer.write(sample)
    return sorted(pattern.parent.glob(pattern.name.replace("%06d", "*")))


def decompressed(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    if path.name.endswith(".zst"):
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    return data


def read_back(index: Index, sample: int) -> dict[str, bytes]:
    """A sample's members from its shard at the index's offsets (in the decompressed
    tar for stream codecs)."""
    c = index.columns
    shard = int(c["shard"][sample])
    path = Path(index.shard_path(shard))
    codec = index.shards[shard].codec
    offset, size = int(c["frame_offset"][sample]), int(c["frame_size"][sample])
    if codec == "none":
        data = path.read_bytes()[offset : offset + size]
    elif codec == "zstd":
        frame = zstandard.ZstdDecompressor().decompress(path.read_bytes()[offset : offset + size])
        data = frame[int(c["member_offset"][sample]) :][: int(c["member_size"][sample])]
    else:
        assert size == int(c["member_size"][sample]) and int(c["member_offset"][sample]) == 0
        data = decompressed(path)[offset : offset + size]
    return {name: bytes(view) for name, view in parse_members(data, str(path))}


def check_index(index: Index, samples: list[dict]) -> None:
    assert index.keys == [s["__key__"] for s in samples]
    for i, sample in enumerate(samples):
        members = read_back(index, i)
        expected = {f"{sample['__key__']}.{ext}": data for ext, data in sample.items() if ext != "__key__"}
        assert members == expected
        ext, rate, channels, seconds = SPECS[i]
        assert index.formats[int(index.columns["format"][i])] == ext
        assert (int(index.columns["sample_rate"][i]), int(index.columns["channels"][i])) == (rate, channels)
        assert int(index.columns["num_frames"][i]) == sf.info(io.BytesIO(sample[ext])).frames


@pytest.mark.parametrize("long_keys", [False, True])
def test_webdataset_tar_shards(tmp_path: Path, long_keys: bool) -> None:
    samples = webdataset_samples(long_keys)
    shards = write_webdataset(tmp_path / "wds-%06d.tar", samples)
    index = build_index(shards)
    assert [s.name for s in index.shards] == ["wds-000000.tar", "wds-000001.tar", "wds-000002.tar"]
    assert [s.codec for s in index.shards] == ["none"] * 3 and [s.samples for s in index.shards] == [3, 3, 1]
    assert [s.bytes for s in index.shards] == [p.stat().st_size for p in shards]
    check_index(Index.load(tmp_path), samples)
    assert verify_dataset(tmp_path, decode=True) == []


def test_webdataset_tar_gz_shards(tmp_path: Path) -> None:
    samples = webdataset_samples()
    shards = write_webdataset(tmp_path / "wds-%06d.tar.gz", samples, maxcount=4)
    index = build_index(shards)
    assert [s.codec for s in index.shards] == ["gzip", "gzip"]
    check_index(index, samples)
    assert verify_dataset(tmp_path, decode=True) == []


@pytest.mark.skipif(not shutil.which("zstd"), reason="needs the zstd CLI")
def test_tar_zst_from_the_zstd_cli_is_a_stream(tmp_path: Path) -> None:
    samples = webdataset_samples()
    for shard in write_webdataset(tmp_path / "src" / "wds-%06d.tar", samples, maxcount=7):
        subprocess.run(
            ["zstd", "-q", "-19", str(shard), "-o", str(tmp_path / f"{shard.name}.zst")], check=True
        )
    index = build_index([tmp_path / "wds-000000.tar.zst"])
    assert [s.codec for s in index.shards] == ["zstd-stream"]
    check_index(index, samples)
    assert verify_dataset(tmp_path, decode=True) == []


def test_shardio_zstd_shards_reindex_as_seekable(mixed_corpus: Path, tmp_path: Path) -> None:
    pack(mixed_corpus, tmp_path / "packed", compression="zstd", samples_per_shard=2, progress=False)
    packed = Index.load(tmp_path / "packed")
    rebuilt = build_index(sorted((tmp_path / "packed").glob("*.tar.zst")), out_dir=tmp_path / "elsewhere")
    assert [s.codec for s in rebuilt.shards] == ["zstd"] * 3
    assert [s.name for s in rebuilt.shards] == [f"../packed/shard-00000{n}.tar.zst" for n in range(3)]
    assert rebuilt.keys == packed.keys and rebuilt.formats == packed.formats
    for name, column in packed.columns.items():
        assert np.array_equal(rebuilt.columns[name], column), name
    assert [(s.bytes, s.sha256, s.samples) for s in rebuilt.shards] == [
        (s.bytes, s.sha256, s.samples) for s in packed.shards
    ]
    assert "allow_outside_root=True" in verify_dataset(tmp_path / "elsewhere")[0]
    assert verify_dataset(tmp_path / "elsewhere", decode=True, allow_outside_root=True) == []


def test_plain_tar_of_packed_shards_reindexes_identically(mixed_corpus: Path, tmp_path: Path) -> None:
    pack(mixed_corpus, tmp_path / "packed", samples_per_shard=3, progress=False)
    packed = Index.load(tmp_path / "packed")
    (tmp_path / "packed" / "index.json").unlink()
    rebuilt = build_index(sorted((tmp_path / "packed").glob("*.tar")))
    assert rebuilt.fingerprint == packed.fingerprint


def test_indexer_errors_name_the_shard_and_sample(tmp_path: Path) -> None:
    no_audio = [{"__key__": "a", "txt": b"hello"}]
    (shard,) = write_webdataset(tmp_path / "noaudio-%06d.tar", no_audio)
    with pytest.raises(FormatError, match=r"noaudio-000000\.tar: sample 'a' at offset 0 has no audio member"):
        build_index([shard])
    (bad,) = write_webdataset(tmp_path / "bad-%06d.tar", [{"__key__": "b", "wav": b"not audio"}])
    with pytest.raises(DecodeError, match=r"bad-000000\.tar: sample 'b' at offset 0: the \.wav member"):
        build_index([bad])
    truncated = tmp_path / "cut.tar.gz"
    (gz,) = write_webdataset(tmp_path / "gz-%06d.tar.gz", webdataset_samples()[:2])
    truncated.write_bytes(gz.read_bytes()[:-100])
    with pytest.raises(FormatError, match=r"cut\.tar\.gz"):
        build_index([truncated])
    with pytest.raises(OptionError, match="not a shard name"):
        build_index([tmp_path / "x.zip"])
    with pytest.raises(ReadError, match="no such shard"):
        build_index([tmp_path / "missing.tar"])


def test_multi_frame_zstd_not_aligned_with_samples_is_a_stream(tmp_path: Path) -> None:
    samples = webdataset_samples()
    (tar,) = write_webdataset(tmp_path / "src" / "wds-%06d.tar", samples, maxcount=7)
    data, compressor = tar.read_bytes(), zstandard.ZstdCompressor()
    shard = tmp_path / "chunked.tar.zst"  # frames of 3000 bytes cut through the samples
    shard.write_bytes(b"".join(compressor.compress(data[i : i + 3000]) for i in range(0, len(data), 3000)))
    index = build_index([shard])
    assert [s.codec for s in index.shards] == ["zstd-stream"]
    check_index(index, samples)
    assert verify_dataset(index.root, decode=True) == []  # the loader's Reader reads across every frame
