"""``shardio cache --decoded DIR``: what a decoded cache holds, and ``--clear``."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardio import Reading, ShardDataset
from shardio.cli.main import main
from tests.reading.test_decoded_cache import make_corpus


def test_the_decoded_cache_is_reported_and_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path / "corpus", "flac", count=6)
    cache = tmp_path / "decoded"
    dataset = ShardDataset(corpus, batch_size=2, reading=Reading(decoded_cache=str(cache)))
    list(dataset)
    assert dataset._decoded is not None
    dataset._decoded.close()
    assert main(["cache", "--decoded", str(cache)]) == 0
    shown = capsys.readouterr().out
    assert "1 datasets, 1 segments" in shown and " 0 bytes" not in shown
    assert main(["cache", "--decoded", str(cache), "--clear"]) == 0
    assert "0 datasets, 0 segments, 0 bytes; cleared 1 segments" in capsys.readouterr().out
    assert (cache / "secret").exists()  # what is not an entry stays
    assert main(["cache", "--clear"]) == 2
    assert main(["cache", "--decoded", str(cache), "--prune"]) == 2
