"""Hostile ESPnet mid-epoch checkpoints (``shardio_checkpoint.pth``, :mod:`shardio.integrations.espnet`): the
file is data. It is loaded with ``weights_only=True`` (a pickle that would run code is refused, and runs
nothing), checked field by field, and every refusal is a StateError naming the file. ESPnet itself is not
needed: the checkpoint is written and read by shardio's code alone."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from sample_shards import make_uneven_dataset

from shardio import ShardDataset
from shardio.errors import OptionError, StateError
from shardio.integrations.espnet import ShardioIterFactory
from shardio.integrations.espnet_checkpoint import load_checkpoint, save_checkpoint


def _collate(samples: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], dict[str, Any]]:
    return [key for key, _ in samples], {"speech": [data["speech"] for _, data in samples]}


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A checkpoint written after 2 batches of epoch 0."""
    root = make_uneven_dataset(tmp_path / "data", [4, 4])
    factory = ShardioIterFactory(ShardDataset(root, batch_size=2, seed=1), preprocess=None, collate=_collate)
    epoch = factory.build_iter(1)
    iterator = iter(epoch)
    next(iterator), next(iterator)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    path = tmp_path / "shardio_checkpoint.pth"
    stats = {"loss": [[0.5, 3.0], [None, 0.0]], "iter_time": [[0.1], [0.2]]}  # reporter_stats' form
    save_checkpoint(str(path), model, [optimizer], [None], None, factory.loader, epoch.epoch, 2, stats)
    return path


def test_a_checkpoint_round_trips_as_data(saved: Path) -> None:
    state = load_checkpoint(str(saved))
    assert state["epoch"] == 0 and state["step"] == 2 and state["loader"]["epoch"] == 0
    json.dumps(state["loader"])  # the loader's state is plain JSON
    assert state["reporter"] == {"loss": [[0.5, 3.0], [None, 0.0]], "iter_time": [[0.1], [0.2]]}


def test_a_version_1_checkpoint_without_statistics_still_loads(saved: Path) -> None:
    state = torch.load(saved, weights_only=True)
    del state["reporter"]
    torch.save({**state, "version": 1}, saved)
    assert load_checkpoint(str(saved))["reporter"] == {}


class _Runs:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("ran code",))


@pytest.mark.parametrize(
    "change",
    [
        lambda state: state.update(extra=1),
        lambda state: state.pop("loader"),
        lambda state: state.update(version=99),
        lambda state: state.update(epoch="0"),
        lambda state: state.update(loader="{not json"),
        lambda state: state.update(loader={"epoch": 0}),
        lambda state: state.pop("reporter"),
        lambda state: state.update(reporter="[1, 2]"),
        lambda state: state.update(reporter='{"loss": [[1.0], [1.0, 2.0, 3.0]]}'),
        lambda state: state.update(reporter='{"loss": [[1.0]], "acc": [[1.0], [2.0]]}'),
        lambda state: state.update(reporter='{"loss": [["x"]]}'),
        lambda state: state.update(reporter='{"loss": [[true]]}'),
        lambda state: state.update(reporter={"loss": [[1.0]]}),
    ],
    ids=[
        "extra-field", "no-loader", "version", "epoch-type", "loader-not-json", "loader-not-text",
        "no-statistics", "statistics-not-a-dict", "a-step-of-3-values", "unequal-steps", "a-string-value",
        "a-bool-value", "statistics-not-text",
    ],
)  # fmt: skip
def test_a_changed_checkpoint_is_a_state_error(saved: Path, change: Any) -> None:
    state = torch.load(saved, weights_only=True)
    change(state)
    torch.save(state, saved)
    with pytest.raises(StateError, match="shardio_checkpoint.pth"):
        load_checkpoint(str(saved))


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(
    saved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save({"model": _Runs()}, saved)
    with pytest.raises(StateError, match="not a shardio ESPnet checkpoint"):
        load_checkpoint(str(saved))
    saved.write_bytes(pickle.dumps(_Runs()))
    with pytest.raises(StateError, match="not a shardio ESPnet checkpoint"):
        load_checkpoint(str(saved))
    assert "ran code" not in capsys.readouterr().out


def test_garbage_and_empty_files_are_state_errors(saved: Path) -> None:
    for data in (b"", b"\x00" * 100, b"PK\x03\x04garbage"):
        saved.write_bytes(data)
        with pytest.raises(StateError, match="shardio_checkpoint.pth"):
            load_checkpoint(str(saved))


def test_the_factory_takes_only_a_batched_shard_dataset(tmp_path: Path) -> None:
    root = make_uneven_dataset(tmp_path / "data", [4, 4])
    with pytest.raises(OptionError, match="batched ShardDataset"):
        ShardioIterFactory(ShardDataset(root), preprocess=None, collate=_collate)
