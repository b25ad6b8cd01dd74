"""Shared pytest fixtures. Keep each group's fixtures together under its heading."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/ is on sys.path (pytest puts the folder of a conftest.py without __init__.py there); its folders too,
# so that a test module imports the helpers of another folder's test module by name (names are unique across
# tests/) however few test files a run collects (tests/README.md)
sys.path.extend(
    str(folder)
    for folder in sorted(Path(__file__).parent.iterdir())
    if folder.is_dir() and not folder.name.startswith(("_", ".")) and str(folder) not in sys.path
)

from audio_factory import SHARED_CORPORA, make_folder_corpus, write_text, write_tone

# -- the node-local cache ------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def node_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test's node-local cache (``SHARDIO_CACHE_DIR``: remote index files, cached shards) is a
    session temporary directory, never the user's ``~/.cache``; worker processes inherit it."""
    directory = tmp_path_factory.mktemp("node_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SHARDIO_CACHE_DIR", str(directory))
        yield directory


# -- corpora for pack / index / verify / CLI tests ---------------------------------------------------


@pytest.fixture
def mixed_corpus(tmp_path: Path) -> Path:
    """A folder corpus with one file per input format (PCM16 WAV, FLAC, OGG/Vorbis, MP3), nested folders,
    ``.txt``/``.lab`` transcripts (one file without), and a non-audio file the reader must ignore."""
    root = tmp_path / "mixed"
    write_tone(root / "a_wav.wav", 0.4, 16000)
    write_tone(root / "b_flac.flac", 0.6, 22050, freq=330)
    write_tone(root / "sub" / "c_ogg.ogg", 0.5, 16000, freq=550)
    write_tone(root / "sub" / "deep" / "d_mp3.mp3", 0.7, 22050, freq=660)
    write_tone(root / "e_stereo.wav", 0.3, 8000, channels=2)
    write_text(root / "a_wav.txt", "the wav one\n")
    write_text(root / "b_flac.lab", "the flac one")
    write_text(root / "sub" / "c_ogg.txt", "the ogg one")
    write_text(root / "sub" / "deep" / "d_mp3.txt", "the mp3 one")
    write_text(root / "README.md", "not audio")
    return root


@pytest.fixture(scope="session")
def wav_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 short 8 kHz WAV tones with transcripts in 3 folders (read-only: do not modify it in a test)."""
    root = tmp_path_factory.mktemp("wav_corpus")
    make_folder_corpus(root, 48, formats=("wav", "wav", "flac"))
    return root


@pytest.fixture(scope="session")
def shared_corpora() -> Path:
    """The project's shared real corpora (``../shared/corpora``); the test is skipped
    where they are absent."""
    if not SHARED_CORPORA.is_dir():
        pytest.skip("the shared corpora are not here (they are not part of the repository)")
    return SHARED_CORPORA
