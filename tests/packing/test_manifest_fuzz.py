"""Fuzzing manifests (issue 41): the hostile-dataset fuzz of shards and indexes (``test_fuzz.py``) extended to
the manifests ``shardio pack`` and ``shardio index --nemo-manifest`` read. Whatever the bytes, reading one
gives sources (or an index) or raises a ShardioError; never another exception, never more memory than a few
bounded lines, and never a hang: every case runs under a time limit."""

from __future__ import annotations

import json
import signal
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from audio_factory import write_tone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import MUTATION, mutate
from test_nemo_index import write_tarred

from shardio.errors import ShardioError
from shardio.integrations.importers.nemo_index import index_nemo
from shardio.packing.corpus import read_corpus
from shardio.packing.manifestlines import MAX_LINE_BYTES

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
CASE_SECONDS = 20  # a case that runs longer has hung
PEAK_BYTES = 4 * MAX_LINE_BYTES + (8 << 20)  # a few lines at their bound, and the readers' own state

HOSTILE_LINES = [
    b'{"audio_filepath": "a.wav", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"audio_filepath": "a.wav", "text": "' + b"x" * (3 * MAX_LINE_BYTES) + b'"}',
    b'{"audio_filepath": "a.wav", "text": "one", "text": "two"}',
    b'{"audio_filepath": "a.wav", "shard_id": 0, "shard_id": 0}',
    b'{"audio_filepath": "a.wav", "score": NaN, "big": 1e999}',
    b'{"audio_filepath": "a.wav", "n": ' + b"9" * 5000 + b"}",
    b'{"audio_filepath": "\xff\xfe.wav"}',
    b'{"audio_filepath": "../../../etc/passwd", "shard_id": 0}',
    b'{"audio_filepath": "/dev/zero", "shard_id": 0}',
    b'{"audio_filepath": "a.wav", "shard_id": 99999999999999999999}',
    b'{"audio_filepath": "a.wav", "keys": [1], "__member_key__": "b"}',
    b'["not", "an", "object"]',
    b"\xef\xbb\xbf" + b'{"audio_filepath": "a.wav"}',
    b"\0" * 4096,
    b"{" * 100_000,
]


@contextmanager
def bounded(limit_bytes: int, seconds: int) -> Iterator[None]:
    """Fail the case if it takes more than ``seconds`` (a hang: SIGALRM interrupts it) or its Python
    allocations peak above ``limit_bytes``."""

    def hung(*_: object) -> None:
        raise TimeoutError(f"a manifest case ran for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
        assert peak <= limit_bytes, f"a manifest case allocated {peak} bytes at its peak"
    finally:
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def only_shardio_errors(read: Callable[[], Any]) -> None:
    try:
        read()
    except ShardioError:
        pass


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A JSONL corpus of three WAVs and a NeMo tarred dataset, with their manifests' bytes."""
    jsonl = tmp_path_factory.mktemp("jsonl")
    for number, name in enumerate("abc"):
        write_tone(jsonl / f"{name}.wav", seed=number)
    (jsonl / "m.jsonl").write_text(
        "".join(
            json.dumps({"audio_filepath": f"{n}.wav", "text": f"text {n}", "duration": 1.0}) + "\n"
            for n in "abc"
        )
    )
    nemo = tmp_path_factory.mktemp("nemo")
    write_tarred(nemo, count=6, shards=2)
    return {
        "jsonl": jsonl,
        "nemo": nemo,
        "jsonl_bytes": (jsonl / "m.jsonl").read_bytes(),
        "nemo_bytes": (nemo / "tarred_audio_manifest.json").read_bytes(),
    }


def _read_every_way(corpora: dict[str, Any], jsonl: bytes, nemo: bytes) -> None:
    (corpora["jsonl"] / "m.jsonl").write_bytes(jsonl)
    nemo_manifest = corpora["nemo"] / "tarred_audio_manifest.json"
    nemo_manifest.write_bytes(nemo)
    with bounded(PEAK_BYTES, CASE_SECONDS):  # whatever the manifest's size: lines are read one at a time
        only_shardio_errors(lambda: list(read_corpus(corpora["jsonl"] / "m.jsonl", "jsonl")))
        only_shardio_errors(lambda: list(read_corpus(nemo_manifest, "nemo", problems=[], left_out=Counter())))
        only_shardio_errors(lambda: index_nemo(corpora["nemo"], overwrite=True, progress=False))


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=4))
def test_damaged_manifest_bytes(corpora: dict[str, Any], mutations: list[tuple[str, int, Any]]) -> None:
    _read_every_way(
        corpora, mutate(corpora["jsonl_bytes"], mutations), mutate(corpora["nemo_bytes"], mutations)
    )


@FUZZ
@given(line=st.sampled_from(HOSTILE_LINES), at=st.integers(0, 8), mutations=st.lists(MUTATION, max_size=2))
def test_hostile_manifest_lines(
    corpora: dict[str, Any], line: bytes, at: int, mutations: list[tuple[str, int, Any]]
) -> None:
    def spliced(original: bytes) -> bytes:
        lines = original.splitlines(keepends=True)
        position = at % (len(lines) + 1)
        return b"".join(lines[:position] + [mutate(line, mutations) + b"\n"] + lines[position:])

    _read_every_way(corpora, spliced(corpora["jsonl_bytes"]), spliced(corpora["nemo_bytes"]))


def test_every_case_is_timed_and_measured(corpora: dict[str, Any]) -> None:
    """The bounds themselves bite: a case that sleeps past its time, or holds more than its bound, fails."""
    with pytest.raises(TimeoutError), bounded(PEAK_BYTES, 1):
        time.sleep(3)
    with pytest.raises(AssertionError, match="allocated"), bounded(1 << 20, 5):
        data = bytearray(4 << 20)
        del data
