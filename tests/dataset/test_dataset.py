"""ShardDataset's batches: contents, the in-place decode path, unbatched samples, options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sample_shards import make_uneven_dataset

from shardio import Decoding, OptionError, ShardDataset


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dataset")
    make_uneven_dataset(directory, [5, 17, 2, 9], seed=2, compression="zstd")
    return directory


def _identity(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return sample


def test_in_place_decoding_gives_the_same_batches_as_copying(dataset_dir: Path) -> None:
    fast = list(ShardDataset(dataset_dir, max_duration=2.0, seed=1))
    copied = list(
        ShardDataset(dataset_dir, max_duration=2.0, seed=1, decoding=Decoding(transform=_identity))
    )  # no in-place path
    assert len(fast) == len(copied) > 3
    for a, b in zip(fast, copied):
        assert a["keys"] == b["keys"]
        assert torch.equal(a["audio"], b["audio"]) and torch.equal(a["lengths"], b["lengths"])
        for row, length in enumerate(a["lengths"].tolist()):
            assert not a["audio"][row, :, length:].any()  # the padding is zero


def test_batches_hold_audio_lengths_rates_and_metadata(dataset_dir: Path) -> None:
    ds = ShardDataset(dataset_dir, batch_size=4, seed=0)
    batches = list(ds)
    assert len(batches) == len(ds)
    keys = [k for b in batches for k in b["keys"]]
    assert sorted(keys) == sorted(ds.index.keys)
    first = batches[0]
    assert first["audio"].dtype == torch.float32 and first["audio"].shape[:2] == (4, 1)
    assert first["sample_rate"].tolist() == [8000] * 4
    assert first["text"] == first["keys"]  # the json member's fields
    frames = {k: int(n) for k, n in zip(ds.index.keys, ds.index.columns["num_frames"])}
    assert first["lengths"].tolist() == [frames[k] for k in first["keys"]]


def test_unbatched_samples_and_options(dataset_dir: Path) -> None:
    samples = list(ShardDataset(dataset_dir, seed=0, shuffle=False))
    assert [s["key"] for s in samples] == ShardDataset(dataset_dir).index.keys  # index order without shuffle
    assert samples[0]["audio"].shape[0] == 1 and isinstance(samples[0]["audio"], torch.Tensor)
    resampled = next(iter(ShardDataset(dataset_dir, batch_size=2, sample_rate=16000, shuffle=False)))
    assert resampled["sample_rate"].tolist() == [16000, 16000]
    assert resampled["lengths"][0] == 2 * samples[0]["audio"].shape[1]
    with pytest.raises(OptionError):
        ShardDataset(dataset_dir, batch_size=2, max_duration=3.0)
    with pytest.raises(OptionError):
        ShardDataset(dataset_dir, on_error="ignore")


def test_a_dataset_of_several_sample_rates_warns_unless_resampled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from audio_factory import write_tone

    from shardio.packing.pack import pack

    for i in range(3):
        write_tone(tmp_path / "corpus" / f"low{i}.wav", 0.2, 8000)
    write_tone(tmp_path / "corpus" / "high.wav", 0.2, 16000)
    pack(tmp_path / "corpus", tmp_path / "mixed", progress=False)
    with caplog.at_level("WARNING", logger="shardio"):
        ShardDataset(tmp_path / "mixed", batch_size=4)
    assert "samples at 8000 Hz (3), 16000 Hz (1): batches mix sample rates" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="shardio"):
        ds = ShardDataset(tmp_path / "mixed", batch_size=4, sample_rate=16000)
        make_uneven_dataset(tmp_path / "one", (3,), sample_rate=8000)
        ShardDataset(tmp_path / "one", batch_size=4)
    assert not caplog.text
    assert set(next(iter(ds))["sample_rate"].tolist()) == {16000}
    from shardio import EpochSize, MixedDataset

    make_uneven_dataset(tmp_path / "two", (2,), sample_rate=16000)
    with caplog.at_level("WARNING", logger="shardio"):  # corpora of different rates in a mix
        MixedDataset(
            {"one": tmp_path / "one", "two": tmp_path / "two"},
            {"one": 1, "two": 1},
            EpochSize(primary="one"),
            batch_size=2,
        )
    assert "samples at 8000 Hz (3), 16000 Hz (2)" in caplog.text
