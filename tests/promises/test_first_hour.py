"""What a new user met in the first hour (issue 39): the ledger on the checkpoints users write, one meaning of
"step", and Lightning's warnings on an exact resume.

Real files throughout: the README loop's ``torch.save`` dict, an Accelerate ``save_state`` directory, a
Lightning ``.ckpt`` from a tiny in-process ``Trainer`` run; ``shardio trace`` and ``quarantine`` read each and
``quarantine`` writes a copy the same script resumes from.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning_fit import lightning_trainer
from sample_shards import make_uneven_dataset

from shardio import ShardDataset, StateError, World
from shardio.cli import main


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("first_hour") / "data"
    make_uneven_dataset(root, [9, 7, 5, 4], seed=2)
    return root


def make(data: Path, world: World | None = None) -> ShardDataset:
    return ShardDataset(str(data), batch_size=3, seed=0, world=world or World(0, 1))


def readme_checkpoint(data: Path, path: Path, steps: int) -> tuple[ShardDataset, list[list[str]]]:
    """The README loop's checkpoint after ``steps`` batches of epoch 0, and the keys
    of every batch trained."""
    ds, seen = make(data), []
    for step, batch in enumerate(ds, start=1):  # the README loop's global_step after its += 1
        seen.append(list(batch["keys"]))
        if step == steps:
            torch.save(
                {
                    "model": torch.nn.Linear(2, 2).state_dict(),
                    "loader": ds.state_after(batch),
                    "global_step": step,
                },
                path,
            )
            break
    return ds, seen


def test_trace_and_quarantine_read_a_torch_save_checkpoint_and_write_one_the_loop_resumes(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, healed = tmp_path / "ckpt.pt", tmp_path / "healed.pt"
    _, seen = readme_checkpoint(data, ckpt, steps=2)
    assert main(["trace", str(data), "--state", str(ckpt), "--step", "1", "--json"]) == 0  # old code: exit 2
    assert json.loads(capsys.readouterr().out)["keys"] == seen[1]
    rest = [list(b["keys"]) for b in _resumed(data, torch.load(ckpt, weights_only=True)["loader"])]
    bad = rest[0][0]
    assert _quarantine(data, ckpt, healed, "--key", bad) == 0
    assert "healed.pt['loader']" in capsys.readouterr().out
    loaded, original = torch.load(healed, weights_only=True), torch.load(ckpt, weights_only=True)
    assert loaded["global_step"] == 2 and torch.equal(loaded["model"]["weight"], original["model"]["weight"])
    after = [k for b in _resumed(data, loaded["loader"]) for k in b["keys"]]
    assert bad not in after and sorted(after + [bad]) == sorted(k for b in rest for k in b)


def _quarantine(data: Path, state: Path, out: Path, *selection: str) -> int:
    """The exit status of ``shardio quarantine DATA --state STATE SELECTION... --out OUT``."""
    return main(["quarantine", str(data), "--state", str(state), *selection, "--out", str(out)])


def _resumed(data: Path, state: dict[str, Any]) -> list[dict[str, Any]]:
    ds = make(data)
    ds.load_state_dict(state)
    return list(ds)


def test_a_checkpoint_holding_an_object_is_refused_and_nothing_in_it_runs(data: Path, tmp_path: Path) -> None:
    from shardio.ledger.checkpoints import read_checkpoint

    ckpt = tmp_path / "ckpt.pt"
    marker = tmp_path / "ran"
    torch.save({"loader": make(data).state_dict(), "hook": _Runs(str(marker))}, ckpt)
    with pytest.raises(StateError, match="weights_only=True"):
        read_checkpoint(str(ckpt))
    assert not marker.exists()


class _Runs:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def test_a_json_state_and_a_state_dict_without_a_state_are_told_apart(data: Path, tmp_path: Path) -> None:
    from shardio.ledger.checkpoints import read_checkpoint, write_checkpoint

    state, empty = tmp_path / "state.json", tmp_path / "empty.pt"
    state.write_text(json.dumps(make(data).state_dict()))
    found = read_checkpoint(str(state))
    assert found.kind == "json" and found.where == ()
    out = tmp_path / "again.json"
    write_checkpoint(found, found.state, str(out))
    assert json.loads(out.read_text()) == found.state
    torch.save({"model": {}}, empty)
    with pytest.raises(StateError, match="no shardio loader state"):
        read_checkpoint(str(empty))


def test_global_step_maps_through_each_epochs_plan(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = ShardDataset(str(data), max_duration=1.0, seed=0)  # duration batches: epochs of different lengths
    by_global = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        by_global += [(epoch, step, list(b["keys"])) for step, b in enumerate(ds)]
    state = tmp_path / "state.json"
    state.write_text(json.dumps(ds.state_dict()))
    for global_step in (0, len(by_global) // 2, len(by_global) - 1):
        for given, counted in ((str(global_step + 1), []), (str(global_step), ["--counted-from", "0"])):
            assert (
                main(["trace", str(data), "--state", str(state), "--global-step", given, *counted, "--json"])
                == 0
            )
            captured = capsys.readouterr()
            row = json.loads(captured.out)
            epoch, step, keys = by_global[global_step]
            assert (row["epoch"], row["step"], row["keys"]) == (epoch, step, keys)
            assert f"epoch {epoch} epoch step {step} (from 0)" in captured.err
            assert f"counted from {0 if counted else 1}" in captured.err


def test_trace_help_says_which_step_it_takes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["trace", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "from 0" in text and "--global-step" in text and "--counted-from" in text


def _fit(
    data: Path, root: Path, *, callback: bool, max_steps: int, ckpt_path: str | None = None
) -> list[str]:
    """A tiny in-process Lightning run (0 workers); the messages of the warnings it raised."""
    trainer, model, _ = lightning_trainer(lambda: make(data), root, callback=callback, max_steps=max_steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model(), ckpt_path=ckpt_path)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("callback", [True, False])
def test_lightning_warnings_on_an_exact_resume_are_silenced_by_the_callback_only(
    data: Path, tmp_path: Path, callback: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("pytorch_lightning")
    saved = warnings.filters[:]
    try:
        _fit(data, tmp_path, callback=callback, max_steps=2)
        caught = _fit(
            data, tmp_path / "again", callback=callback, max_steps=4, ckpt_path=str(tmp_path / "step=2.ckpt")
        )
    finally:
        warnings.filters[:] = saved
    wrong = [m for m in caught if "`__len__` defined" in m or "not resumable" in m]
    assert bool(wrong) != callback, wrong
    if callback:  # and the ledger reads the .ckpt: epoch step 2 is the batch after the checkpoint's two
        capsys.readouterr()
        assert (
            main(["trace", str(data), "--state", str(tmp_path / "step=2.ckpt"), "--step", "2", "--json"]) == 0
        )
        assert json.loads(capsys.readouterr().out)["keys"] == list(next(iter(_batches(data, 3)))["keys"])
        assert (
            main(
                ["trace", str(data), "--state", str(tmp_path / "step=2.ckpt"), "--global-step", "2", "--json"]
            )
            == 0
        )  # the .ckpt's global_step agrees with its state, so G maps
        assert json.loads(capsys.readouterr().out)["keys"] == list(next(iter(_batches(data, 3)))["keys"])


def _batches(data: Path, skip: int) -> list[dict[str, Any]]:
    return list(make(data))[skip - 1 :]


def test_trace_and_quarantine_read_and_write_an_accelerate_checkpoint(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from shardio.integrations.accelerate import track

    accelerator = Accelerator(cpu=True)
    ds = make(data)
    progress = track(accelerator, ds)
    batches = []
    for batch in ds:
        batches.append(list(batch["keys"]))
        progress.update(batch)
        if len(batches) == 2:
            break
    accelerator.save_state(str(tmp_path / "ckpt"))
    assert main(["trace", str(data), "--state", str(tmp_path / "ckpt"), "--step", "2", "--json"]) == 0
    bad = json.loads(capsys.readouterr().out)["keys"][0]
    assert _quarantine(data, tmp_path / "ckpt", tmp_path / "healed", "--key", bad) == 0
    resumed, restarted = make(data), Accelerator(cpu=True)  # the resumed script's
    again = track(restarted, resumed)
    restarted.load_state(str(tmp_path / "healed"))
    assert again.epoch == 0
    keys = [k for b in resumed for k in b["keys"]]
    assert bad not in keys and len(keys) == len(resumed.index.keys) - 2 * 3 - 1


def test_a_resume_on_another_world_size_logs_one_info_line_with_the_padding(
    data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    two = make(data, World(0, 2))
    batch = next(iter(two))
    state = two.state_after(batch)
    three = make(data, World(1, 3))
    with caplog.at_level("INFO", logger="shardio.datasets.dataset"):
        three.load_state_dict(state)
    lines = [r.getMessage() for r in caplog.records if "world size changed" in r.getMessage()]
    repeated = sum(int(b["repeat"].sum()) for b in three)
    assert len(lines) == 1 and "from 2 to 3 at batch 1 of epoch 0" in lines[0], lines
    assert f"{len(three)} batches per rank, {repeated} samples repeated on rank 1" in lines[0]


def test_pack_help_shows_the_manifest_schema_and_the_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["pack", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "audio_filepath" in text and "id or key" in text and "a/b/utt1.wav -> utt1" in text
    assert "ranks x workers" in text


def test_quarantine_takes_a_trainers_global_steps(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds, trained = make(data), []
    for epoch in range(2):
        ds.set_epoch(epoch)
        trained += [list(b["keys"]) for b in ds]
    first_epoch = len(ds)
    ds.set_epoch(1)
    batch = next(iter(ds))
    state, out = tmp_path / "state.json", tmp_path / "healed.json"
    state.write_text(json.dumps(ds.state_after(batch)))  # epoch 1, after its first batch
    g = first_epoch + 2  # the third batch of epoch 1, logged as g + 1 by a loop that adds 1 before it logs
    assert _quarantine(data, state, out, "--global-steps", f"{g + 1}:{g + 2}") == 0
    assert "epoch 1 epoch steps 2:3" in capsys.readouterr().err
    healed = make(data)
    healed.load_state_dict(json.loads(out.read_text()))
    rest = {k for b in healed for k in b["keys"]}
    assert not rest & set(trained[g]) and rest == {k for b in trained[first_epoch + 1 :] for k in b} - set(
        trained[g]
    )
    assert _quarantine(data, state, out, "--global-steps", "1:2") == 2
    assert "a quarantine takes steps of the state's epoch 1" in capsys.readouterr().err


def test_a_stateful_dataloader_state_is_traced_and_its_rewrite_refused_loudly(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = make(data)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    trained = []
    for batch in loader:
        trained.append(list(batch["keys"]))
        if len(trained) == 3:
            break
    ckpt = tmp_path / "sdl.pt"
    torch.save({"loader": loader.state_dict(), "global_step": 3}, ckpt)
    del loader
    assert main(["trace", str(data), "--state", str(ckpt), "--step", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["keys"] == [list(b["keys"]) for b in make(data)][3]
    assert _quarantine(data, ckpt, tmp_path / "out.pt", "--key", trained[0][0]) == 2
    assert "per-worker states" in capsys.readouterr().err and not (tmp_path / "out.pt").exists()


def test_a_global_step_the_checkpoint_contradicts_is_refused(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, wrong = tmp_path / "ckpt.pt", tmp_path / "wrong.pt"
    _, seen = readme_checkpoint(data, ckpt, steps=2)
    saved = torch.load(ckpt, weights_only=True)
    assert main(["trace", str(data), "--state", str(ckpt), "--global-step", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["keys"] == seen[1]
    saved["global_step"] = 7  # as gradient accumulation, or an earlier epoch cut short, would leave it
    torch.save(saved, wrong)
    assert main(["trace", str(data), "--state", str(wrong), "--global-step", "1"]) == 2
    assert "records global_step 7" in capsys.readouterr().err


def test_a_fifo_given_as_the_state_is_refused_without_waiting(data: Path, tmp_path: Path) -> None:
    from shardio.ledger.checkpoints import read_checkpoint

    fifo = tmp_path / "state.fifo"
    os.mkfifo(fifo)
    with pytest.raises(StateError, match="regular file"):
        read_checkpoint(str(fifo))


def test_the_number_the_getting_started_loop_logs_is_the_number_trace_takes(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The getting-started loop logs ``global_step`` after its ``+= 1``; ``trace --global-step N`` (and
    ``quarantine --global-steps N:N+1``) with a logged N names that line's batch, not the next one, and says
    how it counted; a count from 0 is one flag away. (It named the next batch, silently.)"""
    ds, logged = make(data), {}
    global_step, ckpt = 0, tmp_path / "ckpt.pt"
    for epoch in range(2):
        ds.set_epoch(epoch)
        for batch in ds:
            global_step += 1
            logged[global_step] = list(batch["keys"])  # log.write(f"{global_step} {keys}")
            if epoch == 1 and len(logged) == len(ds) + 2:
                torch.save({"loader": ds.state_after(batch), "global_step": global_step}, ckpt)
    for number in (1, len(ds), len(ds) + 1, max(logged)):
        assert main(["trace", str(data), "--state", str(ckpt), "--global-step", str(number), "--json"]) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out)["keys"] == logged[number]
        assert "counted from 1" in captured.err and "global_step after its += 1" in captured.err
    assert main(["trace", str(data), "--state", str(ckpt), "--global-step", "0"]) == 2
    assert "counted from 1, the first batch's is 1" in capsys.readouterr().err
    assert (
        main(
            ["trace", str(data), "--state", str(ckpt), "--global-step", "0", "--counted-from", "0", "--json"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["keys"] == logged[1]
    number, out = len(ds) + 4, tmp_path / "healed.pt"
    assert _quarantine(data, ckpt, out, "--global-steps", f"{number}:{number + 1}") == 0
    assert "counted from 1" in capsys.readouterr().err
    healed = make(data)
    healed.load_state_dict(torch.load(out, weights_only=True)["loader"])
    rest = [list(b["keys"]) for b in healed]
    assert logged[number] not in rest and logged[number + 1] in rest and logged[number - 1] in rest
