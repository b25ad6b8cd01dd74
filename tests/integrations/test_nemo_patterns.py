"""NeMo's shard patterns (:mod:`shardio.integrations.importers.nemo_patterns`), and a tarred dataset indexed
in place through them: the tars' pattern a NeMo config names (``audio__OP_0..N_CL_.tar``) and its sharded
manifests' (``sharded_manifests/manifest__OP_0..N_CL_.json``), as NeMo's converter writes them."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from audio_factory import audio_bytes, tone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardio import ShardDataset
from shardio.cli import main
from shardio.errors import OptionError
from shardio.integrations.importers.nemo_index import index_nemo
from shardio.integrations.importers.nemo_patterns import is_pattern, parse_pattern


def write_sharded(root: Path, shards: int = 3, per_shard: int = 2) -> list[str]:
    """``audio_{n}.tar`` with ``per_shard`` WAVs each, ``tarred_audio_manifest.json`` and
    ``sharded_manifests/manifest_{n}.json`` (the same lines, shard by shard); the keys, in order."""
    (root / "sharded_manifests").mkdir(parents=True)
    keys, everything = [], []
    for shard in range(shards):
        lines = []
        with tarfile.open(root / f"audio_{shard}.tar", "w") as archive:
            for number in range(per_shard):
                key = f"s{shard}_u{number}"
                data = audio_bytes(tone(0.1 + 0.05 * number), 16000)
                info = tarfile.TarInfo(f"{key}.wav")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
                lines.append(
                    json.dumps({"audio_filepath": f"{key}.wav", "text": key, "shard_id": shard}) + "\n"
                )
                keys.append(key)
        (root / "sharded_manifests" / f"manifest_{shard}.json").write_text("".join(lines))
        everything += lines
    (root / "tarred_audio_manifest.json").write_text("".join(everything))
    return keys


@pytest.mark.parametrize(
    "given_as",
    [
        "audio__OP_1..3_CL_.tar",
        "audio_{1..3}.tar",
        "audio_(1..3).tar",
        "audio_[1..3].tar",
        "audio_<1..3>.tar",
    ],
)
def test_each_of_nemos_brace_forms_is_one_range(tmp_path: Path, given_as: str) -> None:
    for number in range(4):
        (tmp_path / f"audio_{number}.tar").touch()
    pattern = parse_pattern(str(tmp_path / given_as), "the tars")
    assert is_pattern(given_as) and (pattern.head, pattern.tail) == ("audio_", ".tar")
    assert list(pattern.numbers) == [1, 2, 3] and pattern.path(2) == str(tmp_path / "audio_2.tar")


@pytest.mark.parametrize(
    "name,message",
    [
        ("audio__OP_0,1_CL_.tar", "one range"),  # a list: NeMo expands it, its converter never writes one
        ("audio__OP_0..1_CL___OP_0..1_CL_.tar", "one range"),
        ("audio__OP_00..01_CL_.tar", "no leading zeros"),
        ("audio__OP_-1..1_CL_.tar", "one range"),
        ("audio__OP_3..1_CL_.tar", "ends"),
        ("audio__OP_0..99999999999_CL_.tar", "one range"),  # over 10 digits
        ("audio__OP_0..999999_CL_.tar", "names 1000000 files"),  # bounded by the directory's entries
        ("audio__OP_0..1.tar", "one range"),
    ],
)
def test_patterns_shardio_does_not_read_are_refused_by_name(tmp_path: Path, name: str, message: str) -> None:
    (tmp_path / "audio_0.tar").touch()
    with pytest.raises(OptionError, match=message):
        parse_pattern(str(tmp_path / name), "the tars")
    with pytest.raises(OptionError, match="not its directory"):
        parse_pattern(str(tmp_path / "d_OP_0..1_CL_" / "audio_0.tar"), "the tars")


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(alphabet="audio_OPCL.019{}()[]<>,-", min_size=1, max_size=30))
def test_any_name_is_a_range_in_its_directory_or_an_option_error(tmp_path: Path, name: str) -> None:
    (tmp_path / "audio_0.tar").touch()
    try:
        pattern = parse_pattern(str(tmp_path / name), "the tars")
    except OptionError:
        return
    assert pattern.first <= pattern.last and len(pattern.numbers) <= len(os.listdir(tmp_path))
    assert all(Path(pattern.path(number)).parent == tmp_path for number in pattern.numbers)


def test_the_patterns_of_a_nemo_config_index_the_same_dataset_as_its_directory(tmp_path: Path) -> None:
    keys = write_sharded(tmp_path)
    tars = tmp_path / "audio__OP_0..2_CL_.tar"
    manifests = tmp_path / "sharded_manifests" / "manifest__OP_0..2_CL_.json"
    assert main(["index", str(tars), "--nemo-manifest", str(manifests), "--no-progress"]) == 0
    by_pattern = [sample["key"] for sample in ShardDataset(tmp_path, shuffle=False)]
    index_nemo(tmp_path, overwrite=True, progress=False)
    assert [sample["key"] for sample in ShardDataset(tmp_path, shuffle=False)] == by_pattern
    assert sorted(by_pattern) == sorted(keys)
    texts = {sample["key"]: sample["text"] for sample in ShardDataset(tmp_path, shuffle=False)}
    assert texts == {key: key for key in keys}


def test_a_pattern_of_some_shards_indexes_those_only(tmp_path: Path) -> None:
    keys = write_sharded(tmp_path)
    index_nemo(
        tmp_path / "audio__OP_1..2_CL_.tar", tmp_path / "sharded_manifests" / "manifest__OP_1..2_CL_.json"
    )
    assert sorted(sample["key"] for sample in ShardDataset(tmp_path, shuffle=False)) == sorted(keys[2:])


def test_a_brace_pattern_without_the_manifest_option_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_sharded(tmp_path)
    assert main(["index", str(tmp_path / "audio__OP_0..2_CL_.tar"), "--no-progress"]) == 2
    assert "indexed with --nemo-manifest" in capsys.readouterr().err
