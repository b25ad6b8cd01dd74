"""Issue 46, bounds: a trainer checkpoint, a manifest, a node plan lock and the shard cache each cost what
their bytes (or their option) justify, never hang, and fail with a typed error naming the value — a checkpoint
whose lists share references, a zip bomb for a ``data.pkl``, a device or a FIFO in an Accelerate folder,
a deep JSON line seen by kind detection, a FIFO or folder as a plan lock, and concurrent cache fills."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hostile import run_limited
from sample_shards import make_uneven_dataset

from shardio import ShardDataset, StateError
from shardio.errors import InputError
from shardio.ledger.checkpoints import MAX_WALK_DEPTH, read_checkpoint
from shardio.packing.corpus import detect_kind, read_corpus
from shardio.packing.manifestlines import MAX_DEPTH

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bounded_inputs") / "ds"
    make_uneven_dataset(root, [4, 3], seed=2)
    return root


@pytest.fixture(scope="module")
def state(dataset: Path) -> dict[str, Any]:
    ds = ShardDataset(dataset, batch_size=2, seed=1)
    return ds.state_after(next(iter(ds)))


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# -- 11: kind detection reads a manifest's first line as the bounded manifest reader does -------------------


@pytest.mark.parametrize("fields", ['"audio_filepath": "a.wav"', '"recording": {}, "supervisions": []'])
def test_a_deep_first_manifest_line_is_a_problem_naming_the_line_not_a_recursion_error(
    tmp_path: Path, fields: str
) -> None:
    """A 1,500-deep line (nemo's and lhotse's detectors parsed it with a bare ``json.loads``) was a
    RecursionError out of ``first_json_object`` before the manifest reader ran."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("{" + fields + ', "deep": ' + _deep(1500) + "}\n")
    assert detect_kind(manifest) == "jsonl"
    with pytest.raises(InputError, match=rf"m\.jsonl:1: .*nested more than {MAX_DEPTH} deep"):
        list(read_corpus(manifest))


# -- 8: the search for the state in a checkpoint visits each container once, bounded -------------------------


def _shared(levels: int) -> list[Any]:
    """``[a, a]`` of ``[b, b]`` ...: ``2**levels`` paths to the innermost list from a few hundred bytes."""
    shared: list[Any] = []
    for _ in range(levels):
        shared = [shared, shared]
    return shared


def test_a_checkpoint_of_shared_lists_is_read_at_once(tmp_path: Path, state: dict[str, Any]) -> None:
    """``{"model": [a, a] of [b, b] ... 31 deep}``: 2 KB that the walk took 2**31 paths to search (hours)."""
    path = tmp_path / "ckpt.pt"
    torch.save({"model": _shared(31), "loader": state}, path)
    assert path.stat().st_size < 4096
    code = (
        f"from shardio.ledger.checkpoints import read_checkpoint\nprint(read_checkpoint({str(path)!r}).where)"
    )
    try:
        result = _run(code, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("reading a 2 KB checkpoint of shared lists did not end in 60 s")
    assert result.returncode == 0 and result.stdout.split() == ["('loader',)"], result.stderr[-2000:]


def test_a_checkpoint_nested_deeper_than_the_walk_is_a_state_error(
    tmp_path: Path, state: dict[str, Any]
) -> None:
    path = tmp_path / "deep.pt"
    deep: list[Any] = []
    for _ in range(MAX_WALK_DEPTH + 5):
        deep = [deep]
    torch.save({"model": deep, "loader": state}, path)
    with pytest.raises(StateError, match=f"more than {MAX_WALK_DEPTH} deep"):
        read_checkpoint(str(path))
    shared_state = {"a": state, "b": [state]}  # one state reached twice: two places to write, refused
    torch.save(shared_state, path)
    assert read_checkpoint(str(path)).where is None


# -- 9: a torch.save zip's entries are bounded by its bytes before torch.load extracts them ------------------


def _deflated_bomb(path: Path, state: dict[str, Any], padding: int) -> None:
    """A ``torch.save`` zip whose ``data.pkl`` is deflated and followed by ``padding`` zero bytes (the
    unpickler stops at its STOP opcode; torch extracts the whole entry first)."""
    plain = path.with_suffix(".plain")
    torch.save({"model": torch.zeros(4), "loader": state}, plain)
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w") as out:
        for info in source.infolist():
            data = source.read(info)
            if not info.filename.endswith("/data.pkl"):
                out.writestr(info, data)
                continue
            bomb = zipfile.ZipInfo(info.filename)
            bomb.compress_type = zipfile.ZIP_DEFLATED
            with out.open(bomb, "w", force_zip64=True) as handle:
                handle.write(data)
                for _ in range(padding >> 20):
                    handle.write(bytes(1 << 20))


def test_a_deflated_data_pkl_is_refused_before_torch_extracts_it(
    tmp_path: Path, state: dict[str, Any]
) -> None:
    """256 MiB of zeros after the pickle, deflated to 250 KB: torch.load extracted it whole (a 1 MB file of
    1 GiB took 2.3 GB of memory); refused now from the zip's central directory, within 64 MiB of headroom."""
    path = tmp_path / "bomb.pt"
    _deflated_bomb(path, state, 256 << 20)
    assert path.stat().st_size < 1 << 20
    code = (
        "from shardio.errors import StateError\nfrom shardio.ledger.checkpoints import read_checkpoint\n"
        f"try:\n    read_checkpoint({str(path)!r})\nexcept StateError as exc:\n    print('refused', exc)\n"
    )
    result = run_limited(code, headroom_mb=64, preload="torch, shardio.ledger.checkpoints")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("refused") and "/data.pkl' declares 2684" in result.stdout, result.stdout
    assert read_checkpoint(str(path.with_suffix(".plain"))).where == ("loader",)  # torch.save's own: read
