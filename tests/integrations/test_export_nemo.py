"""NeMo manifest export: read back the way NeMo's tarred loader does (webdataset over the shard pattern,
entries joined by the audio member's base name)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from audio_factory import make_folder_corpus

from shardio.errors import OptionError
from shardio.integrations.exporters.nemo import NEMO_MANIFEST, export_nemo
from shardio.packing.pack import pack

wds = pytest.importorskip("webdataset")


def test_manifest_joins_every_member_with_its_text(tmp_path: Path) -> None:
    audio = make_folder_corpus(tmp_path / "corpus", 9, formats=("wav", "flac"), subdirs=1)
    pack(tmp_path / "corpus", tmp_path / "out", samples_per_shard=4, progress=False)
    pattern = export_nemo(tmp_path / "out")
    assert pattern.endswith("shard-{000000..000002}.tar")
    entries = [json.loads(line) for line in (tmp_path / "out" / NEMO_MANIFEST).read_text().splitlines()]
    by_name = {Path(e["audio_filepath"]).stem: e for e in entries}
    seen = {}
    for sample in wds.WebDataset(pattern, shardshuffle=False):
        ext = next(e for e in ("wav", "flac") if e in sample)
        name = Path(sample["__key__"]).name
        seen[name] = (sample[ext], by_name[name]["text"], by_name[name]["shard_id"], sample["__url__"])
    assert len(seen) == len(audio) == len(entries)
    for i, path in enumerate(audio):
        data, text, shard_id, url = seen[path.stem]
        assert data == path.read_bytes() and text == f"utterance number {i}"
        assert url.endswith(f"shard-{shard_id:06d}.tar")
    manifest = (tmp_path / "out" / NEMO_MANIFEST).read_bytes()
    (tmp_path / "out" / NEMO_MANIFEST).write_text("a user's own manifest\n")
    with pytest.raises(OptionError, match="overwrite=True"):
        export_nemo(tmp_path / "out")
    assert (tmp_path / "out" / NEMO_MANIFEST).read_text() == "a user's own manifest\n"
    export_nemo(tmp_path / "out", overwrite=True)
    assert (tmp_path / "out" / NEMO_MANIFEST).read_bytes() == manifest


def test_zstd_datasets_and_clashing_base_names_are_refused(tmp_path: Path) -> None:
    make_folder_corpus(tmp_path / "corpus", 4, subdirs=1)
    pack(tmp_path / "corpus", tmp_path / "zstd", compression="zstd", progress=False)
    with pytest.raises(OptionError, match="plain .tar"):
        export_nemo(tmp_path / "zstd")
    (tmp_path / "two" / "a").mkdir(parents=True)
    (tmp_path / "two" / "b").mkdir()
    make_folder_corpus(tmp_path / "two" / "a", 1, subdirs=1)
    make_folder_corpus(tmp_path / "two" / "b", 1, subdirs=1)
    pack(tmp_path / "two", tmp_path / "clash", progress=False)
    with pytest.raises(OptionError, match="share the base name"):
        export_nemo(tmp_path / "clash")
