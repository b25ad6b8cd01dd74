"""pack's validation levels (shardio.packing.structure): the checksums against bit-by-bit references; the
frames the headers give equal the decoder's for random valid files; and each corruption case caught at the
level docs/guides/packing.md says (its table), or, where it says so, by no level."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from audio_factory import audio_bytes, tone, write_tone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardio.errors import InputProblem, OptionError
from shardio.packing.checksums import flac_crc8, flac_crc16, ogg_crc32
from shardio.packing.pack import pack
from shardio.packing.preparation import Prepared, Task, prepare
from shardio.packing.source import Source
from shardio.packing.structure import VALIDATE_LEVELS, Malformed, structure_facts
from shardio.reading.decode import decode_audio
from shardio.shards.index import Index


def reference_crc(data: bytes, width: int, poly: int) -> int:
    """A non-reflected CRC with initial value 0, bit by bit."""
    top, mask, crc = 1 << (width - 1), (1 << width) - 1, 0
    for byte in data:
        crc ^= byte << (width - 8)
        for _ in range(8):
            crc = ((crc << 1) ^ poly) & mask if crc & top else (crc << 1) & mask
    return crc


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=3000))
def test_checksums_match_bit_by_bit_references(data: bytes) -> None:
    assert flac_crc8(data) == reference_crc(data, 8, 0x07)
    assert flac_crc16(data) == reference_crc(data, 16, 0x8005)
    assert ogg_crc32(data) == reference_crc(data, 32, 0x04C11DB7)


def test_crc16_check_value_and_whole_frames() -> None:
    assert flac_crc16(b"123456789") == 0xFEE8  # CRC-16/UMTS (BUYPASS), FLAC's
    frame = b"some frame bytes"
    whole = frame + flac_crc16(frame).to_bytes(2, "big")
    assert flac_crc16(whole) == 0 and flac_crc16(whole * 3) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ext=st.sampled_from(["flac", "wav"]),
    subtype=st.sampled_from(["PCM_16", "PCM_24", "PCM_U8", "FLOAT", "DOUBLE", "PCM_32"]),
    rate=st.sampled_from([8000, 11025, 16000, 22050, 44100, 48000, 96000, 12345]),
    channels=st.integers(1, 3),
    frames=st.integers(1, 30000),
    seed=st.integers(0, 2**16),
)
def test_headers_give_the_decoders_frames_for_any_valid_file(
    ext: str, subtype: str, rate: int, channels: int, frames: int, seed: int
) -> None:
    if ext == "flac" and subtype not in ("PCM_16", "PCM_24"):
        subtype = "PCM_16" if subtype in ("PCM_U8", "FLOAT") else "PCM_24"
    samples = np.random.default_rng(seed).uniform(-1, 1, (frames, channels)).astype(np.float32)
    data = audio_bytes(samples, rate, ext, subtype)
    audio, decoded_rate = decode_audio(data, ext)
    assert structure_facts(data, ext) == (audio.shape[1], decoded_rate, audio.shape[0])


def make(ext: str) -> bytes:
    """A valid 2-second file of ``ext``, long enough for many frames or pages."""
    return audio_bytes(tone(2.0, 16000), 16000, ext)


SAMPLES = {ext: audio_bytes(tone(0.5, 16000), 16000, ext) for ext in ("flac", "wav", "ogg", "mp3")}
"""Short valid files of each format, to damage."""


def flip(data: bytes, at: float) -> bytes:
    damaged = bytearray(data)
    damaged[int(len(data) * at)] ^= 0x10
    return bytes(damaged)


def wrong_header(data: bytes, ext: str) -> bytes:
    """The file with a header field changed: FLAC's total samples, a WAV's data size, an Ogg page's
    sequence number, the first MP3 frame's bit rate."""
    damaged = bytearray(data)
    if ext == "flac":
        damaged[8 + 17] ^= 0x01  # the low byte of STREAMINFO's total samples
    elif ext == "wav":
        at = data.index(b"data") + 4
        damaged[at : at + 4] = struct.pack("<I", len(data))
    elif ext == "ogg":
        second = data.index(b"OggS", 4)
        damaged[second + 18] ^= 0x07  # its page sequence number
    else:
        damaged[2] ^= 0x10  # the first frame's bit rate: its length
    return bytes(damaged)


