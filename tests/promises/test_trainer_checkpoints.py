"""Issue 46, trainer checkpoints as hostile input: a checkpoint that lost (or never had) shardio's state is a
refusal on a mid-epoch resume, never a restart; a tampered entry is a typed error; nothing of shardio's is
unpickled (Accelerate's ``custom_checkpoint_N.pkl`` is neither written nor read by shardio).

Real trainers in this process: a tiny Lightning ``Trainer`` (0 workers), an ``Accelerator(cpu=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning_fit import lightning_trainer
from sample_shards import make_uneven_dataset

from shardio import ShardDataset, StateError, World

STEPS = 9  # batches of 3 an epoch: 25 samples


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trainer_checkpoints") / "data"
    make_uneven_dataset(root, [9, 7, 5, 4], seed=2)
    return root


def make(data: Path) -> ShardDataset:
    return ShardDataset(str(data), batch_size=3, seed=0, world=World(0, 1))


# -- Lightning ---------------------------------------------------------------------------------------------


def _fit(
    data: Path, root: Path, *, callback: bool, max_steps: int, ckpt_path: str | None = None
) -> list[list[str]]:
    """A tiny in-process Lightning run (0 workers, a checkpoint every step); the keys of the batches it
    trained."""
    trainer, model, trained = lightning_trainer(
        lambda: make(data), root, callback=callback, max_steps=max_steps
    )
    trainer.fit(model(), ckpt_path=ckpt_path)
    return trained


@pytest.fixture(scope="module")
def lightning_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[str]]]:
    """Checkpoints of a run with ShardioCallback, one every step of 1.5 epochs; the keys it trained."""
    pytest.importorskip("pytorch_lightning")
    root = tmp_path_factory.mktemp("lightning_ckpt")
    return root, _fit(data, root, callback=True, max_steps=STEPS + 4)


def _tampered(source: Path, target: Path, entry: Any) -> Path:
    """``source`` with its ShardioCallback entry replaced by ``entry`` (removed where it is ``...``)."""
    checkpoint = torch.load(source, weights_only=True)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("ShardioCallback")]
    if entry is ...:
        del checkpoint["callbacks"][key]
    else:
        checkpoint["callbacks"][key] = entry
    torch.save(checkpoint, target)
    return target


@pytest.mark.parametrize(
    "step,entry",
    [(3, ...), (3, None), (3, {}), (3, {"loader": None}), (STEPS + 2, ...), (STEPS, {"loader": None})],
    ids=["missing", "None", "empty", "loader-None", "epoch-1", "last-batch"],
)  # mid-epoch 0, mid-epoch 1, after epoch 0's last batch (its on_train_batch_end)
def test_lightning_refuses_a_mid_epoch_resume_without_shardios_state(
    data: Path, lightning_run: tuple[Path, list[list[str]]], tmp_path: Path, entry: Any, step: int
) -> None:
    """Before: the resumed run trained the epoch again from its first batch (from the checkpoint at the
    epoch's last batch, epoch 0 again as epoch 1), with Lightning's generic warning only."""
    root, _ = lightning_run
    checkpoint = _tampered(root / f"step={step}.ckpt", tmp_path / "tampered.ckpt", entry)
    with pytest.raises(StateError, match="holds no shardio loader state"):
        _fit(data, tmp_path / "again", callback=True, max_steps=STEPS + 4, ckpt_path=str(checkpoint))


def test_lightning_resumes_exactly_from_its_own_checkpoint(
    data: Path, lightning_run: tuple[Path, list[list[str]]], tmp_path: Path
) -> None:
    root, trained = lightning_run
    again = _fit(
        data, tmp_path / "a", callback=True, max_steps=STEPS + 4, ckpt_path=str(root / "step=3.ckpt")
    )
    assert again == trained[3:]


@pytest.mark.parametrize(
    "entry",
    [[{"loader": None}], "loader", {"loader": [1, 2]}, {"loader": "\x1b[31mred"}],
    ids=["list", "string", "loader-list", "loader-string"],
)
def test_a_tampered_lightning_callback_entry_is_a_typed_error(
    data: Path, lightning_run: tuple[Path, list[list[str]]], tmp_path: Path, entry: Any
) -> None:
    """Before: a list entry was an AttributeError (``list.get``); a string loader was kept as the state."""
    root, _ = lightning_run
    checkpoint = _tampered(root / "step=3.ckpt", tmp_path / "tampered.ckpt", entry)
    with pytest.raises(StateError) as caught:
        _fit(data, tmp_path / "again", callback=True, max_steps=STEPS + 4, ckpt_path=str(checkpoint))
    assert "\x1b" not in str(caught.value)


# -- Accelerate --------------------------------------------------------------------------------------------


class _Planted:
    """What a hostile ``custom_checkpoint_0.pkl`` holds: unpickling it creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def _accelerate_checkpoint(data: Path, folder: Path, steps: int = 2) -> list[list[str]]:
    """An Accelerate ``save_state`` folder after ``steps`` trained batches of a tracked dataset; the keys of
    every batch of the epoch."""
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from shardio.integrations.accelerate import track

    accelerator, ds = Accelerator(cpu=True), make(data)
    progress = track(accelerator, ds)
    batches = [list(b["keys"]) for b in make(data)]
    for number, batch in enumerate(ds, start=1):
        progress.update(batch)
        if number == steps:
            break
    accelerator.save_state(str(folder))
    return batches


def _resumed(folder: Path, data: Path) -> tuple[ShardDataset, Any]:
    from accelerate import Accelerator

    from shardio.integrations.accelerate import track

    accelerator, ds = Accelerator(cpu=True), make(data)
    progress = track(accelerator, ds)
    accelerator.load_state(str(folder))
    return ds, progress


def test_accelerate_saves_the_loader_state_as_json_and_resumes_exactly(data: Path, tmp_path: Path) -> None:
    """Before: ``save_state`` pickled it into ``custom_checkpoint_0.pkl``."""
    batches = _accelerate_checkpoint(data, tmp_path / "ckpt")
    assert not list((tmp_path / "ckpt").glob("custom_checkpoint_*"))
    saved = json.loads((tmp_path / "ckpt" / "shardio_loader.json").read_text())
    assert (saved["format"], saved["epoch"], saved["start"]) == ("shardio-state", 0, 2)
    ds, progress = _resumed(tmp_path / "ckpt", data)
    assert progress.epoch == 0 and [list(b["keys"]) for b in ds] == batches[2:]


@pytest.mark.parametrize("with_state", [True, False])
def test_a_planted_custom_checkpoint_is_never_unpickled(data: Path, tmp_path: Path, with_state: bool) -> None:
    """Before: ``load_state`` unpickled the tracked progress's ``custom_checkpoint_0.pkl`` with
    ``weights_only=False``, and a planted one ran. Now shardio's state is JSON: without it the folder is
    refused before Accelerate reads a file (naming the pickle); with it, Accelerate finds a pickle that no
    registered object claims, and refuses it unread."""
    folder, marker = tmp_path / "ckpt", tmp_path / "ran"
    _accelerate_checkpoint(data, folder)
    torch.save({"state": _Planted(marker)}, folder / "custom_checkpoint_0.pkl")
    if not with_state:
        (folder / "shardio_loader.json").unlink(missing_ok=True)
        with pytest.raises(StateError, match=r"custom_checkpoint_0\.pkl: an older shardio's state"):
            _resumed(folder, data)
    else:
        with pytest.raises((StateError, RuntimeError)):
            _resumed(folder, data)
    assert not marker.exists()


def test_accelerate_refuses_a_folder_saved_without_track(data: Path, tmp_path: Path) -> None:
    """Before: Accelerate's RuntimeError (0 custom checkpoints for 1 registered object), not a StateError."""
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    Accelerator(cpu=True).save_state(str(tmp_path / "plain"))
    with pytest.raises(StateError, match="holds no shardio loader state"):
        _resumed(tmp_path / "plain", data)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"[" * 5000 + b"]" * 5000,
        b"[]",
        b"null",
        b'{"format": "shardio-state", "epoch": "\x1b[31m"}',
        json.dumps({"format": "shardio-state", "version": 99}).encode(),
    ],
    ids=["empty", "bad-json", "deep", "list", "null", "escape", "version"],
)
def test_a_tampered_accelerate_state_file_is_a_state_error(
    data: Path, tmp_path: Path, content: bytes
) -> None:
    folder = tmp_path / "ckpt"
    _accelerate_checkpoint(data, folder)
    (folder / "shardio_loader.json").write_bytes(content)
    with pytest.raises(StateError) as caught:
        _resumed(folder, data)
    assert "\x1b" not in str(caught.value)


