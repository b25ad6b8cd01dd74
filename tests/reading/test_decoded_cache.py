"""``Reading(decoded_cache=DIR)``: batches read through the node's decoded cache are bit-identical to batches
decoded from the shards, in the first epoch (which fills it) and the next (which reads it), whatever the
format and decoding options; an entry changed underneath is distrusted and decoded again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardio import Decoding, Reading, ShardDataset, ShardWriter
from shardio.errors import OptionError
from shardio.reading import pcm16
from shardio.reading.decodedcache import DecodedCache, _Scratch
from shardio.shards.index import Index
from tests.audio_factory import audio_bytes
from tests.remote_servers import HTTPFileServer

FORMATS = ("flac", "wav", "ogg")


def make_corpus(
    directory: Path, ext: str, count: int = 12, seed: int = 0, rate: int = 8000, channels: int = 1
) -> Path:
    """A small corpus of noise in format ``ext``, of uneven lengths, 16-bit where the format has bits."""
    rng = np.random.default_rng(seed)
    with ShardWriter(directory, max_samples=5) as writer:
        for i in range(count):
            frames = int(rng.integers(400, 2400))
            audio = rng.uniform(-0.6, 0.6, (frames, channels)).astype(np.float32)
            encoded = audio_bytes(audio, rate, ext)
            writer.write(
                f"s{i:03d}",
                {ext: encoded, "txt": f"text {i}".encode()},
                audio_ext=ext,
                num_frames=_frames(encoded, ext),
                sample_rate=rate,
                channels=channels,
            )
    return directory


def _frames(encoded: bytes, ext: str) -> int:
    import io

    import soundfile

    return int(soundfile.info(io.BytesIO(encoded)).frames)


def gain(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A transform: the audio scaled by a draw of the sample's generator (float32)."""
    sample["audio"] = sample["audio"] * np.float32(rng.uniform(0.5, 1.0))
    return sample


def batches(
    directory: Path, epochs: int = 2, batch_size: int | None = 4, **options: Any
) -> list[dict[str, Any]]:
    dataset = ShardDataset(directory, batch_size=batch_size, seed=3, **options)
    found = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        found += list(dataset)
    return found


def assert_identical(one: list[dict[str, Any]], other: list[dict[str, Any]]) -> None:
    assert len(one) == len(other) > 0
    for a, b in zip(one, other):
        assert a.keys() == b.keys()
        for name in a:
            if isinstance(a[name], torch.Tensor):
                assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
                # bit for bit: the raw bytes, so that -0.0 and 0.0 (or two NaNs) are told apart
                assert a[name].numpy().tobytes() == b[name].numpy().tobytes(), name
            else:
                assert a[name] == b[name], name


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = {ext: make_corpus(tmp_path_factory.mktemp(f"dc_{ext}"), ext) for ext in FORMATS}
    made.update(
        {f"{ext}2": make_corpus(tmp_path_factory.mktemp(f"dc_{ext}2"), ext, channels=2) for ext in FORMATS}
    )
    return made


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ext=st.sampled_from(FORMATS),
    mono=st.booleans(),
    rate=st.sampled_from([None, 8000, 16000, 11025]),
    dtype=st.sampled_from(["float32", "int16"]),
    stereo=st.booleans(),
    transform=st.sampled_from([None, gain]),
    batch_size=st.sampled_from([4, None]),
)
def test_batches_through_the_cache_are_bit_identical(
    corpora: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    ext: str,
    mono: bool,
    rate: Any,
    dtype: str,
    stereo: bool,
    transform: Any,
    batch_size: int | None,
) -> None:
    decoding = Decoding(mono=mono, sample_rate=rate, dtype=dtype, transform=transform)
    ext += "2" if stereo else ""
    plain = batches(corpora[ext], decoding=decoding, batch_size=batch_size)
    reading = Reading(decoded_cache=str(tmp_path_factory.mktemp("decoded")))
    cached = batches(corpora[ext], decoding=decoding, batch_size=batch_size, reading=reading)
    assert_identical(plain, cached)
    again = batches(corpora[ext], decoding=decoding, batch_size=batch_size, reading=reading)
    assert_identical(plain, again)


