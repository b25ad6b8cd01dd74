"""Packed shards are ordinary WebDataset shards: GNU tar, the zstd CLI and webdataset read the same keys and
the same bytes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import webdataset

from shardio.packing.pack import pack
from shardio.shards.index import Index

pytestmark = pytest.mark.skipif(
    not (shutil.which("tar") and shutil.which("zstd")), reason="needs tar and zstd"
)


def expected_members(corpus: Path, index: Index) -> dict[str, bytes]:
    """Every member name a packed dataset of the mixed corpus should hold, with the audio's original bytes."""
    files = {
        p.relative_to(corpus).as_posix().rsplit(".", 1)[0]: p
        for p in corpus.rglob("*")
        if p.suffix in (".wav", ".flac", ".ogg", ".mp3")
    }
    return {f"{key}{files[key].suffix}": files[key].read_bytes() for key in index.keys}


@pytest.fixture(params=["none", "zstd"])
def packed(request: pytest.FixtureRequest, mixed_corpus: Path, tmp_path: Path) -> tuple[Path, Index]:
    pack(mixed_corpus, tmp_path / "out", compression=request.param, samples_per_shard=2, progress=False)
    return tmp_path / "out", Index.load(tmp_path / "out")


def tar_listing(shard: Path) -> list[str]:
    if shard.name.endswith(".zst"):
        tar = subprocess.run(
            f"zstd -dc '{shard}' | tar -t", shell=True, check=True, capture_output=True, text=True
        )
    else:
        tar = subprocess.run(["tar", "-tf", str(shard)], check=True, capture_output=True, text=True)
    return tar.stdout.splitlines()


def test_tar_and_zstd_cli_list_and_extract_the_same(
    packed: tuple[Path, Index], mixed_corpus: Path, tmp_path: Path
) -> None:
    out, index = packed
    names = [name for shard in index.shards for name in tar_listing(out / shard.name)]
    audio_names = list(expected_members(mixed_corpus, index))  # in index order
    assert names == [name for audio, key in zip(audio_names, index.keys) for name in (audio, f"{key}.json")]
    extracted = tmp_path / "extracted"
    extracted.mkdir()
    for shard in index.shards:
        source = out / shard.name
        command = (
            f"zstd -dc '{source}' | tar -x -C '{extracted}'"
            if shard.codec == "zstd"
            else f"tar -xf '{source}' -C '{extracted}'"
        )
        subprocess.run(command, shell=True, check=True)
    for name, data in expected_members(mixed_corpus, index).items():
        assert (extracted / name).read_bytes() == data
    meta = json.loads((extracted / "a_wav.json").read_text(encoding="utf-8"))
    assert meta["text"] == "the wav one"


def test_webdataset_reads_the_same_samples(packed: tuple[Path, Index], mixed_corpus: Path) -> None:
    out, index = packed
    urls = [
        f"pipe:zstd -dc '{out / s.name}'" if s.codec == "zstd" else str(out / s.name) for s in index.shards
    ]
    samples = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in samples] == index.keys
    expected = expected_members(mixed_corpus, index)
    for sample in samples:
        key = sample["__key__"]
        audio = [ext for ext in sample if not ext.startswith("__") and ext != "json"]
        assert len(audio) == 1 and sample[audio[0]] == expected[f"{key}.{audio[0]}"]
        assert json.loads(sample["json"])["duration"] > 0
