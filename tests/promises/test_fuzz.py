"""Fuzzing: damaged shards (.tar and .tar.zst) and index files; the reader returns the right bytes or raises a
ShardioError, never another exception and never a hang.

"The right bytes": a ``.tar.zst`` sample equals the original (zstd checksums every frame). A plain ``.tar``
has no checksum over member data, so a sample whose headers and keys still verify may carry the file's
changed data: then its members must be exactly the bytes now in the file at the indexed place, with the
original names and sizes (finding those is ``shardio verify``'s job, by SHA-256).
"""

from __future__ import annotations

import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sample_shards import make_uneven_dataset, wav_bytes

from shardio import Index, ShardWriter
from shardio.errors import ShardioError
from shardio.reading.reader import Reader

pytestmark = pytest.mark.timeout(180)

FUZZ = settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

Members = dict[str, bytes]


@dataclass
class Clean:
    """A pristine dataset, and what reading it gives."""

    index: Index
    members: list[Members]
    files: dict[str, bytes]
    data_at: list[dict[str, int]]
    """Plain .tar only: per sample, each member's data offset in its shard file."""


def read_all(reader: Reader) -> list[Members | ShardioError]:
    """Every sample's members, or the ShardioError reading it raised (any other exception fails the test)."""
    out: list[Members | ShardioError] = []
    for sample in range(len(reader.index)):
        try:
            out.append({ext: bytes(data) for ext, data in reader.members(sample).items()})
        except ShardioError as exc:
            out.append(exc)
    return out