SIXTEEN_BIT_KEPT_AS_DECODED = [
    ("flac", Decoding()),  # WAV without a transform is not cached: the fast path is as cheap
    *[
        (ext, decoding)
        for ext in ("flac", "wav")
        for decoding in (
            Decoding(transform=gain),
            Decoding(dtype="int16", transform=gain),
            Decoding(mono=True, transform=gain),  # of mono audio: nothing to mix
            Decoding(sample_rate=8000),  # the corpus's rate: nothing to resample
        )
    ],
]


def _entries_of_int16(directory: Path, cache: DecodedCache) -> None:
    """That ``cache``, closed, holds every sample of ``directory`` as int16 (2 bytes a sample, not 4)."""
    cache.close()  # gives back what its writer reserved and did not fill
    index = Index.load(directory)
    audio = int((index.columns["num_frames"] * index.columns["channels"]).sum()) * 2
    used = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(cache.directory)
        for name in names
        if name.endswith(".seg")
    )
    assert audio < used <= audio + len(index) * 80  # a header, the txt member, its trailer an entry


def _named(case: tuple[str, Decoding]) -> str:
    ext, decoding = case
    changed = {"transform": decoding.transform is not None, "dtype": decoding.dtype, "mono": decoding.mono}
    return f"{ext}-{changed}-{decoding.sample_rate}"


@pytest.mark.parametrize(
    ("ext", "decoding"),
    SIXTEEN_BIT_KEPT_AS_DECODED,
    ids=[_named(case) for case in SIXTEEN_BIT_KEPT_AS_DECODED],
)
def test_16_bit_audio_is_kept_as_decoded_without_the_exactness_check(
    corpora: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    decoding: Decoding,
    ext: str,
) -> None:
    """16-bit audio whose entry is its decoding (no mix, no resampling) is decoded as int16 and kept so;
    its float32 audio made from the int16 is the decoder's, bit for bit (WAV: by the fast path's
    conversion; FLAC: as libsndfile's, proven once per process)."""

    def not_called(self: _Scratch, audio: np.ndarray) -> None:
        raise AssertionError("a 16-bit sample's float32 audio was checked for int16 steps")

    plain = batches(corpora[ext], decoding=decoding)
    monkeypatch.setattr(_Scratch, "exact_int16", not_called)
    reading = Reading(decoded_cache=str(tmp_path))
    dataset = ShardDataset(corpora[ext], batch_size=4, seed=3, decoding=decoding, reading=reading)
    found = []
    for epoch in range(2):  # decoded and kept, then read from the cache
        dataset.set_epoch(epoch)
        found += list(dataset)
    assert_identical(plain, found)
    assert dataset._decoded is not None and dataset._decoded.stored == 12 and dataset._decoded.hits == 12
    _entries_of_int16(corpora[ext], dataset._decoded)


def test_16_bit_flac_not_proven_to_scale_exactly_is_checked_as_before(
    corpora: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = []
    exact_int16 = _Scratch.exact_int16

    def counted(self: _Scratch, audio: np.ndarray) -> np.ndarray | None:
        checked.append(audio.shape)
        return exact_int16(self, audio)

    decoding = Decoding(transform=gain)
    plain = batches(corpora["flac2"], decoding=decoding)
    monkeypatch.setattr(_Scratch, "exact_int16", counted)
    monkeypatch.setitem(pcm16._PROVEN, ("FLAC", "PCM_16"), False)
    dataset = ShardDataset(
        corpora["flac2"],
        batch_size=4,
        seed=3,
        decoding=decoding,
        reading=Reading(decoded_cache=str(tmp_path)),
    )
    found = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        found += list(dataset)
    assert_identical(plain, found)
    assert len(checked) == 12  # each sample's float32 audio from libsndfile, found to be int16 steps
    assert dataset._decoded is not None
    _entries_of_int16(corpora["flac2"], dataset._decoded)


def _cache(directory: Path, cache: Path, decoding: Decoding = Decoding()) -> DecodedCache:
    return DecodedCache(str(cache), 1 << 30, Index.load(directory), decoding)


def test_the_second_epoch_reads_the_cache(corpora: dict[str, Path], tmp_path: Path) -> None:
    reading = Reading(decoded_cache=str(tmp_path))
    dataset = ShardDataset(corpora["flac"], batch_size=4, reading=reading)
    list(dataset)
    assert dataset._decoded is not None and dataset._decoded.stored == 12 and dataset._decoded.hits == 0
    dataset.set_epoch(1)
    list(dataset)
    assert dataset._decoded.hits == 12
    dataset._decoded.close()  # gives back what its writer reserved and did not fill
    # 16-bit sources are kept as int16: 2 bytes a sample, a 40-byte header an entry
    cache = _cache(corpora["flac"], tmp_path)
    index = Index.load(corpora["flac"])
    audio = int((index.columns["num_frames"] * index.columns["channels"]).sum()) * 2
    used = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(tmp_path)
        for name in names
        if name.endswith(".seg")
    )
    assert audio < used <= audio + 12 * 40 + (1 << 20)
    assert all(cache.get(i) is not None for i in range(12))


