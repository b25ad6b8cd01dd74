"""Importers and the NeMo exporter against odd and hostile corpora: typed errors naming the input, never a
traceback, a hang, a silently wrong sample or a read outside the dataset."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from audio_factory import write_tone
from sample_shards import tar_members

from shardio import Index
from shardio.errors import InputError
from shardio.integrations.exporters.nemo import export_nemo
from shardio.integrations.importers.containers import read_member
from shardio.integrations.importers.nemo_index import index_nemo
from shardio.packing.pack import pack


@contextlib.contextmanager
def _fifo(path: Path) -> Iterator[Path]:
    """A FIFO at ``path``, and a thread that (while the block runs) opens it to write and closes it at once,
    so code that wrongly reads it gets an end of file within moments instead of blocking the test for ever."""
    os.mkfifo(path)
    done = threading.Event()

    def release() -> None:
        while not done.wait(0.05):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                    return

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        done.set()
        thread.join()


def _recording(source: str, stype: str = "file") -> dict[str, Any]:
    return {
        "id": "rec",
        "sources": [{"type": stype, "channels": [0], "source": source}],
        "sampling_rate": 8000,
        "num_samples": 8000,
        "duration": 1.0,
        "channel_ids": [0],
    }


def _cuts(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _cut(audio: Path, **fields: Any) -> str:
    cut = {
        "id": "c1",
        "start": 0.0,
        "duration": 1.0,
        "channel": 0,
        "supervisions": [],
        "type": "MonoCut",
        "recording": _recording(str(audio)),
        **fields,
    }
    return json.dumps(cut)


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"start": "abc"}, r"'start' is 'abc', expected a finite number of seconds >= 0"),
        ({"start": -0.5, "duration": 0.5}, r"'start' is -0\.5"),
        ({"start": 0.1, "duration": -0.5}, r"'duration' is -0\.5, expected a finite number of seconds > 0"),
        ({"duration": "x"}, r"'duration' is 'x'"),
        ({"channel": 1}, r"the cut takes channel\(s\) 1 of a recording with channels \[0\]"),
    ],
)
def test_lhotse_cut_times_and_channels_are_checked(
    tmp_path: Path, fields: dict[str, Any], expected: str
) -> None:
    audio = write_tone(tmp_path / "a.wav", 1.0, 8000)
    manifest = _cuts(tmp_path / "cuts.jsonl", [_cut(audio, **fields)])
    with pytest.raises(InputError, match=r"cuts\.jsonl:1\) \(key 'c1'\): " + expected):
        pack(manifest, tmp_path / "out", kind="lhotse", progress=False)
    assert not (tmp_path / "out" / "index.json").exists()


def test_lhotse_non_finite_times_and_bad_bytes_are_problems(tmp_path: Path) -> None:
    audio = write_tone(tmp_path / "a.wav", 1.0, 8000)
    recording = json.dumps(_recording(str(audio)))
    nan = _cuts(
        tmp_path / "nan.jsonl",
        [
            '{"id":"c1","start":NaN,"duration":0.5,"recording":' + recording + "}",
            '{"id":"c2","start":0.1,"duration":Infinity,"recording":' + recording + "}",
        ],
    )
    with pytest.raises(InputError, match=r"'start' is nan(.|\n)*'duration' is inf"):
        pack(nan, tmp_path / "o1", kind="lhotse", progress=False)
    (tmp_path / "bytes.jsonl").write_bytes(
        b'{"id":"c1","recording":{"id":"r"},"supervisions":[{"text":"\xff"}]}\n'
    )
    with pytest.raises(InputError, match=r"bytes\.jsonl:1: byte 59 of the line is not UTF-8"):
        pack(tmp_path / "bytes.jsonl", tmp_path / "o2", kind="lhotse", progress=False)
    (tmp_path / "bad.jsonl.gz").write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(InputError, match=r"bad\.jsonl\.gz: cannot read the manifest"):
        pack(tmp_path / "bad.jsonl.gz", tmp_path / "o3", kind="lhotse", progress=False)


def test_lhotse_shar_recordings_that_are_a_fifo_are_refused(tmp_path: Path) -> None:
    shar = tmp_path / "shar"
    shar.mkdir()
    (shar / "cuts.000000.jsonl").write_text(json.dumps({"id": "c1", "recording": _recording("x")}) + "\n")
    with (
        _fifo(shar / "recording.000000.tar"),
        pytest.raises(
            InputError, match=r"recording\.000000\.tar: cannot read the Shar recordings \(it is a FIFO"
        ),
    ):
        pack(shar, tmp_path / "out", kind="lhotse", progress=False)


def _nemo(root: Path, lines: list[bytes], audio: bytes) -> Path:
    with tarfile.open(root / "audio_0.tar", "w") as archive:
        info = tarfile.TarInfo("x.wav")
        info.size = len(audio)
        archive.addfile(info, io.BytesIO(audio))
    manifest = root / "tarred_audio_manifest.json"
    manifest.write_bytes(b"".join(line + b"\n" for line in lines))
    return manifest


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            b'{"audio_filepath":"x.wav","shard_id":0,"text":"\xff"}',
            r"manifest\.json:1: byte 47 of the line is not UTF-8",
        ),
        (
            b'{"audio_filepath":"x.wav","shard_id":0.7}',
            r"manifest\.json:1: .*shard_id is 0\.7, expected an integer",
        ),
        (b'{"audio_filepath":"x.wav","shard_id":false}', r"manifest\.json:1: .*shard_id is False"),
    ],
)
def test_nemo_manifest_bad_bytes_and_shard_ids_are_problems(
    tmp_path: Path, line: bytes, expected: str
) -> None:
    manifest = _nemo(tmp_path, [line], write_tone(tmp_path / "a.wav", 1.0, 8000).read_bytes())
    with pytest.raises(InputError, match=expected):
        pack(manifest, tmp_path / "out", kind="nemo", progress=False)


def test_nemo_tar_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    manifest = _nemo(tmp_path, [b'{"audio_filepath":"x.wav","shard_id":0}'], b"")
    os.unlink(tmp_path / "audio_0.tar")
    with (
        _fifo(tmp_path / "audio_0.tar"),
        pytest.raises(
            InputError,
            match=r"audio_0\.tar: cannot read the tar "
            r"\(it is a FIFO",
        ),
    ):
        pack(manifest, tmp_path / "out", kind="nemo", progress=False)
    with _fifo(tmp_path / "other.tar") as fifo, pytest.raises(OSError, match="it is a FIFO"):
        read_member(str(fifo), "x.wav")  # what a pack worker calls, should the tar be replaced by then


def test_nemo_offset_cuts_the_member_as_nemo_does(tmp_path: Path) -> None:
    line = b'{"audio_filepath":"x.wav","shard_id":0,"offset":0.25,"duration":0.5,"text":"t"}'
    manifest = _nemo(tmp_path, [line], write_tone(tmp_path / "a.wav", 1.0, 8000).read_bytes())
    pack(manifest, tmp_path / "out", kind="nemo", progress=False)
    index = Index.load(tmp_path / "out")
    assert int(index.columns["num_frames"][0]) == 4000  # 0.5 s of the 1 s member, not all of it
    with pytest.raises(InputError, match=r"offset 0\.25: NeMo reads \[offset, offset \+ duration\]"):
        index_nemo(tmp_path, progress=False)


def test_nemo_index_refuses_nan(tmp_path: Path) -> None:
    _nemo(
        tmp_path,
        [b'{"audio_filepath":"x.wav","shard_id":0,"duration":NaN}'],
        write_tone(tmp_path / "a.wav", 1.0, 8000).read_bytes(),
    )
    with pytest.raises(
        InputError, match=r"manifest\.json:1: not a valid manifest line: NaN is not a JSON value"
    ):
        index_nemo(tmp_path, progress=False)


def test_export_drops_a_segment_offset_and_round_trips(tmp_path: Path) -> None:
    write_tone(tmp_path / "a.wav", 1.0, 8000)
    write_tone(tmp_path / "b.wav", 0.5, 8000)
    entries = [
        {"audio_filepath": "a.wav", "text": "h\u00e9llo\u2028w\u00f6rld", "id": "ka"},
        {"audio_filepath": "a.wav", "offset": 0.25, "duration": 0.5, "text": "seg", "id": "kseg"},
        {"audio_filepath": "b.wav", "text": "bee", "id": "kb"},
    ]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    out, nemo = tmp_path / "out", tmp_path / "nemo"
    pack(tmp_path / "m.jsonl", out, progress=False)
    export_nemo(out)
    exported = [json.loads(line) for line in (out / "tarred_audio_manifest.json").read_text().splitlines()]
    assert all("offset" not in entry for entry in exported)  # NeMo would cut the cut segment again
    nemo.mkdir()
    for number, shard in enumerate(Index.load(out).shards):
        os.symlink(out / shard.name, nemo / f"audio_{number}.tar")
    (nemo / "tarred_audio_manifest.json").write_bytes((out / "tarred_audio_manifest.json").read_bytes())
    pack(nemo / "tarred_audio_manifest.json", tmp_path / "back", kind="nemo", progress=False)

    def facts(data: Path) -> dict[str, tuple[float, str]]:
        index, members = Index.load(data), tar_members(data)
        return {
            key: (
                int(index.columns["num_frames"][i]) / int(index.columns["sample_rate"][i]),
                json.loads(members[f"{key}.json"])["text"],
            )
            for i, key in enumerate(index.keys)
        }

    assert (
        facts(tmp_path / "back")
        == facts(out)
        == {"ka": (1.0, entries[0]["text"]), "kseg": (0.5, "seg"), "kb": (0.5, "bee")}
    )


def _saved(root: Path, rows: dict[str, Any]) -> Path:
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio())
    table.save_to_disk(str(root))
    return root


def test_hf_state_naming_files_outside_the_dataset_is_refused(tmp_path: Path) -> None:
    wav = write_tone(tmp_path / "a.wav", 1.0, 8000).read_bytes()
    victim = _saved(tmp_path / "victim", {"audio": [{"bytes": wav, "path": "a.wav"}], "text": ["secret"]})
    saved = _saved(tmp_path / "saved", {"audio": [{"bytes": wav, "path": "a.wav"}], "text": ["x"]})
    arrow = next(victim.glob("*.arrow"))
    for name in (str(arrow), f"../victim/{arrow.name}"):
        (saved / "state.json").write_text(json.dumps({"_data_files": [{"filename": name}]}))
        with pytest.raises(
            InputError, match=r"state\.json: the data file .* is not a file name inside the dataset"
        ):
            pack(saved, tmp_path / "out", kind="hf", progress=False)
    (saved / "state.json").write_bytes(b"{\xff")
    with pytest.raises(InputError, match=r"state\.json: not a saved dataset's state"):
        pack(saved, tmp_path / "out", kind="hf", progress=False)


def test_hf_bad_tables_and_values_are_problems_and_bytes_stay_out_of_metadata(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    wav = write_tone(tmp_path / "a.wav", 1.0, 8000).read_bytes()
    (tmp_path / "corrupt.parquet").write_bytes(b"PAR1garbagePAR1")
    with pytest.raises(InputError, match=r"corrupt\.parquet: cannot read the table's schema"):
        pack(tmp_path / "corrupt.parquet", tmp_path / "o1", kind="hf", progress=False)
    features = {"audio": {"_type": "Audio"}, "text": {"_type": "Value", "dtype": "string"}}
    lying = pa.table({"audio": ["x"], "text": ["y"]}).replace_schema_metadata(
        {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    )
    pq.write_table(lying, tmp_path / "lying.parquet")
    with pytest.raises(InputError, match=r"lying\.parquet:row 0 \(key '000000000'\): the Audio value is str"):
        pack(tmp_path / "lying.parquet", tmp_path / "o2", kind="hf", progress=False)
    two = _saved(
        tmp_path / "two",
        {
            "audio": [{"bytes": wav, "path": "a.wav"}],
            "text": ["x"],
            "other": [{"bytes": wav, "path": "b.wav"}],
        },
    )
    pack(two, tmp_path / "o3", kind="hf", progress=False)
    meta = json.loads(tar_members(tmp_path / "o3")["000000000.json"])
    assert meta["other"] == {"path": "b.wav"} and meta["text"] == "x"  # not the repr of the file's bytes
