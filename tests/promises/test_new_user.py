"""What a new user met with the README alone (issue 46, items 18 and 19): its quick start on a corpus without
transcripts and on LibriSpeech's longest utterances, the extras it names, and CI running what it tells a new
developer to run."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

from test_docs import page_blocks, run_block

from shardio import ShardDataset

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
LONGEST_LIBRISPEECH_S = 35.2  # the longest utterance of LibriSpeech's train, dev and test sets


def _quick_start() -> list:
    """The README's Python blocks, the first (the quick start) and the ``train.py`` one."""
    return [block for block in page_blocks(README) if block.language == "python" and block.not_run is None]


def test_the_readme_quick_start_runs_on_a_corpus_without_transcripts(tmp_path: Path) -> None:
    from shardio.packing.pack import pack
    from shardio.synth import make_corpus

    make_corpus(tmp_path / "corpus", num_files=12, min_seconds=0.5, max_seconds=1.5)
    for transcript in (tmp_path / "corpus").rglob("*.txt"):
        transcript.unlink()
    pack(tmp_path / "corpus", tmp_path / "data", samples_per_shard=4, progress=False)
    assert "text" not in next(iter(ShardDataset(str(tmp_path / "data"), batch_size=2)))
    run_block(_quick_start()[0], tmp_path)  # it printed batch["text"]: a KeyError on such a corpus


def test_the_readme_examples_keep_every_librispeech_utterance() -> None:
    budgets = [
        float(value)
        for block in _quick_start()
        for value in re.findall(r"max_duration=([0-9.]+)", block.code)
    ]
    assert budgets and min(budgets) >= LONGEST_LIBRISPEECH_S, budgets


def _extra(name: str) -> list[str]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    return [line.strip() for line in config["options.extras_require"][name].splitlines() if line.strip()]


def _minors(requirement: str) -> str:
    """``>=2.9,<2.10`` of ``torch>=2.9,<2.10``."""
    return re.sub(r"^[A-Za-z0-9_.-]+", "", requirement)


def test_each_trainer_extra_installs_what_the_trainer_needs() -> None:
    assert any(line.startswith("accelerate") for line in _extra("transformers"))  # the Trainer imports it
    speechbrain = {re.split(r"[<>=!~;\[ ]", line)[0]: line for line in _extra("speechbrain")}
    # torchaudio names no torch: the extra pins a pair that loads together (else pip adds the newest to any)
    assert {"speechbrain", "torch", "torchaudio"} <= set(speechbrain)
    assert _minors(speechbrain["torch"]) == _minors(speechbrain["torchaudio"]) != ""


def _readme_setup_commands() -> list[str]:
    section = README.read_text(encoding="utf-8").split("## Set-up for development", 1)[1]
    block = next(b for b in page_blocks(README) if b.language == "bash" and "tools/setup.sh" in b.code)
    assert block.code.splitlines()[0].split("#")[0].strip() in section
    return [line.split("  #")[0].strip() for line in block.code.splitlines() if line.strip()]


def test_ci_first_runs_the_readme_setup_commands_exactly_with_the_default_extras() -> None:
    commands = _readme_setup_commands()
    assert len(commands) == 2 and all(
        shlex.split(c)[:3] == ["bash", "tools/setup.sh", ".venv"] for c in commands
    )
    assert all(len(shlex.split(c.split("&&")[0])) == 3 for c in commands)  # no extras: the default, test
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    lines = [line.split("  #")[0].strip() for line in ci.splitlines()]
    positions = [lines.index(command) for command in commands]  # verbatim, each on a line of its own
    runs = [
        i
        for i, line in enumerate(lines)
        if line.startswith("tier ") or ("setup.sh" in line and "#" not in line)
    ]
    first_other = min(i for i in runs if i not in positions)  # the dev venv, the tiers
    assert positions == sorted(positions) and positions[-1] < first_other