def test_accelerate_state_file_that_is_a_fifo_or_a_directory_is_refused(data: Path, tmp_path: Path) -> None:
    import os

    folder = tmp_path / "ckpt"
    _accelerate_checkpoint(data, folder)
    (folder / "shardio_loader.json").unlink()
    os.mkfifo(folder / "shardio_loader.json")
    with pytest.raises(StateError, match="not a regular file"):
        _resumed(folder, data)


def test_track_names_its_file_once_per_accelerator(data: Path) -> None:
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from shardio import OptionError
    from shardio.integrations.accelerate import track

    accelerator = Accelerator(cpu=True)
    track(accelerator, make(data))
    with pytest.raises(OptionError, match="already tracks a dataset as 'shardio_loader'"):
        track(accelerator, make(data))
    track(accelerator, make(data), name="second")
    for name in ["../up", "a/b", "", ".hidden", "x" * 200]:
        with pytest.raises(OptionError, match="plain file name"):
            track(accelerator, make(data), name=name)


# -- HF Trainer --------------------------------------------------------------------------------------------


def _trainer_state(data: Path, tmp_path: Path) -> dict[str, Any]:
    """A ShardioTrainer checkpoint's ``trainer_state.json`` after 2 batches, as the Trainer writes it."""
    pytest.importorskip("transformers")
    from transformers import TrainerState

    ds = make(data)
    state = ds.state_after({"epoch": 0, "batch_index": 1})
    entry = {"args": {}, "attributes": {"loader_state": state}}
    saved = TrainerState(global_step=2)
    saved.stateful_callbacks = {"ShardioLoaderState": entry}
    saved.save_to_json(str(tmp_path / "written.json"))
    return json.loads((tmp_path / "written.json").read_text())