CASES = {
    "cut in half": lambda data, ext: data[: len(data) // 2],
    "cut by one byte": lambda data, ext: data[:-1],
    "flipped byte": lambda data, ext: flip(data, 0.6),
    "wrong header": wrong_header,
    "not audio": lambda data, ext: bytes(range(256)) * 16,
}
# (format, case) -> the levels that catch it; the table in docs/guides/packing.md ("What each level catches")
CAUGHT_BY = {
    **{(ext, case): VALIDATE_LEVELS for ext in ("flac", "wav", "ogg", "mp3") for case in CASES},
    ("wav", "flipped byte"): (),  # PCM has no checksum: no level can tell
    ("mp3", "flipped byte"): (),  # MP3's frames have no checksum over their audio
}


def prepared(tmp_path: Path, data: bytes, ext: str, validate: str) -> Prepared | InputProblem:
    path = tmp_path / f"sample.{ext}"
    path.write_bytes(data)
    return prepare(Task(Source(key="sample", audio_path=str(path)), "sample", None, validate))


@pytest.mark.parametrize("validate", VALIDATE_LEVELS)
@pytest.mark.parametrize(("ext", "case"), sorted(CAUGHT_BY))
def test_each_corruption_is_caught_by_the_levels_the_guide_lists(
    tmp_path: Path, ext: str, case: str, validate: str
) -> None:
    whole = make(ext)
    assert isinstance(prepared(tmp_path, whole, ext, validate), Prepared)
    result = prepared(tmp_path, CASES[case](whole, ext), ext, validate)
    caught = validate in CAUGHT_BY[(ext, case)]
    assert isinstance(result, InputProblem) == caught, result
    if caught:
        assert isinstance(result, InputProblem) and "\\x" not in result.reason


def test_a_flipped_bit_in_any_flac_frame_is_found_and_named(tmp_path: Path) -> None:
    whole = make("flac")
    first = whole.index(b"\xff\xf8")
    for at in np.linspace(first, len(whole) - 1, 25).astype(int).tolist():
        damaged = bytearray(whole)
        damaged[at] ^= 0x01
        with pytest.raises(Malformed, match=r"FLAC frame|valid FLAC frame header|frames end before"):
            structure_facts(bytes(damaged), "flac")


def test_a_flac_cut_at_a_frame_boundary_is_truncated(tmp_path: Path) -> None:
    whole = make("flac")
    last = whole.rindex(b"\xff\xf8")  # the last frame's header (the audio is long enough to have several)
    with pytest.raises(
        Malformed, match=r"truncated: the FLAC frames end before the 32000 samples STREAMINFO says"
    ):
        structure_facts(whole[:last], "flac")


def test_bytes_after_the_last_flac_frame(tmp_path: Path) -> None:
    whole = make("flac")
    id3v1 = b"TAG" + bytes(125)
    assert structure_facts(whole + id3v1, "flac") == (32000, 16000, 1)  # a tagger's ID3v1: accepted
    with pytest.raises(Malformed, match="bytes after it that are no frame"):
        structure_facts(whole + b"junk", "flac")


def test_non_finite_float_wav_is_found_without_decoding() -> None:
    samples = tone(0.2, 8000).astype(np.float64)
    samples[5] = 1e300  # beyond float32: decodes to infinity
    samples[7] = np.nan
    with pytest.raises(Malformed, match=r"holds 2 NaN or infinite sample\(s\)"):
        structure_facts(audio_bytes(samples, 8000, "wav", "DOUBLE"), "wav")


def test_levels_pack_the_same_bytes_and_bad_levels_are_refused(tmp_path: Path) -> None:
    corpus = tmp_path / "in"
    for i, ext in enumerate(("flac", "wav", "ogg", "mp3")):
        write_tone(corpus / f"a{i}.{ext}", 0.7, 16000, seed=i)
    write_tone(corpus / "float.wav", 0.3, 8000, subtype="FLOAT")
    write_tone(corpus / "stereo.flac", 0.3, 44100, channels=2, subtype="PCM_24")
    outputs = {}
    for validate in VALIDATE_LEVELS:
        pack(corpus, tmp_path / validate, validate=validate, progress=False)
        outputs[validate] = {p.name: p.read_bytes() for p in (tmp_path / validate).iterdir()}
    assert outputs["structure"] == outputs["decode"]
    assert len(Index.load(tmp_path / "structure")) == 6
    with pytest.raises(OptionError, match="validate must be one of 'structure', 'decode', not 'none'"):
        pack(corpus, tmp_path / "bad", validate="none", progress=False)


def test_lost_ogg_page_and_bytes_after_the_last_page_or_frame() -> None:
    ogg = make("ogg")
    second = ogg.index(b"OggS", 4)
    third = ogg.index(b"OggS", second + 4)
    with pytest.raises(Malformed, match="Ogg page 1 of a stream is missing: page 2 follows"):
        structure_facts(ogg[:second] + ogg[third:], "ogg")
    with pytest.raises(Malformed, match="no Ogg page at byte"):
        structure_facts(ogg + b"junk", "ogg")
    with pytest.raises(Malformed, match="the MP3 frames break off|bytes after the last MP3 frame"):
        structure_facts(make("mp3") + b"junk", "mp3")
    structure_facts(make("mp3") + b"TAG" + bytes(125), "mp3")  # an ID3v1 tag


def test_a_whole_flac_frame_lost_between_others_is_found_by_no_structure_check() -> None:
    """The limit the guide's table lists: every frame stays whole and the last ends the stream."""
    whole = make("flac")
    syncs = [at for at in range(len(whole) - 1) if whole[at] == 0xFF and whole[at + 1] == 0xF8]
    frames = [at for at in syncs if whole[at + 4] == len([s for s in syncs if s < at]) and at > 40][:5]
    third, fourth = frames[2], frames[3]
    lost = whole[:third] + whole[fourth:]
    assert structure_facts(lost, "flac") == (32000, 16000, 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ext=st.sampled_from(["flac", "wav", "ogg", "mp3"]),
    edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=4),
    cut=st.floats(0, 1),
    tail=st.binary(max_size=40),
)
def test_hostile_bytes_give_facts_or_a_reason_and_nothing_else(
    ext: str, edits: list[tuple[float, int]], cut: float, tail: bytes
) -> None:
    """Any damage: the facts, None (left to the decoder) or Malformed with a message free of the file's bytes;
    never another exception, and no more memory than the bytes justify (a header claiming a huge frame is only
    looked for within the file)."""
    data = bytearray(SAMPLES[ext])
    for at, value in edits:
        data[min(int(at * len(data)), len(data) - 1)] = value
    damaged = bytes(data[: int(cut * len(data))]) + tail
    try:
        facts = structure_facts(damaged, ext)
    except Malformed as exc:
        assert "\\x" not in str(exc) and str(exc)
    else:
        assert facts is None or (facts[0] > 0 and facts[1] > 0 and facts[2] > 0)
