"""Hostile NeMo sharded manifests and shard patterns (``shardio index 'DIR/audio__OP_0..N_CL_.tar'
--nemo-manifest 'DIR/sharded_manifests/manifest__OP_0..N_CL_.json'``): every file a pattern names is data
that is refused with a typed error naming it, nothing is written, and no tar changes."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from test_nemo_patterns import write_sharded

from shardio.errors import InputError, OptionError, ShardioError
from shardio.integrations.importers.nemo_index import index_nemo

TARS = "audio__OP_0..2_CL_.tar"
MANIFESTS = "sharded_manifests/manifest__OP_0..2_CL_.json"


def _line(root: Path, shard: int, entry: dict[str, object]) -> None:
    with open(root / "sharded_manifests" / f"manifest_{shard}.json", "a") as handle:
        handle.write(json.dumps(entry) + "\n")


HOSTILE: dict[str, tuple[Callable[[Path], None], type[ShardioError], str]] = {
    "a sharded manifest missing": (
        lambda r: (r / "sharded_manifests" / "manifest_1.json").rename(
            r / "sharded_manifests" / "manifest_01.json"
        ),
        InputError,
        r"manifest_1\.json: no such manifest file \(named by",
    ),
    "a line of another shard": (
        lambda r: _line(r, 0, {"audio_filepath": "s1_u0.wav", "shard_id": 1}),
        InputError,
        r"manifest_0\.json:3.*shard_id 1 in the manifest of shard 0",
    ),
    "a member of another shard's tar": (
        lambda r: _line(r, 0, {"audio_filepath": "s1_u1.wav", "shard_id": 0}),
        InputError,
        r"audio_0\.tar has no readable audio member 's1_u1\.wav'",
    ),
    "a sharded manifest that is a directory": (
        lambda r: (
            (r / "sharded_manifests" / "manifest_2.json").unlink(),
            (r / "sharded_manifests" / "manifest_2.json").mkdir(),
        ),
        InputError,
        r"manifest_2\.json: cannot read the manifest: .*directory",
    ),
    "a FIFO for a sharded manifest": (
        lambda r: (
            (r / "sharded_manifests" / "manifest_2.json").unlink(),
            os.mkfifo(r / "sharded_manifests" / "manifest_2.json"),
        ),
        InputError,
        r"manifest_2\.json: cannot read the manifest",
    ),
    "a line over the limit": (
        lambda r: (r / "sharded_manifests" / "manifest_1.json").write_bytes(b"{" + b" " * (2 << 20) + b"}\n"),
        InputError,
        r"manifest_1\.json:1",
    ),
    "a path for a member": (
        lambda r: _line(r, 2, {"audio_filepath": "../s2_u0.wav", "shard_id": 2}),
        InputError,
        r"is a path",
    ),
    "a tar of the pattern missing": (
        lambda r: (r / "audio_2.tar").unlink(),
        InputError,
        r"shard_id 2: no file audio_2\.tar",
    ),
    "a pattern naming more files than the directory holds": (
        lambda r: [(r / "sharded_manifests" / f"manifest_{n}.json").unlink() for n in (1, 2)],
        OptionError,
        r"names 3 files and .* holds 1 entries",
    ),
}


def _digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.glob("audio_*.tar"))}


@pytest.mark.timeout(60)  # a FIFO read as a file would hang
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_sharded_manifests_are_refused_with_typed_errors(tmp_path: Path, case: str) -> None:
    write_sharded(tmp_path)
    spoil, error, message = HOSTILE[case]
    spoil(tmp_path)
    before = _digests(tmp_path)
    with pytest.raises(error, match=message):
        index_nemo(tmp_path / TARS, tmp_path / MANIFESTS, progress=False)
    assert not (tmp_path / "index.json").exists() and _digests(tmp_path) == before


def test_lines_outside_the_tars_pattern_and_tars_it_names_that_are_missing_are_refused(
    tmp_path: Path,
) -> None:
    write_sharded(tmp_path)
    with pytest.raises(InputError, match=r"shard_id 0 is outside the tars' pattern"):
        index_nemo(tmp_path / "audio__OP_1..2_CL_.tar", progress=False)  # the whole manifest: shard 0's too
    (tmp_path / "audio_2.tar").unlink()
    with pytest.raises(InputError, match=r"audio_3\.tar: the tars' pattern names it: no such file"):
        index_nemo(
            tmp_path / "audio__OP_1..3_CL_.tar", tmp_path / "sharded_manifests/manifest__OP_1..1_CL_.json"
        )
    assert not (tmp_path / "index.json").exists()
