"""``shardio check-resume`` on real jobs: the README's ``train.py`` (one process; two ranks under torchrun,
two workers each) resumes exactly; variants of it that lose the loader state, load it after ``iter()`` or set
another epoch each report their first difference and its cause; a job that fails by itself is reported as
such, not as a difference; the workdir's entries that check-resume did not make are refused, never removed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sample_shards import make_uneven_dataset

REPO = Path(__file__).resolve().parents[2]


def readme_train() -> str:
    """The README's ``train.py``, as the user copies it."""
    text = (REPO / "README.md").read_text()
    start = text.index("```python\n", text.index("<!-- file: train.py -->")) + len("```python\n")
    return text[start : text.index("```", start)]


def variant(old: str, new: str, source: str | None = None) -> str:
    source = readme_train() if source is None else source
    assert old in source, old
    return source.replace(old, new)


NO_STATE = variant(
    '    loader.load_state_dict(ckpt["loader"])\n', "", variant('"loader": loader.state_dict(), ', "")
).replace('ckpt["global_step"], ckpt["loader"]["epoch"]', 'ckpt["global_step"], 0')
AFTER_ITER = variant(
    "    for batch in loader:\n",
    "    for i, batch in enumerate(loader):\n"
    "        if resuming:                                      # too late: this iteration has begun\n"
    '            loader.load_state_dict(ckpt["loader"]); resuming = False\n',
    variant(
        "global_step, first_epoch = 0, 0\n",
        'global_step, first_epoch = 0, 0\nresuming = os.path.exists("ckpt.pt")\n',
        variant('    loader.load_state_dict(ckpt["loader"])\n', ""),
    ),
)
EPOCH_ZERO = variant('ckpt["global_step"], ckpt["loader"]["epoch"]', 'ckpt["global_step"], 0')
NO_SET_EPOCH = variant("    loader.set_epoch(epoch)\n", "")


