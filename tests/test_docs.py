"""The docs cannot lie: every ```python and ```bash block of README.md and docs/**/*.md runs; the site builds.

Each page's blocks run in order, in a directory of the page's own that holds ``corpus/`` (40 short speech-like
16 kHz WAVs in one folder per speaker, each with a ``.txt`` transcript) and ``data/`` (that corpus packed, 4
shards): what the pages call them. A block that packs into ``data/`` (``shardio pack ... data/``)
starts without it, as a reader's would. A ``python`` block runs as a script; after ``<!-- file: NAME -->``
it is saved as NAME first, so that later blocks can run it (``torchrun ... NAME``). A ``bash`` block runs
under ``bash -euo pipefail`` with this Python's ``bin`` first on ``PATH`` (``shardio``, ``python``,
``torchrun``). A block that cannot run here (it installs packages, needs an object store or a cluster) is
preceded by ``<!-- not run: REASON -->``. Every block has :data:`BLOCK_TIMEOUT_S`.

The site test builds ``mkdocs.yml`` with ``mkdocs build --strict`` (no broken link, anchor or reference: the
command-line reference and the module map are generated from the code by the hooks in ``docs/hooks/``).
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCK_TIMEOUT_S = 300
"""The most seconds one block may run (a torchrun job of 2 ranks on a loaded 2-core machine takes ~30 s)."""
RUN_LANGUAGES = ("python", "bash")
README_MAX_LINES = 260
README_FIRST_PYTHON_BY = 60

_FENCE = re.compile(r"^```(\S*)\s*$")
_NOT_RUN = re.compile(r"^<!-- not run: (\S.*?) -->$")
_INSTALLS = re.compile(r"\b(pip3?|uv|conda|mamba)\s+(pip\s+)?install\b")
"""A command that would change the environment the tests run in (a ``pip install 'shardio[x]'`` block once
installed a torchaudio from the registry into CI's virtualenv, and the pages after it failed to import it)."""
_FILE = re.compile(r"^<!-- file: ([\w.-]+) -->$")
_MARKER = re.compile(r"^<!-- (not run|file)\b")
_PACKS_DATA = re.compile(r"^\s*shardio pack \S+ data/?(\s|$)", re.M)
_EXTRA = re.compile(r"shardio\[([a-z0-9_,-]+)\]")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    page: Path
    line: int
    """The line of its opening fence (1-based)."""
    language: str
    code: str
    not_run: str | None
    """The reason it does not run, from the ``<!-- not run: REASON -->`` line before it."""
    file: str | None
    """The file name it is saved as, from a ``<!-- file: NAME -->`` line before it."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """The top-level fenced blocks of ``page``, with the marker line before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, number = [], 0
    while number < len(lines):
        fence = _FENCE.match(lines[number])
        if fence is None:
            number += 1
            continue
        end = next((i for i in range(number + 1, len(lines)) if lines[i].strip() == "```"), None)
        assert end is not None, f"{page.relative_to(REPO)}:{number + 1}: a code block that never closes"
        before = next((lines[i] for i in range(number - 1, -1, -1) if lines[i].strip()), "")
        not_run, file = _NOT_RUN.match(before), _FILE.match(before)
        found.append(
            Block(
                page,
                number + 1,
                fence.group(1),
                "\n".join(lines[number + 1 : end]) + "\n",
                not_run.group(1) if not_run else None,
                file.group(1) if file else None,
            )
        )
        number = end + 1
    return found


def runnable(page: Path) -> list[Block]:
    return [b for b in page_blocks(page) if b.language in RUN_LANGUAGES and b.not_run is None]


# -- the pages' form ---------------------------------------------------------------------


def test_every_marker_stands_right_before_a_block_and_not_run_gives_a_reason() -> None:
    """A marker separated from its block by prose marks nothing (its block would run, or be skipped)."""
    misplaced = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if not _MARKER.match(line):
                continue
            if not (_NOT_RUN.match(line) or _FILE.match(line)):
                misplaced.append(f"{page.relative_to(REPO)}:{number + 1}: malformed marker {line!r}")
                continue
            after = next((lines[i] for i in range(number + 1, len(lines)) if lines[i].strip()), "")
            if not _FENCE.match(after):
                misplaced.append(
                    f"{page.relative_to(REPO)}:{number + 1}: {line!r} is not followed by a block"
                )
    assert not misplaced, "\n".join(misplaced)


def test_no_block_that_runs_installs_packages() -> None:
    """A block that installs packages must be marked not run: run here it would change this virtualenv for
    every later test."""
    installing = [block.where for page in PAGES for block in runnable(page) if _INSTALLS.search(block.code)]
    assert not installing, "blocks that install packages, mark them <!-- not run: ... -->: " + ", ".join(
        installing
    )


def test_every_extra_the_docs_name_exists() -> None:
    """``pip install 'shardio[x]'`` in a page works only if ``setup.cfg`` has the extra ``x``."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg", encoding="utf-8")
    extras = set(config["options.extras_require"])
    named = {
        (page.relative_to(REPO).as_posix(), extra)
        for page in PAGES
        for group in _EXTRA.findall(page.read_text(encoding="utf-8"))
        for extra in group.split(",")
    }
    missing = sorted(f"{page}: shardio[{extra}]" for page, extra in named if extra not in extras)
    assert not missing, f"extras named in the docs but not in setup.cfg: {missing}"


def test_the_readme_is_an_on_ramp() -> None:
    """The README stays short, with a runnable Python example near its top (everything else is in docs/)."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move material into docs/"
    first = next(b for b in runnable(REPO / "README.md") if b.language == "python")
    assert first.line <= README_FIRST_PYTHON_BY, f"the first runnable Python example is at line {first.line}"


def test_every_page_is_in_the_nav() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))

    def entries(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [page for item in nav for page in entries(item)]
        if isinstance(nav, dict):
            return [page for value in nav.values() for page in entries(value)]
        return []

    listed = set(entries(config["nav"]))
    pages = {p.relative_to(REPO / "docs").as_posix() for p in PAGES if p.is_relative_to(REPO / "docs")}
    assert not pages - listed, f"pages missing from mkdocs.yml's nav: {sorted(pages - listed)}"
    mounted = {"benchmarks/design.md"}  # docs/hooks/repo_files.py mounts benchmarks/README.md there
    assert not listed - pages - mounted, f"nav entries without a page: {sorted(listed - pages - mounted)}"


# -- every block runs ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def docs_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``corpus/`` and ``data/`` as the pages name them (copied into each page's directory)."""
    from shardio.packing.pack import pack
    from shardio.synth import make_corpus

    root = tmp_path_factory.mktemp("docs_data")
    make_corpus(root / "corpus", num_files=40, min_seconds=0.5, max_seconds=2.0)
    pack(root / "corpus", root / "data", samples_per_shard=10, progress=False)
    return root


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    env["NO_MKDOCS_2_WARNING"] = "1"
    return env


def _run(command: list[str], cwd: Path, block: Block) -> None:
    """Run ``command`` for ``block`` in a session of its own, killed whole (torchrun's ranks too) at the
    time limit."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(
            f"{block.where}: the {block.language} block ran past {BLOCK_TIMEOUT_S} s\n{output[-4000:]}"
        )
    if process.returncode != 0:
        pytest.fail(
            f"{block.where}: the {block.language} block exited {process.returncode}\n"
            f"--- block ---\n{block.code}--- output ---\n{output[-6000:]}"
        )


def run_block(block: Block, cwd: Path) -> None:
    """Run one block in ``cwd`` as the module docstring says."""
    if block.language == "bash":
        if _PACKS_DATA.search(block.code):
            shutil.rmtree(cwd / "data", ignore_errors=True)
        _run(["bash", "-euo", "pipefail", "-c", block.code], cwd, block)
        return
    script = cwd / (block.file or f"_block_{block.line}.py")
    script.write_text(block.code, encoding="utf-8")
    _run([sys.executable, script.name], cwd, block)


PAGES_WITH_BLOCKS = [page for page in PAGES if runnable(page)]


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(
    "page", PAGES_WITH_BLOCKS, ids=[page.relative_to(REPO).as_posix() for page in PAGES_WITH_BLOCKS]
)
def test_every_block_of_the_page_runs(page: Path, docs_data: Path, tmp_path: Path) -> None:
    for name in ("corpus", "data"):
        shutil.copytree(docs_data / name, tmp_path / name)
    for block in runnable(page):
        run_block(block, tmp_path)


# -- the site builds ----------------------------------------------------------------------


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict``: no broken link, anchor, nav entry or API reference; the hooks run."""
    needed = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
    missing = [name for name in needed if importlib.util.find_spec(name.split(".")[0]) is None]
    if missing:
        pytest.skip(f"the docs extra is not installed (pip install -e '.[docs]'): no {', '.join(missing)}")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(REPO / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=REPO,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").read_text().count("shardio pack") > 0
