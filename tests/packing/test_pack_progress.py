"""Progress on the command line's packing side: the corpus listing before a pack, the bytes of
``shardio index``, and the bounds of ``-j``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import webdataset
from audio_factory import audio_bytes, make_folder_corpus, tone, write_text
from tqdm import tqdm

import shardio.integrations.importers.nemo_index as nemo_index
import shardio.packing.indexer as indexer
import shardio.packing.listing as listing
from shardio.cli.demo import MAX_WORKERS as DEMO_MAX_WORKERS
from shardio.cli.demo import run_demo
from shardio.cli.main import main
from shardio.cli.pack import PACK_MAX_WORKERS
from shardio.packing.corpus import read_corpus
from shardio.packing.engines import pack_partitioned
from shardio.packing.pack import pack


class RecordingBar(tqdm):  # type: ignore[type-arg]
    """A tqdm that keeps its options and every update, to see what a bar counts without reading its output."""

    made: list[RecordingBar] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = dict(kwargs)
        self.updates: list[float] = []
        super().__init__(*args, **kwargs)
        RecordingBar.made.append(self)

    def update(self, n: float | None = 1) -> bool | None:
        self.updates.append(1 if n is None else n)
        return super().update(n)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[RecordingBar]]:
    RecordingBar.made = []
    monkeypatch.setattr(indexer, "tqdm", RecordingBar)
    monkeypatch.setattr(listing, "tqdm", RecordingBar)
    monkeypatch.setattr(nemo_index, "tqdm", RecordingBar)
    yield RecordingBar.made


@pytest.fixture
def big_shard(tmp_path: Path) -> Path:
    """One shard of about 4.6 MiB: four 1.2 MB wav samples."""
    path = tmp_path / "shards" / "big-000000.tar"
    path.parent.mkdir()
    with webdataset.TarWriter(str(path)) as writer:
        for i in range(4):
            writer.write(
                {
                    "__key__": f"utt{i}",
                    "wav": audio_bytes(tone(37.5, 16000, seed=i), 16000, "wav"),
                    "json": json.dumps({"text": f"sample {i}"}).encode(),
                }
            )
    return path


# -- shardio index: bytes, not shards ------------------------------------------------------------------


def test_index_bar_counts_the_bytes_read(big_shard: Path, recording: list[RecordingBar]) -> None:
    index = indexer.build_index([big_shard], progress=True)
    [bar] = recording
    size = big_shard.stat().st_size
    assert bar.options["unit"] == "B" and bar.total == size and bar.n == size
    assert sum(bar.updates) == size == index.shards[0].bytes
    # it moves while the one shard is read, not once at its end
    assert len([n for n in bar.updates if n > 0]) >= 4


def test_nemo_index_bar_counts_the_bytes_read(tmp_path: Path, recording: list[RecordingBar]) -> None:
    from test_nemo_index import write_tarred

    write_tarred(tmp_path, count=6, shards=2)
    index = nemo_index.index_nemo(tmp_path, progress=True)
    [bar] = recording
    size = sum(shard.bytes for shard in index.shards)
    assert bar.options["unit"] == "B" and bar.total == size and bar.n == size


def test_index_cli_bar_on_stderr_unless_no_progress(
    big_shard: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["index", str(big_shard), "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "index:" in err and "B/s" in err
    assert "shard/s" not in err
    assert main(["index", str(big_shard), "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    assert "index:" not in capsys.readouterr().err


# -- pack: the listing before the first bar ------------------------------------------------------------


def test_folder_listing_counts_files_as_the_walk_finds_them(tmp_path: Path) -> None:
    make_folder_corpus(tmp_path / "corpus", 6, subdirs=3)
    write_text(tmp_path / "corpus" / "d1" / "notes.md", "not audio")
    calls: list[int] = []
    sources = read_corpus(tmp_path / "corpus", listed=calls.append)
    first = next(iter(sources))
    files = [p for p in (tmp_path / "corpus").rglob("*") if p.is_file()]
    assert first.key and sum(calls) == len(files)  # all counted by the walk, before the first source
    assert len(calls) >= 3  # directory by directory


def test_manifest_listing_counts_sources(tmp_path: Path) -> None:
    make_folder_corpus(tmp_path / "corpus", 3)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(
            json.dumps({"audio_filepath": str(p), "duration": 0.5}) + "\n"
            for p in sorted((tmp_path / "corpus").rglob("*.wav"))
        )
    )
    calls: list[int] = []
    assert len(list(read_corpus(manifest, listed=calls.append))) == 3 and calls == [1, 1, 1]


@pytest.mark.parametrize("partitioned", [False, True])
def test_pack_shows_a_listing_counter(
    tmp_path: Path, recording: list[RecordingBar], partitioned: bool
) -> None:
    make_folder_corpus(tmp_path / "corpus", 5)
    if partitioned:
        pack_partitioned(tmp_path / "corpus", tmp_path / "out", progress=True)
    else:
        pack(tmp_path / "corpus", tmp_path / "out", progress=True)
    [bar] = [bar for bar in recording if bar.options.get("desc") == "list"]
    files = [p for p in (tmp_path / "corpus").rglob("*") if p.is_file()]
    assert bar.total is None and bar.options["unit"] == "file" and bar.n == len(files)
    assert bar.options["disable"] is False


def test_pack_cli_listing_on_stderr_unless_no_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_folder_corpus(tmp_path / "corpus", 4)
    assert main(["pack", str(tmp_path / "corpus"), str(tmp_path / "a"), "-j", "1"]) == 0
    assert "list: " in capsys.readouterr().err
    assert main(["pack", str(tmp_path / "corpus"), str(tmp_path / "b"), "-j", "1", "--no-progress"]) == 0
    assert "list: " not in capsys.readouterr().err


# -- -j: a sane most -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "limit"), [("demo", DEMO_MAX_WORKERS), ("pack", PACK_MAX_WORKERS)])
def test_workers_beyond_the_limit_are_a_usage_error(
    name: str, limit: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{name} ran with workers beyond the limit")

    monkeypatch.setattr(
        "shardio.cli.demo.run_demo", refuse
    )  # an unbounded -j must not start 1000 workers here
    monkeypatch.setattr("shardio.packing.pack.pack", refuse)
    command = [name, str(tmp_path / "corpus"), str(tmp_path / "out")][: 2 if name == "demo" else 3]
    with pytest.raises(SystemExit) as exit:
        main([*command, "-j", "1000"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "-j/--workers" in err and f"limit of {limit}" in err and "'1000'" in err
    with pytest.raises(SystemExit) as exit:
        main([*command, "--workers", str(limit + 1)])
    assert exit.value.code == 2 and f"limit of {limit}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_demo_workers_keep_zero_and_refuse_negative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardio.cli import build_parser

    assert build_parser().parse_args(["demo", "-j", "0"]).workers == 0
    assert build_parser().parse_args(["demo", "-j", str(DEMO_MAX_WORKERS)]).workers == DEMO_MAX_WORKERS
    with pytest.raises(SystemExit) as exit:
        main(["demo", str(tmp_path / "demo"), "-j", "-1"])
    assert exit.value.code == 2 and ">= 0" in capsys.readouterr().err


@pytest.mark.parametrize("workers", [-1, DEMO_MAX_WORKERS + 1, 1000])
def test_run_demo_from_python_keeps_the_same_bound(tmp_path: Path, workers: int) -> None:
    from shardio import OptionError

    with pytest.raises(OptionError, match=f"from 0 to {DEMO_MAX_WORKERS}"):
        run_demo(tmp_path / "demo", num_files=2, workers=workers)
    assert not (tmp_path / "demo").exists()