@pytest.fixture(scope="module", params=["none", "zstd"])
def clean(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Clean:
    root = tmp_path_factory.mktemp(f"fuzz-{request.param}") / "ds"
    index = make_uneven_dataset(root, [3, 3], compression=request.param, duration_range=(0.02, 0.04))
    files = {path.name: path.read_bytes() for path in root.iterdir()}
    members = read_all(Reader(index))
    assert all(isinstance(m, dict) for m in members)
    data_at: list[dict[str, int]] = [{} for _ in members]
    if request.param == "none":
        for shard in range(len(index.shards)):
            with tarfile.open(index.shard_path(shard)) as archive:
                offsets = {m.name: m.offset_data for m in archive.getmembers()}
            for sample, key in enumerate(index.keys):
                if int(index.columns["shard"][sample]) == shard:
                    data_at[sample] = {ext: offsets[f"{key}.{ext}"] for ext in members[sample]}  # type: ignore[union-attr]
    return Clean(index, members, files, data_at)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def scratch(clean: Clean, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the clean dataset that examples damage, one file at a time, and restore."""
    target = tmp_path_factory.mktemp("scratch") / "ds"
    shutil.copytree(clean.index.root, target)
    return target


def damaged(directory: Path, name: str, data: bytes, original: bytes) -> Any:
    """Context: ``directory/name`` holds ``data`` inside, ``original`` again after."""

    class _Damage:
        def __enter__(self) -> None:
            (directory / name).write_bytes(data)

        def __exit__(self, *exc: object) -> None:
            (directory / name).write_bytes(original)

    return _Damage()


# -- mutations -----------------------------------------------------------------------------------------

OFFSETS = st.integers(min_value=0, max_value=1 << 20)
MUTATION = st.one_of(
    st.tuples(st.just("flip"), OFFSETS, st.integers(min_value=1, max_value=255)),
    st.tuples(st.just("truncate"), OFFSETS, st.just(0)),
    st.tuples(st.just("insert"), OFFSETS, st.binary(min_size=1, max_size=24)),
    st.tuples(st.just("shift"), OFFSETS, st.binary(min_size=1, max_size=24)),  # insert, keep the size
)


def mutate(data: bytes, mutations: list[tuple[str, int, Any]]) -> bytes:
    out = bytearray(data)
    for kind, offset, arg in mutations:
        position = offset % (len(out) + (kind != "flip")) if out else 0
        if kind == "flip" and out:
            out[position] ^= arg
        elif kind == "truncate":
            del out[position:]
        elif kind in ("insert", "shift"):
            out[position:position] = arg
            if kind == "shift":
                del out[len(out) - len(arg) :]
    return bytes(out)


@FUZZ
@given(shard=st.integers(min_value=0, max_value=1), mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_damaged_shards(
    clean: Clean, scratch: Path, shard: int, mutations: list[tuple[str, int, Any]]
) -> None:
    name = clean.index.shards[shard].name
    original = clean.files[name]
    data = mutate(original, mutations)
    index = Index.load(scratch)
    with damaged(scratch, name, data, original):
        results = read_all(Reader(index))
    for sample, got in enumerate(results):
        if isinstance(got, ShardioError) or got == clean.members[sample]:
            continue
        # only a same-size plain .tar can give changed data without an error: the file's bytes, as indexed
        assert index.shards[shard].codec == "none" and len(data) == len(original), (sample, got)
        assert int(index.columns["shard"][sample]) == shard
        assert {ext: len(b) for ext, b in got.items()} == {
            ext: len(b) for ext, b in clean.members[sample].items()
        }
        for ext, at in clean.data_at[sample].items():
            assert got[ext] == data[at : at + len(got[ext])], (sample, ext)


# -- index files ---------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for number, child in enumerate(value):
            found += paths(child, (*prefix, number))
    return found


def replace_at(document: Any, path: tuple[Any, ...], value: Any, drop: bool) -> Any:
    if not path:
        return value
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    if drop and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return document


def assert_right_or_shardio_error(clean: Clean, directory: Path) -> None:
    try:
        index = Index.load(directory)
    except ShardioError:
        return
    assert len(index) == len(clean.members)
    for sample, got in enumerate(read_all(Reader(index))):
        assert isinstance(got, ShardioError) or got == clean.members[sample], (sample, got)


@FUZZ
@given(data=st.data(), drop=st.booleans())
def test_damaged_index_json_fields(clean: Clean, scratch: Path, data: st.DataObject, drop: bool) -> None:
    original = clean.files["index.json"]
    header = json.loads(original)
    path = data.draw(st.sampled_from(paths(header)), label="path")
    value = data.draw(JSON_VALUES, label="value")
    text = json.dumps(replace_at(header, path, value, drop), allow_nan=True).encode()
    with damaged(scratch, "index.json", text, original):
        assert_right_or_shardio_error(clean, scratch)


@FUZZ
@given(
    name=st.sampled_from(["index.json", "index.columns"]),
    mutations=st.lists(MUTATION, min_size=1, max_size=3),
)
def test_damaged_index_bytes(
    clean: Clean, scratch: Path, name: str, mutations: list[tuple[str, int, Any]]
) -> None:
    original = clean.files[name]
    with damaged(scratch, name, mutate(original, mutations), original):
        assert_right_or_shardio_error(clean, scratch)


# -- pax records (keys too long for a ustar header) ----------------------------------------------------


@pytest.fixture(scope="module")
def pax_dataset(tmp_path_factory: pytest.TempPathFactory) -> Index:
    """One sample whose key needs a pax ``path`` record: ``NNN path=...`` in the data of an ``x`` member."""
    root = tmp_path_factory.mktemp("pax") / "ds"
    with ShardWriter(root) as writer:
        writer.write(
            "spk/" + "x" * 120,
            {"wav": wav_bytes(np.zeros(80, np.float32), 8000)},
            audio_ext="wav",
            num_frames=80,
            sample_rate=8000,
            channels=1,
        )
    return Index.load(root)


def read_with_pax_length(index: Index, length: bytes) -> Members:
    """Sample 0 with the first bytes of its pax record (its decimal length) replaced by ``length``."""
    path = Path(index.shard_path(0))
    original = path.read_bytes()
    assert original[512:516] == b"138 "  # the pax data block follows the x header
    try:
        path.write_bytes(original[:512] + length + original[512 + len(length) :])
        return {ext: bytes(data) for ext, data in Reader(Index.load(index.root)).members(0).items()}
    finally:
        path.write_bytes(original)


def test_pax_record_with_a_non_numeric_length(pax_dataset: Index) -> None:
    with pytest.raises(ShardioError, match="malformed pax record"):
        read_with_pax_length(pax_dataset, b"1x8")


def test_pax_record_longer_than_its_data(pax_dataset: Index) -> None:
    with pytest.raises(ShardioError):
        read_with_pax_length(pax_dataset, b"998")


def test_pax_record_of_length_zero(pax_dataset: Index) -> None:
    with pytest.raises(ShardioError):
        read_with_pax_length(pax_dataset, b"0  ")
