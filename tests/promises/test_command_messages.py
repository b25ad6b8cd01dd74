"""Issue 46, left over from item 17: every command, not only ``pack``, prints the paths it was given or met
(a dataset directory, an index file, a shard, a state, ``--out``, the cache directory) escaped as keys are: a
name holding a newline, an escape sequence, a NUL-like control character or a right-to-left override (U+202E)
cannot forge, hide or recolour a line of what ``inspect``, ``verify``, ``index``, ``cache``, ``trace``,
``quarantine`` or ``remix`` print, on success or in an error."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from sample_shards import make_uneven_dataset

from shardio import EpochSize, Index, ShardDataset
from shardio.cli import main
from shardio.datasets.mixed import MixedDataset

FORGE = "\nshardio: all is well\x1b[2K\x1b[31m\u202e\x01"
"""A name that would print a forged line, erase and recolour the terminal's line, reverse the text, and hide a
control character (a NUL cannot be in a path; U+0001 stands for it)."""
RAW = ("\x1b", "\x01", "\u202e", "\nshardio: all is well")


class Places:
    """A dataset, a state of it, a mix's state, and a shard, each under a folder named with :data:`FORGE`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dataset = root / f"data{FORGE}"
        make_uneven_dataset(self.dataset, [3, 3], seed=1)
        self.other = root / f"other{FORGE}"
        make_uneven_dataset(self.other, [2], seed=2)
        self.shard = str(next(self.dataset.glob("*.tar")))
        loader = ShardDataset(str(self.dataset), batch_size=2, seed=0)
        next(iter(loader))
        self.state = root / f"state{FORGE}.json"
        self.state.write_text(json.dumps(loader.state_dict()))
        self.key = loader.index.keys[0]
        mix = MixedDataset(
            {"a": str(self.dataset), "b": str(self.other)},
            {"a": 0.5, "b": 0.5},
            EpochSize(primary="a"),
            seed=0,
        )
        mix.set_epoch(1)
        self.mix_state = root / f"mix{FORGE}.json"
        self.mix_state.write_text(json.dumps(mix.state_dict()))
        self.zip = root / f"checkpoint{FORGE}.pt"
        self.zip.write_bytes(b"PK\x03\x04" + b"not a zip torch.save wrote" * 4)
        self.no_audio = root / f"no-audio{FORGE}.tar"
        with tarfile.open(self.no_audio, "w") as tar:
            info = tarfile.TarInfo("utt1.txt")
            info.size = 5
            tar.addfile(info, io.BytesIO(b"hello"))
        self.broken = root / f"broken{FORGE}"
        shutil.copytree(self.dataset, self.broken)
        Path(self.broken / Path(self.shard).name).unlink()

    def out(self, name: str) -> str:
        return str(self.root / f"{name}{FORGE}")


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Places:
    return Places(tmp_path_factory.mktemp("messages"))


COMMANDS: dict[str, tuple[int, Callable[[Places], list[str]]]] = {
    # name: (exit status, argv)
    "inspect": (0, lambda p: ["inspect", str(p.dataset)]),
    "inspect-missing": (2, lambda p: ["inspect", p.out("missing")]),
    "inspect-not-an-index": (2, lambda p: ["inspect", str(p.state)]),
    "verify": (0, lambda p: ["verify", str(p.dataset), "--no-progress"]),
    "verify-missing": (2, lambda p: ["verify", p.out("missing"), "--no-progress"]),
    "verify-a-shard-missing": (1, lambda p: ["verify", str(p.broken), "--no-progress"]),
    "index": (0, lambda p: ["index", p.shard, "--out", p.out("index"), "--no-progress"]),
    "index-over-an-index": (2, lambda p: ["index", p.shard, "--out", str(p.dataset), "--no-progress"]),
    "index-missing-shard": (2, lambda p: ["index", p.out("missing") + ".tar", "--no-progress"]),
    "index-a-shard-without-audio": (
        2,
        lambda p: ["index", str(p.no_audio), "--out", p.out("no-audio-index"), "--no-progress"],
    ),
    "index-upgrade": (0, lambda p: ["index", "--upgrade", str(p.dataset)]),
    "cache": (0, lambda p: ["cache"]),
    "trace-missing-state": (
        2,
        lambda p: ["trace", str(p.dataset), "--state", p.out("missing"), "--step", "0"],
    ),
    "trace-missing-dataset": (
        2,
        lambda p: ["trace", p.out("missing"), "--state", str(p.state), "--step", "0"],
    ),
    "trace-a-bad-zip": (
        2,
        lambda p: ["trace", str(p.dataset), "--state", str(p.zip), "--step", "0"],
    ),
    "quarantine": (
        0,
        lambda p: [
            "quarantine",
            str(p.dataset),
            "--state",
            str(p.state),
            "--key",
            p.key,
            "--out",
            p.out("quarantined") + ".json",
        ],
    ),
    "remix": (
        0,
        lambda p: [
            "remix",
            f"a={p.dataset}",
            f"b={p.other}",
            "--state",
            str(p.mix_state),
            "--weight",
            "a=0.25",
            "--weight",
            "b=0.75",
            "--out",
            p.out("remixed") + ".json",
        ],
    ),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_prints_paths_escaped(
    places: Places, command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDIO_CACHE_DIR", places.out("cache"))
    status, argv = COMMANDS[command]
    code = main(argv(places))
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert code == status, text
    for raw in RAW:
        assert raw not in text, text
    assert "\\n" in text and "\\x1b" in text and "\\u202e" in text, text  # the path is there, escaped


def test_trace_and_quarantine_print_an_index_s_keys_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key is the dataset's data: an index written by someone else may hold one that forges a line (pack and
    ``index`` refuse such keys, the index loader does not read every key), so trace's and quarantine's text
    shows it escaped."""
    data = tmp_path / "data"
    make_uneven_dataset(data, [3, 3], seed=1)
    index = Index.load(str(data))
    keys = list(index.keys)
    forged = keys[-1] + FORGE  # the last batch's: the state is saved after the first
    Index(index.root, index.shards, index.formats, index.columns, _keys=[*keys[:-1], forged]).save()
    dataset = ShardDataset(str(data), batch_size=2, seed=0, shuffle=False)
    next(iter(dataset))
    state = tmp_path / "state.json"
    state.write_text(json.dumps(dataset.state_dict()))
    runs = [
        ["trace", str(data), "--state", str(state), "--step", "2"],
        ["trace", str(data), "--state", str(state), "--key", forged],
        ["quarantine", str(data), "--state", str(state), "--key", forged, "--out", str(tmp_path / "q.json")],
    ]
    for argv in runs:
        assert main(argv) == 0
        text = capsys.readouterr().out
        for raw in RAW:
            assert raw not in text, (argv, text)
        assert "\\x1b" in text, (argv, text)
