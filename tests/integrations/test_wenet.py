"""WeNet's shard lists indexed in place (``shardio index --wenet-list data.list``) and read back as WeNet's
sample dicts (:mod:`shardio.integrations.wenet`): real tar shards written as WeNet's
``tools/make_shard_list.py`` writes them, compared with what WeNet's own shard reader (its
``tar_file_and_group``: members grouped by the name up to the last dot, ``.txt`` decoded and stripped, the
audio decoded to float32) makes of the same tars."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf
import torch
from audio_factory import audio_bytes, tone

from shardio import Decoding, ShardDataset, ShardLoader
from shardio.cli import main
from shardio.errors import InputError
from shardio.integrations.importers.wenet_index import index_wenet
from shardio.integrations.wenet import wenet_sample, wenet_samples


def write_wenet_shards(
    directory: Path, utterances: list[tuple[str, str, float]], per_shard: int = 4, absolute: bool = True
) -> Path:
    """Shards ``directory/shards/shards_{i:09d}.tar`` and ``directory/data.list`` as WeNet's
    ``make_shard_list.py`` writes them: per utterance a ``{key}.txt`` member then a ``{key}.wav`` one (16-bit
    PCM, 16 kHz), plain ``TarInfo`` headers; the list one shard path a line (absolute, as WeNet's recipes give
    ``realpath``, or as given)."""
    shards = directory / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    names = []
    for number, start in enumerate(range(0, len(utterances), per_shard)):
        tar = shards / f"shards_{number:09d}.tar"
        with tarfile.open(tar, "w") as archive:
            for key, text, seconds in utterances[start : start + per_shard]:
                for name, data in (
                    (f"{key}.txt", text.encode("utf8")),
                    (f"{key}.wav", audio_bytes(tone(seconds, seed=len(key) + start), 16000, "wav", "PCM_16")),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
        names.append(str(tar) if absolute else os.path.relpath(tar, Path.cwd()))
    data_list = directory / "data.list"
    data_list.write_text("".join(name + "\n" for name in names), encoding="utf8")
    return data_list


def wenet_reads(data_list: Path) -> dict[str, dict[str, Any]]:
    """What WeNet's shard reader makes of each utterance of the shards ``data_list`` names (its grouping and
    decoding rules, written out here: WeNet is not installable)."""
    found: dict[str, dict[str, Any]] = {}
    for line in data_list.read_text(encoding="utf8").splitlines():
        with tarfile.open(line.strip(), "r:*") as archive:
            for member in archive:
                prefix, postfix = (
                    member.name[: member.name.rfind(".")],
                    member.name[member.name.rfind(".") + 1 :],
                )
                data = archive.extractfile(member).read()  # type: ignore[union-attr]
                example = found.setdefault(prefix, {"key": prefix})
                if postfix == "txt":
                    example["txt"] = data.decode("utf8").strip()
                else:
                    audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
                    example["wav"], example["sample_rate"] = torch.from_numpy(audio.T.copy()), rate
    return found


UTTERANCES = [
    (
        f"BAC009S{speaker:04d}W{number:04d}",
        f" 今天 天气 {speaker} {number} ",
        0.3 + 0.05 * ((speaker * 7 + number) % 9),
    )
    for speaker in range(2, 5)
    for number in range(120, 124)
]


def _same(sample: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(sample) == {"key", "txt", "wav", "sample_rate"}
    assert sample["key"] == expected["key"] and sample["txt"] == expected["txt"]
    assert sample["sample_rate"] == expected["sample_rate"] == 16000
    assert sample["wav"].dtype == torch.float32 and torch.equal(sample["wav"], expected["wav"])


def test_a_wenet_shard_list_indexes_in_place_and_reads_as_wenets_sample_dicts(tmp_path: Path) -> None:
    data_list = write_wenet_shards(tmp_path, UTTERANCES)
    before = {p: p.read_bytes() for p in (tmp_path / "shards").iterdir()}
    assert main(["index", "--wenet-list", str(data_list), "--no-progress"]) == 0
    assert (tmp_path / "index.json").is_file()
    assert {p: p.read_bytes() for p in (tmp_path / "shards").iterdir()} == before  # nothing copied or changed
    expected = wenet_reads(data_list)
    assert len(expected) == len(UTTERANCES)

    ds = ShardDataset(tmp_path, batch_size=3, shuffle=False)
    seen = [sample for batch in ds for sample in wenet_samples(batch)]
    assert [s["key"] for s in seen] == [key for key, _, _ in UTTERANCES]  # the list's order, unshuffled
    for sample in seen:
        _same(sample, expected[sample["key"]])

    single = ShardDataset(tmp_path, shuffle=False)  # no batching: one sample at a time
    for sample in single:
        _same(wenet_sample(sample), expected[sample["key"]])


def test_relative_lines_resolve_against_the_working_directory_as_wenet_opens_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data_list = write_wenet_shards(tmp_path / "data" / "train", UTTERANCES[:6], absolute=False)
    assert data_list.read_text().startswith("data/train/shards/shards_000000000.tar\n")
    index = index_wenet(data_list, progress=False)
    assert index.root == str(tmp_path / "data" / "train")
    assert [s.name for s in index.shards] == ["shards/shards_000000000.tar", "shards/shards_000000001.tar"]
    assert len(ShardDataset(data_list.parent).index) == 6


def test_a_key_wenet_and_shardio_split_differently_is_refused_before_an_index_is_written(
    tmp_path: Path,
) -> None:
    data_list = write_wenet_shards(tmp_path, [("utt1", "a", 0.3), ("spk.2", "b", 0.3)])
    with pytest.raises(InputError, match=r"WeNet's key 'spk\.2' \(up to the last dot\) but shardio's 'spk'"):
        index_wenet(data_list, progress=False)
    assert not (tmp_path / "index.json").exists()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epoch_reads_the_rest_of_the_straight_runs_wenet_samples(
    tmp_path: Path, workers: int
) -> None:
    data_list = write_wenet_shards(tmp_path, UTTERANCES)
    index_wenet(data_list, progress=False)

    def dataset() -> ShardDataset:
        return ShardDataset(tmp_path, batch_size=2, seed=3)

    straight = [[s["key"] for s in wenet_samples(b)] for b in ShardLoader(dataset(), num_workers=0)]
    first = dataset()
    loader = ShardLoader(first, num_workers=workers)
    for step, _batch in enumerate(loader):
        if step == 2:
            state = loader.state_dict()
            break
    resumed = ShardLoader(dataset(), num_workers=workers)
    resumed.load_state_dict(state)
    rest = [[s["key"] for s in wenet_samples(b)] for b in resumed]
    assert rest == straight[3:]


def test_wenet_samples_of_int16_batches_scale_as_torchaudio_loads(tmp_path: Path) -> None:
    data_list = write_wenet_shards(tmp_path, UTTERANCES[:4])
    index_wenet(data_list, progress=False)
    expected = wenet_reads(data_list)
    for batch in ShardDataset(tmp_path, batch_size=2, shuffle=False, decoding=Decoding(dtype="int16")):
        for sample in wenet_samples(batch):
            _same(sample, expected[sample["key"]])


def test_the_cli_takes_a_list_or_shards_not_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_list = write_wenet_shards(tmp_path, UTTERANCES[:4])
    shard = str(tmp_path / "shards" / "shards_000000000.tar")
    assert main(["index", shard, "--wenet-list", str(data_list)]) != 0
    assert "--wenet-list reads the shards from the list" in capsys.readouterr().err
    assert main(["index"]) != 0
    assert "needs shards" in capsys.readouterr().err
    out = tmp_path / "elsewhere"
    out.mkdir()
    assert main(["index", "--wenet-list", str(data_list), "--out", str(out), "--no-progress"]) != 0
    assert "lies outside the index's directory" in capsys.readouterr().err
    assert not (out / "index.json").exists() and not (tmp_path / "index.json").exists()
