"""Corpus readers: folder, JSONL, Kaldi, TSV/CSV; detection; problems named by file and line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from audio_factory import write_text, write_tone

from shardio.errors import InputError, InputProblem, OptionError
from shardio.packing.corpus import (
    Source,
    detect_kind,
    read_corpus,
    read_folder,
    read_jsonl,
    read_kaldi,
    read_table,
)


def test_folder_is_recursive_sorted_and_reads_sidecars(mixed_corpus: Path) -> None:
    write_tone(mixed_corpus / ".hidden.wav", 0.1)  # hidden files are not inputs
    write_tone(mixed_corpus / "UPPER.WAV", 0.1)
    sources = list(read_folder(mixed_corpus))
    assert [s.key for s in sources] == ["UPPER", "a_wav", "b_flac", "e_stereo", "sub/c_ogg", "sub/deep/d_mp3"]
    by_key = {s.key: s for s in sources}
    assert by_key["a_wav"].meta == {"text": "the wav one"}
    assert by_key["b_flac"].meta == {"text": "the flac one"}  # .lab sidecar
    assert by_key["sub/deep/d_mp3"].meta["text"] == "the mp3 one"
    assert by_key["e_stereo"].meta == {}
    assert by_key["UPPER"].ext == "wav"
    assert by_key["sub/c_ogg"].audio_path == str(mixed_corpus / "sub" / "c_ogg.ogg")
    assert all(s.offset is None and s.duration is None for s in sources)


def test_jsonl_manifest_paths_fields_ids_and_segments(tmp_path: Path) -> None:
    write_tone(tmp_path / "audio" / "one.wav", 0.3)
    write_tone(tmp_path / "audio" / "long.flac", 2.0)
    absolute = write_tone(tmp_path / "elsewhere" / "abs.wav", 0.2)
    lines = [
        {"audio_filepath": "audio/one.wav", "duration": 0.3, "text": "one", "lang": "en"},
        {"audio_filepath": str(absolute), "duration": 0.2, "text": "abs", "id": "custom-id"},
        {"audio_filepath": "audio/long.flac", "offset": 0.0, "duration": 1.0, "text": "first half"},
        {"audio_filepath": "audio/long.flac", "offset": 1.0, "duration": 1.0, "text": "second half"},
    ]
    manifest = write_text(tmp_path / "train.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    sources = list(read_jsonl(manifest))
    assert [s.key for s in sources] == ["one", "custom-id", "long_00000000", "long_00001000"]
    assert sources[0] == Source(
        "one", str(tmp_path / "audio" / "one.wav"), None, None, {"text": "one", "lang": "en"}, f"{manifest}:1"
    )
    assert sources[1].audio_path == str(absolute)
    assert (sources[2].offset, sources[2].duration) == (0.0, 1.0)
    assert (sources[3].offset, sources[3].duration, sources[3].meta) == (1.0, 1.0, {"text": "second half"})


def test_jsonl_bad_lines_are_problems_naming_the_line(tmp_path: Path) -> None:
    manifest = write_text(
        tmp_path / "m.jsonl",
        '{"audio_filepath": "a.wav"}\nnot json\n{"text": "no path"}\n'
        '{"audio_filepath": "b.wav", "offset": "soon"}\n',
    )
    problems: list[InputProblem] = []
    assert [s.key for s in read_corpus(manifest, problems=problems)] == ["a"]
    assert [p.source for p in problems] == [f"{manifest}:2", f"{manifest}:3", f"{manifest}:4"]
    assert "audio_filepath" in problems[1].reason and "offset" in problems[2].reason
    with pytest.raises(InputError, match=r"m\.jsonl:2"):  # no problems list given: raised at the end
        list(read_jsonl(manifest))


def _kaldi_dir(root: Path, *, segments: bool) -> Path:
    data = root / "data" / "train"
    write_tone(root / "wav" / "rec1.wav", 3.0, 8000)
    write_tone(root / "wav" / "rec2.wav", 1.0, 8000)
    write_text(data / "wav.scp", f"rec1 {root / 'wav' / 'rec1.wav'}\nrec2 ../../wav/rec2.wav\n")
    if segments:
        write_text(data / "segments", "utt1 rec1 0.5 1.5\nutt2 rec1 1.5 -1\nutt3 rec2 0 1.0\n")
        write_text(data / "text", "utt1 hello there\nutt2 general kenobi\nutt3\n")
        write_text(data / "utt2spk", "utt1 spk1\nutt2 spk2\nutt3 spk1\n")
    else:
        write_text(data / "text", "rec1 hello there\nrec2 general kenobi\n")
        write_text(data / "utt2spk", "rec1 spk1\nrec2 spk2\n")
    return data


def test_kaldi_dir_without_segments(tmp_path: Path) -> None:
    data = _kaldi_dir(tmp_path, segments=False)
    sources = list(read_corpus(data))
    assert [(s.key, s.meta) for s in sources] == [
        ("rec1", {"text": "hello there", "speaker": "spk1"}),
        ("rec2", {"text": "general kenobi", "speaker": "spk2"}),
    ]
    assert Path(sources[1].audio_path).resolve() == (tmp_path / "wav" / "rec2.wav").resolve()
    assert sources[0].origin == f"{data / 'wav.scp'}:1"


def test_kaldi_dir_with_segments(tmp_path: Path) -> None:
    sources = list(read_kaldi(_kaldi_dir(tmp_path, segments=True)))
    assert [(s.key, s.offset, s.duration) for s in sources] == [
        ("utt1", 0.5, 1.0),
        ("utt2", 1.5, None),
        ("utt3", 0.0, 1.0),
    ]
    assert sources[0].meta == {"text": "hello there", "speaker": "spk1", "recording": "rec1"}
    assert sources[2].meta == {"text": "", "speaker": "spk1", "recording": "rec2"}


def test_kaldi_text_keyed_by_recording_where_segments_name_utterances_is_counted(tmp_path: Path) -> None:
    data = _kaldi_dir(tmp_path, segments=True)
    write_text(data / "text", "rec1 keyed by the recording\nrec2 likewise\nutt3 this one fits\n")
    left_out: Counter[str] = Counter()
    sources = list(read_kaldi(data, left_out=left_out))
    assert [s.meta.get("text") for s in sources] == [None, None, "this one fits"]
    assert left_out == {"text lines naming no utterance": 2}


def test_kaldi_piped_command_is_a_problem_naming_the_line(tmp_path: Path) -> None:
    data = tmp_path / "d"
    write_tone(tmp_path / "ok.wav", 0.2)
    write_text(data / "wav.scp", f"ok {tmp_path / 'ok.wav'}\npiped sox in.sph -t wav - |\n")
    write_text(data / "segments", "s1 ok 0 0.1\ns2 nowhere 0 1\n")
    problems: list[InputProblem] = []
    assert [s.key for s in read_corpus(data, "kaldi", problems=problems)] == ["s1"]
    assert problems[0].source == f"{data / 'wav.scp'}:2" and "piped command" in problems[0].reason
    assert (
        problems[1].source == f"{data / 'segments'}:2" and "'nowhere' is not in wav.scp" in problems[1].reason
    )


@pytest.mark.parametrize(
    ("entry", "what"),
    [
        ("-", "standard input"),
        ("/data/raw/wav.1.ark:1234", "an offset into a Kaldi archive"),
        ("rec.wav[100:200]", "a range of a file"),
    ],
)
def test_kaldi_extended_filenames_are_named_as_what_they_are(tmp_path: Path, entry: str, what: str) -> None:
    data = tmp_path / "d"
    write_tone(data / "ok.wav", 0.2)
    write_text(data / "wav.scp", f"ok ok.wav\nodd {entry}\n")
    problems: list[InputProblem] = []
    assert [s.key for s in read_corpus(data, "kaldi", problems=problems)] == ["ok"]
    assert [(p.source, p.key) for p in problems] == [(f"{data / 'wav.scp'}:2", "odd")]
    assert f"is {what} ({entry!r}); only plain file paths are supported" in problems[0].reason


def test_a_kaldi_path_that_only_looks_extended_is_a_file(tmp_path: Path) -> None:
    data = tmp_path / "d"
    write_tone(data / "take.wav", 0.2)
    (data / "take.wav").rename(data / "take:2")  # a real file whose name looks like an archive offset
    write_text(data / "wav.scp", "a take:2\n")
    problems: list[InputProblem] = []
    assert [s.key for s in read_corpus(data, "kaldi", problems=problems)] == ["a"] and problems == []


@pytest.mark.parametrize(
    ("delimiter", "path_column", "text_column"),
    [
        ("\t", "path", "sentence"),
        (",", "audio_filepath", "text"),
        ("|", "audio_file", "text"),
        (";", "file", "transcript"),
        ("\t", "audio", "transcription"),
    ],
)
def test_table_header_columns_and_delimiters(
    tmp_path: Path, delimiter: str, path_column: str, text_column: str
) -> None:
    write_tone(tmp_path / "clips" / "a.wav", 0.2)
    write_tone(tmp_path / "clips" / "b.mp3", 0.2)
    rows = [
        [path_column, text_column, "speaker_name"],
        ["clips/a.wav", 'alpha, "quoted"', "s1"],
        ["clips/b.mp3", "beta", "s2"],
    ]
    quote = (
        (lambda cell: f'"{cell.replace(chr(34), chr(34) * 2)}"') if delimiter in ",;" else (lambda cell: cell)
    )
    text = "\n".join(delimiter.join(quote(c) if "," in c else c for c in row) for row in rows) + "\n"
    table = write_text(tmp_path / ("list.tsv" if delimiter == "\t" else "list.csv"), text)
    sources = list(read_corpus(table))
    assert [s.key for s in sources] == ["a", "b"]
    assert sources[0].meta == {"text": 'alpha, "quoted"', "speaker_name": "s1"}
    assert sources[1].audio_path == str(tmp_path / "clips" / "b.mp3")


def test_table_problems(tmp_path: Path) -> None:
    write_text(tmp_path / "nopath.tsv", "name\ttext\nx.wav\thi\n")
    with pytest.raises(
        InputError, match=r"nopath\.tsv: the first line is not a header naming the audio path"
    ):
        list(read_table(tmp_path / "nopath.tsv"))
    table = write_text(tmp_path / "t.tsv", "id\tpath\ttext\nk1\ta.wav\tone\nk2\tb.wav\n\t\tthree\n")
    problems: list[InputProblem] = []
    assert [s.key for s in read_table(table, problems)] == ["k1"]
    assert [p.source for p in problems] == [f"{table}:3", f"{table}:4"]


def test_ljspeech_headerless_metadata(tmp_path: Path) -> None:
    write_tone(tmp_path / "wavs" / "LJ001-0001.wav", 0.2)
    write_tone(tmp_path / "wavs" / "LJ001-0002.flac", 0.2)
    table = write_text(tmp_path / "metadata.csv", "LJ001-0001|Dr. Smith|Doctor Smith\nLJ001-0002|in 1850.|\n")
    sources = list(read_corpus(table))
    assert [(s.key, Path(s.audio_path).name) for s in sources] == [
        ("LJ001-0001", "LJ001-0001.wav"),
        ("LJ001-0002", "LJ001-0002.flac"),
    ]
    assert sources[0].meta == {"text": "Doctor Smith", "raw_text": "Dr. Smith"}
    assert sources[1].meta["text"] == "in 1850."


def test_detect_kind(tmp_path: Path, mixed_corpus: Path) -> None:
    assert detect_kind(mixed_corpus) == "folder"
    kaldi = _kaldi_dir(tmp_path, segments=False)
    assert detect_kind(kaldi) == "kaldi" and detect_kind(kaldi / "wav.scp") == "kaldi"
    assert detect_kind(write_text(tmp_path / "m.jsonl", "")) == "jsonl"
    assert detect_kind(write_text(tmp_path / "m.tsv", "")) == "tsv"
    assert detect_kind(write_text(tmp_path / "m.csv", "")) == "tsv"
    with pytest.raises(OptionError, match="cannot tell the corpus kind"):
        detect_kind(write_text(tmp_path / "m.xyz", ""))
    with pytest.raises(OptionError, match="no such corpus"):
        read_corpus(tmp_path / "missing")
    with pytest.raises(OptionError, match="unknown corpus kind"):
        read_corpus(mixed_corpus, "parquet")


def test_shared_ljspeech_tables(shared_corpora: Path) -> None:
    lj = shared_corpora / "ljspeech_coqui"
    for ext in ("wav", "flac", "mp3"):
        sources = list(read_corpus(lj / f"metadata_{ext}.csv"))
        assert len(sources) == 8 and all(s.ext == ext and Path(s.audio_path).is_file() for s in sources)
        assert sources[0].key == "LJ001-0001" and sources[0].meta["speaker_name"] == "ljspeech-0"
        assert sources[0].meta["text"].startswith("Printing, in the only sense")
    headerless = list(read_corpus(lj / "LJSpeech-1.1_metadata_LJ001-0001_to_0032.csv"))
    assert len(headerless) == 32 and all(Path(s.audio_path).is_file() for s in headerless)
