"""An index's fingerprint is checked against what it fingerprints (issue 46, item 5): ``index.json``'s
header, which records the columns' digest (hashed at load) and every shard's size and SHA-256. A fingerprint
copied from another dataset's ``index.json``, or a header edited under its fingerprint, is refused when the
index loads (so that dataset's states cannot resume here) and by ``shardio verify``; an upgrade from format 1
keeps its fingerprint verifiably (the fields it changed, recorded), and that record cannot vouch for more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import rewrite_header, to_format1
from sample_shards import make_uneven_dataset

from shardio import FormatError, Index, ShardDataset, StateError
from shardio.cli import main


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    make_uneven_dataset(a, [5, 3, 4], seed=1)
    make_uneven_dataset(b, [4, 6], seed=2)
    return a, b


def header(root: Path) -> dict[str, Any]:
    return json.loads((root / "index.json").read_text())


def test_a_copied_fingerprint_is_refused_at_load_and_by_verify(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = pair
    state = ShardDataset(str(a), batch_size=2).state_after(next(iter(ShardDataset(str(a), batch_size=2))))
    assert main(["verify", str(b)]) == 0
    capsys.readouterr()
    rewrite_header(b, lambda h: h.update(fingerprint=header(a)["fingerprint"]), refingerprint=False)
    with pytest.raises(FormatError, match="fingerprint .* is not the digest of its header"):
        Index.load(str(b))
    with pytest.raises(FormatError, match="copied from another dataset"):
        ShardDataset(str(b), batch_size=2).load_state_dict(state)  # A's state never resumes on B
    assert main(["verify", str(b)]) != 0
    captured = capsys.readouterr()
    assert "is not the digest of its header" in captured.out + captured.err


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: h.update(duration=h["duration"] + 1.0),
        lambda h: h["shards"][0].update(sha256="0" * 64),
        lambda h: h.update(fingerprint=h["fingerprint"].upper()),
        lambda h: h.pop("fingerprint"),
    ],
)
def test_a_header_edited_under_its_fingerprint_is_refused(pair: tuple[Path, Path], edit: Any) -> None:
    _, b = pair
    rewrite_header(b, edit, refingerprint=False)
    with pytest.raises(FormatError, match="fingerprint"):
        Index.load(str(b))


def test_an_upgrade_record_vouches_only_for_the_fields_an_upgrade_changes(pair: tuple[Path, Path]) -> None:
    a, b = pair
    forged = {key: value for key, value in header(a).items() if key != "fingerprint"}
    rewrite_header(
        b, lambda h: h.update(fingerprint=header(a)["fingerprint"], upgraded_from=forged), refingerprint=False
    )
    with pytest.raises(FormatError, match="upgraded_from"):
        Index.load(str(b))
    wanted = {"columns_sha256": header(a)["columns_sha256"], "version": 1}
    rewrite_header(b, lambda h: h.update(upgraded_from=wanted), refingerprint=False)
    with pytest.raises(FormatError, match="not the digest of its header"):  # B's shards are not A's
        Index.load(str(b))


def test_an_upgraded_index_keeps_a_fingerprint_that_checks_and_its_states(pair: tuple[Path, Path]) -> None:
    a, _ = pair
    to_format1(a)
    before = Index.load(str(a)).fingerprint
    ds = ShardDataset(str(a), batch_size=2)
    state = ds.state_after(next(iter(ds)))
    assert main(["index", "--upgrade", str(a)]) == 0
    assert Index.load(str(a)).fingerprint == before
    ShardDataset(str(a), batch_size=2).load_state_dict(state)
    rewrite_header(
        a, lambda h: h["upgraded_from"].update(version=2), refingerprint=False
    )  # the record edited: no longer checks
    with pytest.raises(FormatError, match="fingerprint"):
        Index.load(str(a))


def test_a_states_fingerprint_from_another_index_is_still_refused(pair: tuple[Path, Path]) -> None:
    a, b = pair
    state = ShardDataset(str(a), batch_size=2).state_dict()
    with pytest.raises(StateError, match="index"):
        ShardDataset(str(b), batch_size=2).load_state_dict(state)