def _hf_train(data: Path, tmp_path: Path, checkpoint: Path) -> None:
    import torch
    from transformers import TrainingArguments

    from shardio.integrations.transformers import ShardioTrainer

    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], disable_tqdm=True)
    trainer = ShardioTrainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=make(data))
    trainer.train(resume_from_checkpoint=str(checkpoint))


_ESC = "\x1b[2J\u202e"


def _tampered_trainer_states(saved: dict[str, Any]) -> dict[str, bytes]:
    entry = saved["stateful_callbacks"]["ShardioLoaderState"]

    def with_(change: Any) -> bytes:
        copy = json.loads(json.dumps(saved))
        change(copy)
        return json.dumps(copy).encode()

    return {
        "attributes-null": with_(
            lambda s: s["stateful_callbacks"]["ShardioLoaderState"].update(attributes=None)
        ),
        "attributes-list": with_(
            lambda s: s["stateful_callbacks"]["ShardioLoaderState"].update(attributes=[1])
        ),
        "entry-string": with_(lambda s: s["stateful_callbacks"].update(ShardioLoaderState=_ESC)),
        "unknown-key": with_(lambda s: s.update({_ESC: 1})),
        "callbacks-string": with_(lambda s: s.update(stateful_callbacks=_ESC)),
        "callbacks-list": with_(lambda s: s.update(stateful_callbacks=[entry])),
        "global-step-string": with_(lambda s: s.update(global_step=_ESC)),
        "bad-json": b'{"global_step": 2, ' + _ESC.encode(),
        "not-utf8": b'{"global_step": "\xff\xfe"}',
        "deep": b'{"log_history": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "top-list": b"[]",
        "empty": b"",
    }