def check(
    tmp_path: Path, script: str, *options: str, launcher: tuple[str, ...] = (), args: tuple[str, ...] = ()
) -> tuple[int, str]:
    """Run check-resume on ``script`` (saved as train.py beside a small ``data/``) from ``tmp_path``."""
    if not (tmp_path / "data").exists():
        data, seconds = tmp_path / "data", (1.5, 3.0)
        make_uneven_dataset(data, [32, 32], seed=3, compression="zstd", duration_range=seconds)
    (tmp_path / "train.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "shardio.cli", "check-resume", "--workdir", "check", "--link", "data"]
    command += ["--link", "train.py", *options, "--", *(launcher or (sys.executable,)), "train.py", *args]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_the_readmes_train_py_resumes_exactly(tmp_path: Path) -> None:
    code, output = check(tmp_path, readme_train(), "--kill-at", "4")
    assert code == 0, output
    assert "killed (SIGKILL) after" in output and "exact: 12 batches over 1 rank(s)" in output
    assert (tmp_path / "check" / "resumed" / "ckpt.pt").is_file()
    assert not (tmp_path / "ckpt.pt").exists()  # the user's directory is not the runs'


@pytest.mark.slow
def test_the_readmes_train_py_under_torchrun_resumes_exactly(tmp_path: Path) -> None:
    torchrun = (str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2")
    # twice the corpus: 4 batches a rank an epoch, so that a kill landing a batch or two late (a busy machine)
    # still leaves the second restart batches to be killed in
    make_uneven_dataset(tmp_path / "data", [64, 64], seed=3, compression="zstd", duration_range=(1.5, 3.0))
    code, output = check(tmp_path, readme_train(), "--kill-at", "3", "--resumes", "2", launcher=torchrun)
    assert code == 0, output
    assert "exact: " in output and "over 2 rank(s)" in output
    assert output.count("killed (SIGKILL)") == 2


@pytest.mark.slow
def test_a_world_size_change_is_checked_exactly_once(tmp_path: Path) -> None:
    torchrun = (str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node={world}")
    code, output = check(tmp_path, readme_train(), "--kill-at", "3", "--world", "2", "--resume-world", "1",
                         launcher=torchrun)  # fmt: skip
    assert code == 0, output
    assert "resumed-1 run (world 1)" in output and "exact" in output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "kill_at", "kind", "cause"),
    [
        (NO_STATE, 7, "state never loaded", "loaded no loader state"),
        (AFTER_ITER, 7, "loaded after the first iter()", "once an iteration had begun"),
        (EPOCH_ZERO, 7, "another epoch", "is not the loaded state's (1)"),
    ],
    ids=["no-loader-state", "loaded-after-iter", "another-epoch"],
)
def test_a_broken_resume_reports_its_first_difference(
    tmp_path: Path, script: str, kill_at: int, kind: str, cause: str
) -> None:
    code, output = check(tmp_path, script, "--kill-at", str(kill_at))
    assert code == 1, output
    assert f"differs: {kind}" in output and cause in output
    if script is not NO_STATE:  # the first difference: the first batch after the checkpoint the restart loads
        killed = re.search(r"killed \(SIGKILL\) after (\d+) batches", output)
        assert killed, output
        yielded = int(killed.group(1))  # the kill lands a batch or two late on a busy machine
        # the job saves every 2 batches; the last yielded batch may not have been trained yet
        checkpoints = {2 * ((yielded - 1) // 2), 2 * (yielded // 2)}
        assert any(f"rank 0, trained batch {n}" in output for n in checkpoints), output
    assert "see docs/guides/" in output


def docs_plain_loop() -> str:
    """The plain DataLoader loop of docs/guides/checkpoint-resume.md (two workers), for three epochs."""
    text = (REPO / "docs" / "guides" / "checkpoint-resume.md").read_text()
    start = text.index("```python\n", text.index("## A plain loop with `DataLoader`")) + len("```python\n")
    return variant("epochs = 0, 0, 2", "epochs = 0, 0, 3", text[start : text.index("```", start)])


@pytest.mark.slow
def test_a_dataloader_loop_recorded_in_its_workers_resumes_exactly(tmp_path: Path) -> None:
    code, output = check(tmp_path, docs_plain_loop(), "--kill-at", "12")  # workers run 4 batches ahead
    assert code == 0, output
    assert "exact: " in output
    assert len(list((tmp_path / "check" / "logs" / "straight").iterdir())) > 1  # a file per worker process


@pytest.mark.slow
def test_a_loop_without_set_epoch_still_resumes_exactly(tmp_path: Path) -> None:
    """shardio's loaders move on to the next epoch by themselves: a loop that never calls set_epoch trains
    the same batches straight and resumed (each epoch in its own order), so the check finds nothing."""
    code, output = check(tmp_path, NO_SET_EPOCH, "--kill-at", "7")
    assert code == 0, output


SLOW_JOB = """
import os, sys, time
if os.path.exists("started"):                       # the restart: refused, as a trainer refuses a checkpoint
    sys.exit("StateError: this checkpoint has no loader state")
open("started", "w").close()
time.sleep(float(sys.argv[1]))
"""


def test_a_job_that_fails_by_itself_is_not_a_difference(tmp_path: Path) -> None:
    code, output = check(tmp_path, SLOW_JOB, "--kill-after", "1", launcher=(sys.executable,), args=("3",))
    assert code == 4, output
    assert "resumed-1 run exited with code 1 on its own" in output and "StateError" in output
    assert "differs" not in output


def test_a_job_that_ends_before_the_kill_has_nothing_to_check(tmp_path: Path) -> None:
    code, output = check(tmp_path, SLOW_JOB, "--kill-after", "30", args=("0",))
    assert code == 5, output
    assert "before the kill" in output


@pytest.mark.slow
def test_a_training_job_refused_on_restart_is_not_a_difference(tmp_path: Path) -> None:
    refusing = variant(
        'if os.path.exists("ckpt.pt"):' + " " * 29 + "# resume where the last checkpoint stood\n",
        'if os.path.exists("ckpt.pt"):\n'
        '    raise SystemExit("StateError: this checkpoint has no loader state")\n'
        "if False:\n",
    )
    code, output = check(tmp_path, refusing, "--kill-at", "4")
    assert code == 4, output
    assert "resumed-1 run exited with code 1 on its own" in output and "StateError" in output


def test_a_workdir_entry_check_resume_did_not_make_is_refused_and_kept(tmp_path: Path) -> None:
    mine = tmp_path / "check" / "straight"
    mine.mkdir(parents=True)
    (mine / "ckpt.pt").write_bytes(b"the user's")
    code, output = check(tmp_path, "raise SystemExit(0)\n", "--kill-at", "4")
    assert code == 3, output
    assert "was not made by check-resume" in output
    assert (mine / "ckpt.pt").read_bytes() == b"the user's"


def test_usage_errors(tmp_path: Path) -> None:
    code, output = check(tmp_path, "", "--kill-at", "2", "--resume-world", "2")
    assert code == 2 and "{world}" in output
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "shardio.cli", "check-resume", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--kill-at" in done.stderr


def test_the_docs_page_checks_the_readmes_own_train_py() -> None:
    page = (REPO / "docs" / "guides" / "check-resume.md").read_text()
    start = page.index("```python\n", page.index("<!-- file: train.py -->")) + len("```python\n")
    assert page[start : page.index("```", start)] == readme_train()


def test_steps_reach_the_job_through_its_environment(tmp_path: Path) -> None:
    script = 'import os\nopen("steps", "w").write(os.environ["SHARDIO_STEPS"])\n'
    code, output = check(tmp_path, script, "--kill-after", "30", "--steps", "7")
    assert code == 5, output  # it ends at once: before the kill
    assert (tmp_path / "check" / "straight" / "steps").read_text() == "7"


LIGHTNING_JOB = """
import sys
import torch
try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl
from torch.utils.data import DataLoader
from shardio import ShardDataset
from shardio.integrations.lightning import ShardioCallback

resume = ShardioCallback() if "--callback" in sys.argv else None

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(1, 8, kernel_size=400, stride=160)

    def training_step(self, batch, batch_idx):
        return self.conv(batch["audio"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())

    def train_dataloader(self):
        ds = ShardDataset("data/", max_duration=60.0, seed=0)
        return DataLoader(resume.attach(ds) if resume else ds, batch_size=None)

checkpoints = pl.callbacks.ModelCheckpoint(dirpath="ckpt/", every_n_train_steps=2, save_last=True)
trainer = pl.Trainer(max_epochs=3, callbacks=[checkpoints] + ([resume] if resume else []),
                     use_distributed_sampler=False, accelerator="cpu", logger=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model(), ckpt_path="last")
"""


@pytest.mark.slow
def test_a_plain_lightning_checkpoint_without_the_callback_retrains_the_epoch(tmp_path: Path) -> None:
    """A Lightning job without ShardioCallback: its checkpoint (after step 6, in epoch 1) holds no loader
    state, so the restart trains epoch 0 from its first batch where the straight run trained epoch 1."""
    pytest.importorskip("shardio.integrations.lightning")
    code, output = check(tmp_path, LIGHTNING_JOB, "--kill-at", "7")
    assert code == 1, output
    assert "differs: state never loaded" in output, output
    assert "restarted run: epoch 0 step 0 (the first batch after restart 1)" in output
    assert "the restarted Lightning run loaded no loader state" in output
    assert "see docs/trainers/lightning.md#without-the-callback" in output
    assert list((tmp_path / "check" / "resumed" / "ckpt").glob("last*.ckpt"))


@pytest.mark.slow
def test_the_same_lightning_job_with_the_callback_resumes_exactly(tmp_path: Path) -> None:
    pytest.importorskip("shardio.integrations.lightning")
    code, output = check(tmp_path, LIGHTNING_JOB, "--kill-at", "7", args=("--callback",))
    assert code == 0, output
    assert "exact: 12 batches over 1 rank(s)" in output
