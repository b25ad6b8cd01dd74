"""Fuzzing a dataset's index as an attacker would (issue 13): hostile ``index.json`` fields (shard names,
sizes, counts, paths) and hostile columns (with ``columns_sha256`` made to match, so that they get past the
hash).

Whatever the index says: ``Index.load`` and reading every sample raise only ``ShardioError``s, no file
outside the dataset root is opened (an audit hook watches every ``open``), and no allocation goes beyond
the documented bounds (:mod:`shardio.shards.indexchecks`): the same fuzz runs in a subprocess whose address
space is limited to its imports plus 256 MiB.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile import rewrite_columns, rewrite_header, run_limited
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sample_shards import make_uneven_dataset

from shardio import Index, ShardDataset
from shardio.errors import ShardioError
from shardio.shards.index import COLUMNS

pytestmark = pytest.mark.timeout(240)

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

_opened: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


@contextmanager
def watching_opens() -> Iterator[list[str]]:
    """Every path opened (by Python) inside the block."""
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-pristine")
    make_uneven_dataset(root / "ds", [3, 2], duration_range=(0.02, 0.05))
    make_uneven_dataset(root / "dz", [3, 2], compression="zstd", duration_range=(0.02, 0.05))
    (root / "secret.tar").write_bytes(b"root:x:0:0:secret\n" * 4096)
    return root / "ds"


HOSTILE_NAMES = st.sampled_from(
    [
        "../secret.tar",
        "/etc/passwd",
        "/dev/zero",
        "sub/../../secret.tar",
        "..",
        ".",
        "",
        "file:///etc/passwd",
        "http://127.0.0.1:1/x.tar",
        "s3://bucket/x.tar",
        "C:\\x.tar",
        "shard-000000.tar/..",
        "a" * 5000,
        "x\0y",
        "./shard-000000.tar",
        "shard-000001.tar",
        "index.npz",
        "index.json",
    ]
) | st.text(max_size=20)
HOSTILE_INTS = st.sampled_from([0, 1, -1, 2**31, 2**32 - 1, 2**32, 2**63, 10**18]) | st.integers(-5, 10**6)
HEADER_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": HOSTILE_NAMES,
    "bytes": HOSTILE_INTS,
    "samples": HOSTILE_INTS,
    "codec": st.sampled_from(["none", "zstd", "gzip", "bz2", "zstd-stream", "x", ""]),
    "columns_file": HOSTILE_NAMES,
    "header_samples": HOSTILE_INTS,
    "formats": st.lists(st.sampled_from(["wav", "flac", "mp3", "", "../x"]), max_size=3),
}


def check(root: Path, outside: Path) -> None:
    """Load and read everything: only ShardioErrors, and nothing opened outside ``root`` (``outside``, the
    secret file next to it, nor system files)."""
    base = os.path.realpath(root)
    with watching_opens() as opened:
        try:
            index = Index.load(root)
            for _ in ShardDataset(index, batch_size=2, shuffle=False, on_error="skip"):
                pass
        except ShardioError:
            pass
    parent = os.path.realpath(root.parent)
    resolved = [os.path.realpath(path) for path in opened]
    escaped = [
        path
        for path in resolved
        if path.startswith(("/etc", "/dev", "/proc"))
        or (path.startswith(parent + os.sep) and not path.startswith(base + os.sep))
    ]
    assert not escaped, escaped


def mutate_header(root: Path, field: str, value: Any, shard: int) -> None:
    def change(header: dict[str, Any]) -> None:
        if field in ("name", "bytes", "samples", "codec"):
            header["shards"][shard][field] = value
        elif field == "header_samples":
            header["samples"] = value
        else:
            header[field] = value

    rewrite_header(root, change)


@FUZZ
@given(field=st.sampled_from(sorted(HEADER_FIELDS)), shard=st.integers(0, 1), data=st.data())
@pytest.mark.parametrize("kind", ["ds", "dz"])
def test_hostile_index_json_fields(
    pristine: Path, tmp_path: Path, kind: str, field: str, shard: int, data: st.DataObject
) -> None:
    root = tmp_path / "case" / kind
    shutil.rmtree(root.parent, ignore_errors=True)
    shutil.copytree(pristine.parent, root.parent)
    mutate_header(root, field, data.draw(HEADER_FIELDS[field], label="value"), shard)
    check(root, root.parent / "secret.tar")


COLUMN_VALUES = st.sampled_from([0, 1, 2, 255, 2**16, 2**31, 2**32 - 1, 2**63]) | st.integers(0, 2**20)


def mutate_columns(root: Path, column: str, rows: list[int], value: int) -> None:
    def change(columns: dict[str, np.ndarray]) -> None:
        dtype = np.dtype(COLUMNS[column])
        columns[column][rows] = np.array(value % (1 << (8 * dtype.itemsize)), dtype=np.uint64).astype(dtype)

    rewrite_columns(root, change)


@FUZZ
@given(
    column=st.sampled_from(sorted(COLUMNS)),
    rows=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    value=COLUMN_VALUES,
)
@pytest.mark.parametrize("kind", ["ds", "dz"])
def test_hostile_columns(
    pristine: Path, tmp_path: Path, kind: str, column: str, rows: list[int], value: int
) -> None:
    root = tmp_path / "case" / kind
    shutil.rmtree(root.parent, ignore_errors=True)
    shutil.copytree(pristine.parent, root.parent)
    mutate_columns(root, column, rows, value)
    check(root, root.parent / "secret.tar")


_LIMITED = """
import random, shutil, sys
sys.path[:0] = {tests!r}
from pathlib import Path
from test_index_fuzz import check, mutate_columns, mutate_header
from shardio.shards.index import COLUMNS
rng = random.Random(13)
names = ["../secret.tar", "/dev/zero", "shard-000001.tar", "index.npz", "a/../../secret.tar"]
ints = [0, 1, 2**31, 2**32 - 1, 2**63, 10**18, 12345]
pristine = Path({pristine!r})
for case in range({cases}):
    root = Path({scratch!r}) / str(case) / ("ds", "dz")[case // 2 % 2]
    shutil.copytree(pristine.parent, root.parent)
    if case % 2:
        mutate_columns(root, rng.choice(sorted(COLUMNS)), [rng.randrange(5)], rng.choice(ints))
    else:
        field = rng.choice(["name", "bytes", "columns_file", "header_samples", "samples"])
        value = rng.choice(names) if field in ("name", "columns_file") else rng.choice(ints)
        mutate_header(root, field, value, rng.randrange(2))
    check(root, root.parent / "secret.tar")
    shutil.rmtree(root.parent)
print("ok", {cases})
"""


def test_the_fuzz_stays_within_its_memory_bound(pristine: Path, tmp_path: Path) -> None:
    tests = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
    code = textwrap.dedent(
        _LIMITED.format(tests=tests, pristine=str(pristine), scratch=str(tmp_path), cases=40)
    )
    result = run_limited(
        code, headroom_mb=256, timeout=180, preload="torch, hypothesis, shardio.datasets.dataset"
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok 40", result.stdout + result.stderr[-3000:]