@pytest.mark.parametrize(
    "case",
    [
        "attributes-null",
        "attributes-list",
        "entry-string",
        "unknown-key",
        "callbacks-string",
        "callbacks-list",
        "global-step-string",
        "bad-json",
        "not-utf8",
        "deep",
        "top-list",
        "empty",
    ],
)
def test_a_tampered_hf_trainer_state_is_a_state_error(data: Path, tmp_path: Path, case: str) -> None:
    """Before: AttributeError ('NoneType'/'list'/'str' has no 'get'), TypeError (an unknown key, a string or
    list of callbacks), JSONDecodeError, UnicodeDecodeError or RecursionError out of ``train()``."""
    content = _tampered_trainer_states(_trainer_state(data, tmp_path))[case]
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_bytes(content)
    with pytest.raises(StateError) as caught:
        _hf_train(data, tmp_path, checkpoint)
    message = str(caught.value)
    assert "trainer_state.json" in message or "checkpoint-2" in message, message
    assert "\x1b" not in message and "\u202e" not in message


def test_a_trainer_state_that_is_a_fifo_is_refused_unread(data: Path, tmp_path: Path) -> None:
    import os

    pytest.importorskip("transformers")
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    os.mkfifo(checkpoint / "trainer_state.json")
    with pytest.raises(StateError, match="not a regular file"):
        _hf_train(data, tmp_path, checkpoint)


def test_trace_reads_an_hf_checkpoint_directory_as_one(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the directory was taken for an Accelerate one ('no shardio states among its
    custom_checkpoint_*.pkl files; register one dataset's progress (...accelerate.track)')."""
    from shardio.cli import main
    from shardio.ledger.checkpoints import read_checkpoint, write_checkpoint

    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    saved = _trainer_state(data, tmp_path)
    (checkpoint / "trainer_state.json").write_text(json.dumps(saved))
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    found = read_checkpoint(str(checkpoint))
    assert found.kind == "transformers" and found.where == (
        "stateful_callbacks",
        "ShardioLoaderState",
        "attributes",
        "loader_state",
    )
    assert main(["trace", str(data), "--state", str(checkpoint), "--step", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["keys"] == [list(b["keys"]) for b in make(data)][2]
    written = write_checkpoint(found, found.state, str(tmp_path / "copy"))
    assert written == str(tmp_path / "copy" / "trainer_state.json")
    assert json.loads(Path(written).read_text()) == saved
    assert (tmp_path / "copy" / "model.safetensors").read_bytes() == b"weights"
    plain = _tampered_trainer_states(saved)["attributes-null"]
    (checkpoint / "trainer_state.json").write_bytes(plain)
    with pytest.raises(StateError, match="HF Trainer checkpoint") as caught:
        read_checkpoint(str(checkpoint))
    assert "accelerate" not in str(caught.value).lower()


def test_trace_reads_an_accelerate_directory_of_either_form(data: Path, tmp_path: Path) -> None:
    from shardio.ledger.checkpoints import read_checkpoint

    _accelerate_checkpoint(data, tmp_path / "new")
    assert read_checkpoint(str(tmp_path / "new")).path.endswith("shardio_loader.json")
    old = tmp_path / "old"
    old.mkdir()
    state = json.loads((tmp_path / "new" / "shardio_loader.json").read_text())
    torch.save(state, old / "custom_checkpoint_0.pkl")  # what an older shardio's track() registered
    (old / "notes.json").write_bytes(b"[" * 1000)  # a file of the user's: skipped, named if nothing is found
    assert read_checkpoint(str(old)).state == state
    (old / "custom_checkpoint_0.pkl").unlink()
    with pytest.raises(StateError, match="notes.json"):
        read_checkpoint(str(old))
