"""NeMo tarred audio datasets indexed in place (``shardio index DIR --nemo-manifest ...``): real tars written
as NeMo's converter writes them, read back with their manifest's text, ``-sub`` repeats included."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import resume_harness as harness
import soundfile as sf
from audio_factory import audio_bytes, make_folder_corpus, tone
from hostile import rewrite_header
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from remote_servers import HTTPFileServer
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import EpochSize, Index, MixedDataset, Ordering, ShardDataset
from shardio.cli import main
from shardio.errors import FormatError, InputError, OptionError, ShardioError
from shardio.integrations.exporters.nemo import export_nemo
from shardio.integrations.importers.nemo_index import index_nemo
from shardio.packing.verification import verify_dataset
from shardio.reading.reader import Reader
from shardio.shards.index import COLUMNS
from shardio.shards.indexfile import encode
from shardio.shards.keys import Keys
from shardio.shards.metadata import MAX_BYTES_PER_SAMPLE, Metadata

LONG = "x" * 120  # a member name ustar cannot hold: the tar gets a pax header before it


def write_tarred(root: Path, count: int = 10, shards: int = 3) -> dict[str, dict[str, Any]]:
    """A NeMo tarred dataset in ``root``: ``audio_{n}.tar`` and ``tarred_audio_manifest.json``, the last file
    of shard 1 listed twice (stored once, the repeat named ``-sub1``), one member with a long name. Returns
    what each key must read: its member name and text."""
    audio = make_folder_corpus(root / "src", count, formats=("wav", "flac"), subdirs=1, texts=False)
    expected: dict[str, dict[str, Any]] = {}
    lines = []
    for shard in range(shards):
        with tarfile.open(root / f"audio_{shard}.tar", "w") as archive:
            for number, path in enumerate(audio[shard::shards]):
                name = f"{LONG}{path.name}" if shard == 2 and number == 0 else path.name
                data = path.read_bytes()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
                lines.append(
                    {"audio_filepath": name, "duration": 0.5, "text": f"text of {name}", "shard_id": shard}
                )
                expected[name.rsplit(".", 1)[0]] = {"member": name, "text": f"text of {name}"}
        if shard == 1:
            last = lines[-1]["audio_filepath"]
            stem, ext = last.rsplit(".", 1)
            lines.append(
                {
                    "audio_filepath": f"{stem}-sub1.{ext}",
                    "duration": 0.5,
                    "text": "a second text",
                    "lang": "en",
                    "shard_id": 1,
                }
            )
            expected[f"{stem}-sub1"] = {"member": last, "text": "a second text"}
    (root / "tarred_audio_manifest.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return expected


def members(root: Path) -> dict[str, bytes]:
    found = {}
    for tar in sorted(root.glob("audio_*.tar")):
        with tarfile.open(tar) as archive:
            for info in archive:
                found[info.name] = archive.extractfile(info).read()  # type: ignore[union-attr]
    return found


def digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.glob("audio_*.tar"))}


@pytest.fixture(scope="module")
def nemo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("nemo")
    expected = write_tarred(root)
    before = digests(root)
    index_nemo(root)
    assert digests(root) == before  # in place: no tar changed
    return root, expected


def test_reads_members_with_manifest_text_through_workers(
    nemo: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    root, expected = nemo
    stored = members(root)
    ds = ShardDataset(root, batch_size=3, seed=1)
    seen: dict[str, tuple[np.ndarray, str, Any]] = {}
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        for row, key in enumerate(batch["keys"]):
            length = int(batch["lengths"][row])
            seen[key] = (batch["audio"][row, :, :length].numpy(), batch["text"][row], batch["duration"][row])
    assert sorted(seen) == sorted(expected)
    for key, (audio, text, duration) in seen.items():
        decoded, _ = sf.read(io.BytesIO(stored[expected[key]["member"]]), dtype="float32", always_2d=True)
        np.testing.assert_array_equal(audio, decoded.T)
        assert text == expected[key]["text"]
        assert duration == 0.5
    repeat = next(key for key in expected if key.endswith("-sub1"))
    np.testing.assert_array_equal(seen[repeat][0], seen[repeat[: -len("-sub1")]][0])


def test_index_keeps_metadata_and_shares_the_repeats_bytes(
    nemo: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    root, expected = nemo
    index = Index.load(root)
    assert index.has_metadata and len(index) == len(expected) == 11
    repeat = index.lookup(next(key for key in expected if key.endswith("-sub1")))
    original = index.lookup(index.key(repeat)[: -len("-sub1")])
    assert index.metadata(repeat) == {"duration": 0.5, "lang": "en", "text": "a second text"}
    assert index.member_key(repeat) == index.key(original) != index.key(repeat)
    for column in ("shard", "frame_offset", "frame_size", "member_size", "num_frames"):
        assert index.columns[column][repeat] == index.columns[column][original]
    assert [s.name for s in index.shards] == ["audio_0.tar", "audio_1.tar", "audio_2.tar"]
    assert verify_dataset(root, decode=True) == []
    state = pickle.dumps(index)  # as a spawned worker receives it: the mapped file by reference
    assert len(state) < 4096
    again = pickle.loads(state)
    assert again.metadata(repeat) == index.metadata(repeat) and again.member_key(repeat) == index.key(
        original
    )


def test_an_index_with_metadata_is_format_3_and_the_version_must_match(tmp_path: Path) -> None:
    """An older shardio refuses a metadata index by its version, not by a confusing mismatch; a header whose
    version and ``meta_bytes`` disagree is refused."""
    write_tarred(tmp_path / "nemo")
    index_nemo(tmp_path / "nemo")
    assert json.loads((tmp_path / "nemo" / "index.json").read_text())["version"] == 3
    make_uneven_dataset(tmp_path / "plain", [3])
    assert json.loads((tmp_path / "plain" / "index.json").read_text())["version"] == 2
    shutil.copytree(tmp_path / "nemo", tmp_path / "two")
    rewrite_header(tmp_path / "two", lambda header: header.update(version=2))
    with pytest.raises(FormatError, match="version-2 index cannot have 'meta_bytes'"):
        Index.load(tmp_path / "two")
    rewrite_header(tmp_path / "nemo", lambda header: header.pop("meta_bytes"))
    with pytest.raises(FormatError, match="version-3 index must have 'meta_bytes'"):
        Index.load(tmp_path / "nemo")


def test_cli_index_inspect_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_tarred(tmp_path, count=4, shards=2)
    manifest = tmp_path / "tarred_audio_manifest.json"
    assert main(["index", str(tmp_path), "--nemo-manifest", str(manifest)]) == 0
    assert "indexed 5 samples" in capsys.readouterr().out
    assert main(["index", str(tmp_path), "--nemo-manifest", str(manifest)]) == 2  # an index is there
    assert main(["index", str(tmp_path), "--nemo-manifest", str(manifest), "--overwrite"]) == 0
    assert main(["verify", str(tmp_path), "--decode"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["samples"], report["metadata"]) == (5, "index")
    assert main(["inspect", str(tmp_path)]) == 0
    assert "metadata     in the index" in capsys.readouterr().out
    assert main(["index", str(tmp_path / "audio__OP_0..1_CL_.tar"), "--nemo-manifest", str(manifest)]) == 2


def test_a_mix_reads_each_corpus_text(nemo: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path) -> None:
    root, expected = nemo
    make_uneven_dataset(tmp_path / "packed", [3, 2])
    # an index without metadata is laid out as before: no 'meta_bytes', no metadata sections
    assert "meta_bytes" not in json.loads((tmp_path / "packed" / "index.json").read_text())
    assert not Index.load(tmp_path / "packed").has_metadata
    ds = MixedDataset(
        {"nemo": root, "packed": tmp_path / "packed"},
        {"nemo": 0.5, "packed": 0.5},
        EpochSize(primary="nemo"),
        batch_size=4,
    )
    texts = {
        key: text
        for batch in DataLoader(ds, batch_size=None, num_workers=1)
        for key, text in zip(batch["keys"], batch["text"])
    }
    assert {key: texts[key] for key in expected if key in texts} == {
        key: value["text"] for key, value in expected.items() if key in texts
    }
    assert any(key.endswith("-sub1") for key in texts) and all(
        texts[k] == k for k in texts if k.startswith("s0")
    )


def test_reads_over_http_with_read_ahead(nemo: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    """Remote: the read-ahead coalesces a repeat's span with its first copy's (the same bytes)."""
    root, expected = nemo
    with HTTPFileServer(str(root)) as server:
        ds = ShardDataset(server.url, batch_size=4, seed=3, ordering=Ordering(shuffle_shards=1))
        local = {
            key: (audio, text)
            for batch in ShardDataset(root, batch_size=4, seed=3, ordering=Ordering(shuffle_shards=1))
            for key, audio, text in zip(batch["keys"], batch["audio"], batch["text"])
        }
        remote = [
            (key, audio, text)
            for batch in ds
            for key, audio, text in zip(batch["keys"], batch["audio"], batch["text"])
        ]
    assert sorted(key for key, _, _ in remote) == sorted(expected)
    for key, audio, text in remote:
        assert text == local[key][1] and bool((audio == local[key][0]).all())


def test_export_back_to_nemo_keeps_text_and_repeats(
    nemo: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    root, expected = nemo
    pattern = export_nemo(root, tmp_path / "manifest.json")
    assert pattern == str(root / "{audio_0.tar,audio_1.tar,audio_2.tar}")
    lines = [json.loads(line) for line in (tmp_path / "manifest.json").read_text().splitlines()]
    assert {line["audio_filepath"].rsplit(".", 1)[0]: line["text"] for line in lines} == {
        key: value["text"] for key, value in expected.items()
    }


def test_resume_through_the_harness(nemo: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    root, _ = nemo
    case = harness.Case(batching="fixed", workers=2, stops=(2,), epochs=2)
    dirs = {"main": str(root)}
    straight = harness.uninterrupted(case, dirs)
    assert len(straight) == 2 * 3 and harness.run(case, dirs) == harness.expected(case, straight)


def _append(root: Path, *entries: dict[str, Any]) -> None:
    with (root / "tarred_audio_manifest.json").open("a") as handle:
        handle.writelines(json.dumps(entry) + "\n" for entry in entries)


def _extra_member(root: Path) -> None:
    with tarfile.open(root / "audio_0.tar", "a") as archive:
        data = (root / "src" / "d0" / "utt00000.wav").read_bytes()
        info = tarfile.TarInfo("stray.wav")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))


HOSTILE = {
    "a path": (
        lambda r: _append(r, {"audio_filepath": "../x.wav", "shard_id": 0}),
        r"audio_filepath '\.\./x\.wav' is a path",
    ),
    "an absurd shard id": (
        lambda r: _append(r, {"audio_filepath": "utt00000.wav", "shard_id": 10**15}),
        r"shard_id 1000000000000000 is not between",
    ),
    "a shard not there": (
        lambda r: _append(r, {"audio_filepath": "utt00000.wav", "shard_id": 7}),
        r"shard_id 7: no file audio_7\.tar",
    ),
    "a missing member": (
        lambda r: _append(r, {"audio_filepath": "nowhere.wav", "shard_id": 0}),
        r"\(key 'nowhere'\): audio_0\.tar has no readable audio member 'nowhere\.wav'",
    ),
    "a duplicate key": (
        lambda r: _append(r, {"audio_filepath": "utt00000.wav", "shard_id": 0}),
        r"\(key 'utt00000'\): duplicate key \(first at .*:1\)",
    ),
    "a member no line names": (
        _extra_member,
        r"audio_0\.tar: member 'stray\.wav': no manifest line names this member",
    ),
    "a tar no line names": (
        lambda r: (r / "audio_9.tar").write_bytes((r / "audio_0.tar").read_bytes()),
        r"audio_9\.tar: no manifest line names this shard",
    ),
    "a dotted name": (
        lambda r: _append(r, {"audio_filepath": "a.b.wav", "shard_id": 0}),
        r"audio_filepath 'a\.b\.wav' is not \{key\}\.\{ext\} with a key that has no '\.'",
    ),
    "not an entry": (
        lambda r: _append(r, {"audio_filepath": "utt00000.wav", "shard_id": True}),
        r"not a tarred NeMo entry",
    ),
    "a reserved field": (
        lambda r: _append(r, {"audio_filepath": "utt00003.wav", "shard_id": 0, "__member_key__": "x"}),
        r"reserves",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_manifests_are_refused_with_typed_errors(tmp_path: Path, case: str) -> None:
    write_tarred(tmp_path, count=4, shards=2)
    spoil, message = HOSTILE[case]
    spoil(tmp_path)
    with pytest.raises(InputError, match=message):
        index_nemo(tmp_path)
    assert not (tmp_path / "index.json").exists()


def test_a_directory_or_the_tars_pattern_is_required(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="expected the directory that holds"):
        index_nemo(tmp_path / "missing")
    (tmp_path / "shard_0.tar").touch()
    with pytest.raises(OptionError, match="expected NeMo's tar names"):
        index_nemo(tmp_path / "shard__OP_0..0_CL_.tar")
    with pytest.raises(OptionError, match="names 4 files"):  # tmp_path holds one
        index_nemo(tmp_path / "audio__OP_0..3_CL_.tar")


def test_hostile_index_metadata_is_refused_before_it_is_mapped(tmp_path: Path) -> None:
    write_tarred(tmp_path, count=4, shards=2)
    index_nemo(tmp_path)
    samples = json.loads((tmp_path / "index.json").read_text())["samples"]
    rewrite_header(tmp_path, lambda header: header.update(meta_bytes=samples * MAX_BYTES_PER_SAMPLE + 1))
    with pytest.raises(
        FormatError, match="'meta_bytes' is .* more than 4096 bytes for each of the 5 samples"
    ):
        Index.load(tmp_path)
    rewrite_header(
        tmp_path, lambda header: header.update(meta_bytes=10000)
    )  # within the bound, not the file's
    with pytest.raises(FormatError, match="do not belong together"):
        Index.load(tmp_path)


def test_damaged_metadata_is_a_typed_error(tmp_path: Path) -> None:
    write_tarred(tmp_path, count=4, shards=2)
    index = index_nemo(tmp_path)
    blob = bytearray(index._meta.blob)  # type: ignore[union-attr]
    blob[0:1] = b"["  # no longer an object
    spoiled = Metadata(bytes(blob), index._meta.ends)  # type: ignore[union-attr]
    with pytest.raises(FormatError, match="metadata of sample 0 is not valid JSON"):
        spoiled.fields(0)
    ends = np.array(index._meta.ends)  # type: ignore[union-attr]
    ends[0] = 10**9
    with pytest.raises(FormatError, match="metadata of sample 0 spans bytes 0 to 1000000000"):
        Metadata(bytes(blob), ends).fields(0)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[list[str]], list[tuple[str, int, str]]]:
    """Tar members per shard and manifest lines ``(audio_filepath, shard_id, text)`` in manifest order: every
    member named once, some named again as ``-sub{n}`` repeats, lines of different shards interleaved."""
    shards = draw(st.integers(1, 3))
    files = draw(st.integers(1, 7))
    placement = draw(st.lists(st.integers(0, shards - 1), min_size=files, max_size=files))
    members: list[list[str]] = [[] for _ in range(shards)]
    lines: list[tuple[str, int, str]] = []
    for number, shard in enumerate(placement):
        stem = f"{'p' * 110 if draw(st.booleans()) else ''}f{number}"  # some need a pax header
        ext = draw(st.sampled_from(["wav", "flac"]))
        members[shard].append(f"{stem}.{ext}")
        lines.append((f"{stem}.{ext}", shard, f"text {number}"))
        for repeat in range(1, draw(st.integers(0, 2)) + 1):
            lines.append((f"{stem}-sub{repeat}.{ext}", shard, f"text {number} again {repeat}"))
    used = [s for s in range(shards) if members[s]]
    members = [members[s] for s in used]
    lines = [(name, used.index(shard), text) for name, shard, text in draw(st.permutations(lines))]
    return members, lines


@settings(max_examples=25, deadline=None)
@given(layout=layouts())
def test_every_manifest_line_reads_its_member_once(
    layout: tuple[list[list[str]], list[tuple[str, int, str]]],
) -> None:
    members, lines = layout
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        stored: dict[str, bytes] = {}
        for shard, names in enumerate(members):
            with tarfile.open(root / f"audio_{shard}.tar", "w") as archive:
                for number, name in enumerate(names):
                    data = audio_bytes(
                        tone(0.01 * (number + 1), 8000, seed=number), 8000, name.rsplit(".", 1)[1]
                    )
                    stored[name] = data
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
        (root / "tarred_audio_manifest.json").write_text(
            "".join(
                json.dumps({"audio_filepath": name, "shard_id": shard, "text": text}) + "\n"
                for name, shard, text in lines
            )
        )
        index = index_nemo(root)
        reader = Reader(index)
        try:
            order = sorted(range(len(lines)), key=lambda i: (lines[i][1], i))  # by shard, then manifest order
            assert [index.key(i) for i in range(len(index))] == [lines[i][0].rsplit(".", 1)[0] for i in order]
            for sample, line in enumerate(order):
                name, shard, text = lines[line]
                member = re.sub(r"-sub\d+(\.[^.]*)$", r"\1", name)
                assert int(index.columns["shard"][sample]) == shard
                assert index.metadata(sample) == {"text": text}
                assert bytes(reader.members(sample)[name.rsplit(".", 1)[1]]) == stored[member]
        finally:
            reader.close()
        assert verify_dataset(root) == []


HOSTILE_SIZES = st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 10**18]) | st.integers(0, 10**6)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    blob=st.binary(max_size=64)
    | st.sampled_from(
        [b"[]", b"{}", b'{"__member_key__": 7}', b'"x"', b"{" * 5000, b'{"__member_key__": "../../x"}']
    ),
    ends=st.lists(HOSTILE_SIZES, min_size=11, max_size=11),
    claimed=st.none() | HOSTILE_SIZES,
)
def test_hostile_metadata_sections_give_typed_errors(
    nemo: tuple[Path, dict[str, dict[str, Any]]],
    tmp_path: Path,
    blob: bytes,
    ends: list[int],
    claimed: int | None,
) -> None:
    """A columns file whose metadata (digest made to match) or its ``meta_bytes`` claim is hostile: loading,
    reading every sample and verifying raise only ShardioErrors."""
    root = tmp_path / "case"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(nemo[0], root, ignore=shutil.ignore_patterns("src"))
    index = Index.load(root)
    meta = Metadata(blob, np.array([e % 2**64 for e in ends], dtype=np.uint64))
    payload, digest = encode(
        {name: np.array(index.columns[name]) for name in COLUMNS},
        COLUMNS,
        Keys(bytes(index.keys.blob), np.array(index.keys.ends)),
        meta,
    )
    (root / "index.columns").write_bytes(payload)
    rewrite_header(
        root,
        lambda header: header.update(
            columns_sha256=digest, meta_bytes=len(blob) if claimed is None else claimed
        ),
    )
    try:
        loaded = Index.load(root)
        for _ in ShardDataset(loaded, batch_size=2, shuffle=False, on_error="skip"):
            pass
        verify_dataset(root)
    except ShardioError:
        pass
