"""Issue 46, bounds: a trainer checkpoint, a manifest, a node plan lock and the shard cache each cost what
their bytes (or their option) justify, never hang, and fail with a typed error naming the value — a checkpoint
whose lists share references, a zip bomb for a ``data.pkl``, a device or a FIFO in an Accelerate folder,
a deep JSON line seen by kind detection, a FIFO or folder as a plan lock, and concurrent cache fills."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hostile import run_limited
from remote_servers import serve_copy
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import Reading, ShardDataset, StateError, World
from shardio.cli import main
from shardio.errors import InputError
from shardio.ledger.checkpoints import read_checkpoint
from shardio.ledger.statepaths import MAX_WALK_DEPTH
from shardio.packing.corpus import detect_kind, read_corpus
from shardio.packing.manifestlines import MAX_DEPTH
from shardio.reading.cache import ShardCache
from shardio.runtime import planfiles

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bounded_inputs") / "ds"
    make_uneven_dataset(root, [4, 3], seed=2)
    return root


@pytest.fixture(scope="module")
def state(dataset: Path) -> dict[str, Any]:
    ds = ShardDataset(dataset, batch_size=2, seed=1)
    return ds.state_after(next(iter(ds)))


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


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


# -- 8: the search for the state in a checkpoint visits each container once, bounded -------------------------


def _shared(levels: int) -> list[Any]:
    """``[a, a]`` of ``[b, b]`` ...: ``2**levels`` paths to the innermost list from a few hundred bytes."""
    shared: list[Any] = []
    for _ in range(levels):
        shared = [shared, shared]
    return shared


def test_a_checkpoint_of_shared_lists_is_read_at_once(tmp_path: Path, state: dict[str, Any]) -> None:
    """``{"model": [a, a] of [b, b] ... 31 deep}``: 2 KB that the walk took 2**31 paths to search (hours)."""
    path = tmp_path / "ckpt.pt"
    torch.save({"model": _shared(31), "loader": state}, path)
    assert path.stat().st_size < 4096
    code = (
        f"from shardio.ledger.checkpoints import read_checkpoint\nprint(read_checkpoint({str(path)!r}).where)"
    )
    try:
        result = _run(code, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("reading a 2 KB checkpoint of shared lists did not end in 60 s")
    assert result.returncode == 0 and result.stdout.split() == ["('loader',)"], result.stderr[-2000:]


def test_a_checkpoint_nested_deeper_than_the_walk_is_a_state_error(
    tmp_path: Path, state: dict[str, Any]
) -> None:
    path = tmp_path / "deep.pt"
    deep: list[Any] = []
    for _ in range(MAX_WALK_DEPTH + 5):
        deep = [deep]
    torch.save({"model": deep, "loader": state}, path)
    with pytest.raises(StateError, match=f"more than {MAX_WALK_DEPTH} deep"):
        read_checkpoint(str(path))
    shared_state = {"a": state, "b": [state]}  # one state reached twice: two places to write, refused
    torch.save(shared_state, path)
    assert read_checkpoint(str(path)).where is None


# -- 9: a torch.save zip's entries are bounded by its bytes before torch.load extracts them ------------------


def _deflated_bomb(path: Path, state: dict[str, Any], padding: int) -> None:
    """A ``torch.save`` zip whose ``data.pkl`` is deflated and followed by ``padding`` zero bytes (the
    unpickler stops at its STOP opcode; torch extracts the whole entry first)."""
    plain = path.with_suffix(".plain")
    torch.save({"model": torch.zeros(4), "loader": state}, plain)
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w") as out:
        for info in source.infolist():
            data = source.read(info)
            if not info.filename.endswith("/data.pkl"):
                out.writestr(info, data)
                continue
            bomb = zipfile.ZipInfo(info.filename)
            bomb.compress_type = zipfile.ZIP_DEFLATED
            with out.open(bomb, "w", force_zip64=True) as handle:
                handle.write(data)
                for _ in range(padding >> 20):
                    handle.write(bytes(1 << 20))


def test_a_deflated_data_pkl_is_refused_before_torch_extracts_it(
    tmp_path: Path, state: dict[str, Any]
) -> None:
    """256 MiB of zeros after the pickle, deflated to 250 KB: torch.load extracted it whole (a 1 MB file of
    1 GiB took 2.3 GB of memory); refused now from the zip's central directory, within 64 MiB of headroom."""
    path = tmp_path / "bomb.pt"
    _deflated_bomb(path, state, 256 << 20)
    assert path.stat().st_size < 1 << 20
    code = (
        "from shardio.errors import StateError\nfrom shardio.ledger.checkpoints import read_checkpoint\n"
        f"try:\n    read_checkpoint({str(path)!r})\nexcept StateError as exc:\n    print('refused', exc)\n"
    )
    result = run_limited(code, headroom_mb=64, preload="torch, shardio.ledger.checkpoints")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("refused") and "/data.pkl' declares 2684" in result.stdout, result.stdout
    assert read_checkpoint(str(path.with_suffix(".plain"))).where == ("loader",)  # torch.save's own: read