def test_a_changed_entry_is_decoded_again(corpora: dict[str, Path], tmp_path: Path) -> None:
    plain = batches(corpora["flac"], epochs=1)
    reading = Reading(decoded_cache=str(tmp_path))
    batches(corpora["flac"], epochs=1, reading=reading)
    for root, _, names in os.walk(tmp_path):
        for name in names:
            if name.endswith(".seg"):
                path = os.path.join(root, name)
                data = bytearray(Path(path).read_bytes())
                for at in range(100, len(data), 997):  # a byte changed here and there, headers kept or not
                    data[at] ^= 0x5A
                Path(path).write_bytes(bytes(data))
    dataset = ShardDataset(corpora["flac"], batch_size=4, seed=3, reading=reading)
    assert_identical(plain, list(dataset))
    assert dataset._decoded is not None and dataset._decoded.segments.distrusted > 0


def test_a_cache_directory_others_may_write_is_not_used(corpora: dict[str, Path], tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cache = _cache(corpora["flac"], shared)
    assert not cache.on
    plain = batches(corpora["flac"], epochs=1)
    assert_identical(plain, batches(corpora["flac"], epochs=1, reading=Reading(decoded_cache=str(shared))))
    assert not any(name.endswith(".seg") for _, _, names in os.walk(shared) for name in names)


def test_options_are_checked() -> None:
    with pytest.raises(OptionError, match="decoded_cache"):
        Reading(decoded_cache=3)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="decoded_cache_bytes"):
        Reading(decoded_cache="x", decoded_cache_bytes=10)


def test_a_batch_from_the_cache_reads_no_shard(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    corpus = tmp_path / "corpus"
    with ShardWriter(corpus, max_samples=5) as writer:
        for i in range(10):
            encoded = audio_bytes(rng.uniform(-0.5, 0.5, (int(rng.integers(400, 2000)), 1)), 8000, "flac")
            members = {"flac": encoded, "txt": f"text {i}".encode(), "json": b'{"speaker": %d}' % (i % 3)}
            frames = _frames(encoded, "flac")
            writer.write(
                f"s{i:03d}", members, audio_ext="flac", num_frames=frames, sample_rate=8000, channels=1
            )
    plain = batches(corpus)
    reading = Reading(decoded_cache=str(tmp_path / "decoded"))
    assert_identical(plain[: len(plain) // 2], batches(corpus, epochs=1, reading=reading))
    for shard in corpus.glob("*.tar"):  # the shards gone: only the cache can make the batches
        shard.rename(shard.with_suffix(".gone"))
    found = batches(corpus, reading=reading)
    assert_identical(plain, found)
    assert found[0]["speaker"] and found[0]["text"]


def test_a_remote_dataset_the_cache_holds_downloads_no_shard(
    corpora: dict[str, Path], tmp_path: Path
) -> None:
    plain = batches(corpora["flac"])
    with HTTPFileServer(str(corpora["flac"].parent)) as server:
        url = f"{server.url}/{corpora['flac'].name}"
        reading = Reading(decoded_cache=str(tmp_path / "decoded"))
        batches(url, epochs=1, reading=reading)  # fills the cache
        assert server.faults.count(".tar") > 0
        server.faults.clear()
        assert_identical(plain, batches(url, reading=reading))  # a new dataset, two epochs
        assert server.faults.count(".tar") == 0  # neither read ahead nor read: no request for a shard
