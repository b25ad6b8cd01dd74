"""Issue 46, bounds: a trainer checkpoint, a manifest, a node plan lock and the shard cache each cost what
their bytes (or their option) justify, never hang, and fail with a typed error naming the value — a checkpoint
whose lists share references, a zip bomb for a ``data.pkl``, a device or a FIFO in an Accelerate folder,
a deep JSON line seen by kind detection, a FIFO or folder as a plan lock, and concurrent cache fills."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardio.errors import InputError
from shardio.packing.corpus import detect_kind, read_corpus
from shardio.packing.manifestlines import MAX_DEPTH

pytestmark = pytest.mark.timeout(300)


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# -- 11: kind detection reads a manifest's first line as the bounded manifest reader does -------------------


@pytest.mark.parametrize("fields", ['"audio_filepath": "a.wav"', '"recording": {}, "supervisions": []'])
def test_a_deep_first_manifest_line_is_a_problem_naming_the_line_not_a_recursion_error(
    tmp_path: Path, fields: str
) -> None:
    """A 1,500-deep line (nemo's and lhotse's detectors parsed it with a bare ``json.loads``) was a
    RecursionError out of ``first_json_object`` before the manifest reader ran."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("{" + fields + ', "deep": ' + _deep(1500) + "}\n")
    assert detect_kind(manifest) == "jsonl"
    with pytest.raises(InputError, match=rf"m\.jsonl:1: .*nested more than {MAX_DEPTH} deep"):
        list(read_corpus(manifest))