# -- 10: --out of an Accelerate folder copies its regular files into a new folder, renamed at the end --------


def _accelerate_checkpoint(dataset: Path, folder: Path) -> tuple[ShardDataset, Any]:
    """A real ``save_state`` folder after 2 tracked batches; the dataset and its tracker."""
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from shardio.integrations.accelerate import track

    accelerator = Accelerator(cpu=True)
    ds = ShardDataset(dataset, batch_size=2, seed=1)
    progress = track(accelerator, ds)
    for number, batch in enumerate(ds):
        progress.update(batch)
        if number == 1:
            break
    accelerator.save_state(str(folder))
    return ds, progress


def _quarantine(
    dataset: Path, folder: Path, out: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    capsys.readouterr()
    assert main(["trace", str(dataset), "--state", str(folder), "--step", "2", "--json"]) == 0
    bad = json.loads(capsys.readouterr().out)["keys"][0]
    code = main(["quarantine", str(dataset), "--state", str(folder), "--key", bad, "--out", str(out)])
    return code, capsys.readouterr().err


def test_quarantine_out_copies_an_accelerate_folder_s_files_and_leaves_out_fifos_and_devices(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO inside made the copy fail half-way (a partial --out holding the old state, "cannot write
    --out"); a character device was copied as a file (``/dev/zero``: 22 GB in 60 s). Both are left out now,
    with a warning; a subfolder and a link inside it are copied, the link pointing inside the copy."""
    folder = tmp_path / "ckpt"
    _accelerate_checkpoint(dataset, folder)
    os.mkfifo(folder / "pipe")
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.txt").write_text("kept")
    os.symlink("../sub/notes.txt", folder / "sub" / "link.txt")
    try:
        os.mknod(folder / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's: harmless to copy
    except PermissionError:
        pass  # not root: the FIFO alone
    before = sorted(p.name for p in folder.iterdir())
    code, err = _quarantine(dataset, folder, tmp_path / "healed", capsys)
    assert code == 0, err
    healed = tmp_path / "healed"
    kept = sorted(p.name for p in healed.iterdir())
    assert kept == sorted(set(before) - {"pipe", "null"}), kept
    assert (healed / "sub" / "link.txt").read_text() == "kept"
    assert os.readlink(healed / "sub" / "link.txt") == "notes.txt"
    assert any("left out of the copy" in r.getMessage() and "pipe" in r.getMessage() for r in caplog.records)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []
    changed = [
        name
        for name in kept
        if (healed / name).is_file() and (healed / name).read_bytes() != (folder / name).read_bytes()
    ]
    assert len(changed) == 1, changed  # the file holding the state, and no other


def test_quarantine_out_refuses_a_link_leaving_the_accelerate_folder_and_leaves_nothing(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ckpt"
    _accelerate_checkpoint(dataset, folder)
    (tmp_path / "secret").write_text("not the checkpoint's")
    os.symlink(tmp_path / "secret", folder / "outside")
    code, err = _quarantine(dataset, folder, tmp_path / "healed", capsys)
    assert code != 0 and "a symbolic link to" in err and "outside" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "secret"]


# -- 15: a FIFO or a folder where the node plan's lock goes: a warning and the epoch planned in memory ------


def _keys(dataset: Path, epoch: int) -> list[list[str]]:
    ds = ShardDataset(dataset, batch_size=2, seed=1, world=World(0, 2))
    ds.set_epoch(epoch)
    return [list(batch["keys"]) for batch in ds]


@pytest.mark.parametrize("planted", ["FIFO", "directory"])
def test_a_fifo_or_folder_as_the_plan_lock_is_a_warning_and_a_plan_in_memory(
    dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    planted: str,
) -> None:
    """``set_epoch`` raised the lock's OutputError ("it is a FIFO, not a regular file") instead of the
    documented warning; it plans the epoch in memory now, and never opens the FIFO."""
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "clean"))
    expected = _keys(dataset, 0)
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(planfiles, "name", lambda job, epoch, history: f"epoch-{epoch}")
    monkeypatch.setattr(planfiles, "_lock_warned", False)
    lock = tmp_path / "cache" / "plans" / "epoch-0.lock"
    lock.parent.mkdir(parents=True)
    os.mkfifo(lock) if planted == "FIFO" else lock.mkdir()
    with caplog.at_level("WARNING", logger="shardio.runtime.planfiles"):
        assert _keys(dataset, 0) == expected
    lines = [
        r.getMessage() for r in caplog.records if "cannot take the lock of the node's plan" in r.getMessage()
    ]
    assert len(lines) == 1 and f"it is a {planted}" in lines[0], lines
    assert os.path.exists(lock) and sorted(os.listdir(lock.parent)) == ["epoch-0.lock"]


# -- 16: the shard cache holds at most cache_bytes, concurrent fills together; prune skips what is not ours --


def _held(directory: Path) -> int:
    """Bytes of the cache's entries and fetches under way (regular files: ``*.shard`` and ``.tmp-*``), each
    file once (by inode: a fetch renamed while the directory is listed may be listed under both names)."""
    sizes: dict[int, int] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.endswith(".shard") or entry.name.startswith(".tmp-"):
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(info.st_mode):
                        sizes[info.st_ino] = max(sizes.get(info.st_ino, 0), info.st_size)
    except FileNotFoundError:
        pass
    return sum(sizes.values())


def test_the_shard_cache_never_holds_more_than_cache_bytes_with_workers_filling_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """24 shards of ~250 KB over HTTP, 2 MiB of cache, 2 DataLoader workers reading ahead, two epochs: every
    fill evicted only for itself, and the cache held several times its bound; the bytes on disk (sampled every
    millisecond) stay within it now, and every batch is as read locally."""
    local = make_uneven_dataset(tmp_path / "ds", [50] * 24, seed=3, duration_range=(0.2, 0.4))
    bound = 2 << 20
    assert sum(shard.bytes for shard in local.shards) > 3 * bound
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "node"))
    directory = tmp_path / "node" / "shards"
    most, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            most[0] = max(most[0], _held(directory))
            time.sleep(0.001)

    reference = ShardDataset(local.root, batch_size=8, seed=4)
    expected = []
    for epoch in (0, 1):
        reference.set_epoch(epoch)
        expected.append([list(batch["keys"]) for batch in reference])
    with serve_copy(local.root, tmp_path / "http") as server:
        dataset = ShardDataset(f"{server.url}/ds", batch_size=8, seed=4, reading=Reading(cache_bytes=bound))
        loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            played = []
            for epoch in (0, 1):
                dataset.set_epoch(epoch)
                played.append([list(batch["keys"]) for batch in loader])
        finally:
            stop.set()
            sampler.join()
    assert played == expected
    assert 0 < _held(directory) <= bound and most[0] <= bound, (most[0], _held(directory))


def test_cache_prune_skips_folders_links_and_files_it_did_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``shardio cache --prune`` stopped at a directory named ``.tmp-*`` or ``*.shard`` ("Is a directory"),
    pruning nothing after it, and evicted any file whose name ends in ``.shard``."""
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "node"))
    directory = tmp_path / "node" / "shards"
    directory.mkdir(parents=True)
    old = time.time() - 7200
    cache = ShardCache(str(directory), 1 << 20)
    digest = hashlib.sha256(b"hello").hexdigest()
    entry = cache.fill(digest, 5, lambda out: out.write(b"hello"), "shard a")
    assert entry is not None and os.path.exists(entry)  # evicted by --max-bytes 0
    for name in (".tmp-folder", f"{'b' * 64}-4096.shard", "x.shard.lock"):
        (directory / name).mkdir()
        (directory / name / "inside").write_text("not the cache's")
        os.utime(directory / name, (old, old))
    (directory / "notes.shard").write_text("a user's file, not an entry")
    (tmp_path / "outside").write_text("not the cache's")
    os.symlink(tmp_path / "outside", directory / ".tmp-link")
    os.utime(directory / ".tmp-link", (old, old), follow_symlinks=False)
    stale = directory / ".tmp-abcdefgh"
    stale.write_bytes(b"x")
    os.utime(stale, (old, old))
    orphan = directory / f"{'c' * 64}-7.shard.lock"
    orphan.touch()
    capsys.readouterr()
    assert main(["cache", "--prune", "--max-bytes", "0"]) == 0, capsys.readouterr().err
    left = sorted(os.listdir(directory))
    assert left == sorted(
        [".tmp-folder", f"{'b' * 64}-4096.shard", "x.shard.lock", "notes.shard", ".tmp-link"]
    ), left
    assert "pruned 2 files" in capsys.readouterr().out
    assert (tmp_path / "outside").read_text() == "not the cache's"
