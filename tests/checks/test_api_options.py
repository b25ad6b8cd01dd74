"""Bad options to the public constructors: each is an OptionError naming the option and the value given,
raised when the object is made (never at the first batch, never a TypeError/ValueError from deep inside, never
accepted and ignored or silently changed)."""

from __future__ import annotations

import ast
import re
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_shards import make_uneven_dataset

from shardio import (
    Batching,
    Decoding,
    EpochSize,
    Index,
    MixedDataset,
    OptionError,
    Ordering,
    Reading,
    RetryPolicy,
    ShardDataset,
    ShardLoader,
    ShardWriter,
    World,
    collate,
)
from shardio.datasets.options import DEPRECATED, GROUPS, SHORTCUTS

NAN, INF = float("nan"), float("inf")
W = World(0, 1)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("options")
    make_uneven_dataset(root / "a", [5, 7, 3])
    make_uneven_dataset(root / "b", [4, 4], seed=1)
    return {"a": root / "a", "b": root / "b"}


def _grouped(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with each field that has no shortcut given in its group (with that group's shortcuts), as
    the dataset makes its groups of old keywords (without their deprecation)."""
    named = {**SHORTCUTS, **DEPRECATED}
    groups = {DEPRECATED[name] for name in options if name in DEPRECATED}
    made = {
        group: GROUPS[group](**{name: value for name, value in options.items() if named.get(name) == group})
        for group in groups
    }
    return {**{name: value for name, value in options.items() if named.get(name) not in groups}, **made}


def _refused(make: Any, *words: str) -> None:
    with pytest.raises(OptionError) as caught:
        make()
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


DATASET_CASES = [
    ("batch_size", 2.5),
    ("batch_size", True),
    ("batch_size", "4"),
    ("batch_size", NAN),
    ("batch_size", INF),
    ("batch_size", 3.0),
    ("max_duration", "2"),
    ("max_duration", True),
    ("num_buckets", True),
    ("duration_bins", []),
    ("duration_bins", {}),
    ("duration_bins", "abc"),
    ("duration_bins", [True]),
    ("duration_bins", 5),
    ("min_duration", "x"),
    ("sync_buckets", 1),
    ("shuffle", "no"),
    ("shuffle", 0),
    ("shuffle_shards", 2.5),
    ("shuffle_shards", True),
    ("shuffle_shards", NAN),
    ("shuffle_shards", None),
    ("seed", True),
    ("mono", "yes"),
    ("check_finite", "no"),
    ("sample_rate", 0),
    ("sample_rate", -1),
    ("sample_rate", True),
    ("sample_rate", 16000.0),
    ("sample_rate", NAN),
    ("sample_rate", "16000"),
    ("sample_rate", 10**18),
    ("transform", 1),
    ("retry", None),
    ("retry", 3),
    ("storage_options", []),
    ("storage_options", "x"),
    ("read_ahead", -1),
    ("read_ahead", 2.5),
    ("read_ahead", True),
    ("read_ahead", None),
    ("read_ahead", NAN),
    ("cache_bytes", -1),
    ("cache_bytes", 2.5),
    ("cache_bytes", None),
    ("world", 1),
    ("world", (0, 1)),
    ("dtype", "float16"),
    ("remainder", "x"),
    ("on_error", "ignore"),
    ("batching", "x"),
    ("ordering", 1),
    ("decoding", {}),
    ("reading", RetryPolicy()),
]


@pytest.mark.parametrize(("name", "value"), DATASET_CASES, ids=lambda v: repr(v)[:20])
def test_dataset_option_refused_when_made(data: dict[str, Path], name: str, value: Any) -> None:
    options: dict[str, Any] = {"batch_size": 2, "world": W, name: value}
    if name in ("max_duration",):
        del options["batch_size"]
    _refused(lambda: ShardDataset(data["a"], **_grouped(options)), name)


GROUP_CASES = [
    ("decoding", "mono", "yes"),
    ("decoding", "check_finite", "no"),
    ("decoding", "sample_rate", 0),
    ("decoding", "transform", 1),
    ("decoding", "dtype", "float16"),
    ("reading", "on_error", "x"),
    ("reading", "retry", 3),
    ("reading", "storage_options", []),
    ("reading", "read_ahead", -1),
    ("reading", "cache_bytes", 2.5),
]


@pytest.mark.parametrize(("group", "name", "value"), GROUP_CASES, ids=lambda v: repr(v)[:20])
def test_group_field_refused(group: str, name: str, value: Any) -> None:
    _refused(lambda: {"decoding": Decoding, "reading": Reading}[group](**{name: value}), name)


@pytest.mark.parametrize("name", sorted({**SHORTCUTS, **DEPRECATED}))
def test_a_keyword_given_with_its_group_is_refused_naming_both(data: dict[str, Path], name: str) -> None:
    group = {**SHORTCUTS, **DEPRECATED}[name]
    value = getattr(
        {
            "batching": Batching(batch_size=2),
            "ordering": Ordering(),
            "decoding": Decoding(),
            "reading": Reading(),
        }[group],
        name,
    )
    value = 2 if value is None else value
    groups = {
        "batching": Batching(batch_size=2),
        "ordering": Ordering(),
        "decoding": Decoding(),
        "reading": Reading(),
    }
    given = {group: groups[group], name: value}
    makers = {
        "ShardDataset": lambda: ShardDataset(data["a"], world=W, **given),
        "MixedDataset": lambda: _mix(data, **given),
    }
    for owner, make in makers.items():
        deprecated = pytest.warns(DeprecationWarning, match=rf"{owner}\({name}=\.\.\.\) is deprecated")
        with deprecated if name in DEPRECATED else nullcontext():
            _refused(make, name, group)


@pytest.mark.parametrize(
    ("name", "value", "group"),
    [
        ("mono", True, "decoding"),
        ("shuffle_shards", 3, "ordering"),
        ("remainder", "drop", "batching"),
        ("read_ahead", 0, "reading"),
    ],
)
def test_old_keywords_still_work_with_a_deprecation_naming_the_group_field(
    data: dict[str, Path], name: str, value: Any, group: str
) -> None:
    with pytest.warns(
        DeprecationWarning, match=rf"ShardDataset\({name}=\.\.\.\) is deprecated: give {group}="
    ):
        ds = ShardDataset(data["a"], batch_size=2, world=W, **{name: value})
    assert getattr(getattr(ds, group), name) == value
    fields = {name: value, **({"batch_size": 2} if group == "batching" else {})}
    shortcut = {} if group == "batching" else {"batch_size": 2}
    grouped = ShardDataset(data["a"], world=W, **shortcut, **{group: type(getattr(ds, group))(**fields)})
    assert grouped.options == ds.options and getattr(grouped, group) == getattr(ds, group)


def test_shortcuts_and_groups_plan_alike(data: dict[str, Path]) -> None:
    short = ShardDataset(data["a"], batch_size=2, shuffle=False, sample_rate=8000, on_error="skip", world=W)
    grouped = ShardDataset(
        data["a"],
        batching=Batching(batch_size=2),
        ordering=Ordering(shuffle=False),
        decoding=Decoding(sample_rate=8000),
        reading=Reading(on_error="skip"),
        world=W,
    )
    assert short.options == grouped.options and short.decoding == grouped.decoding
    assert short.reading == grouped.reading
    assert [b["keys"] for b in short] == [b["keys"] for b in grouped]


def test_unknown_keyword_is_a_type_error(data: dict[str, Path]) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        ShardDataset(data["a"], batchsize=2)


@pytest.mark.parametrize(
    ("name", "value"), [("max_batch_size", 2.5), ("max_batch_size", True), ("quadratic_duration", True)]
)
def test_duration_batching_option_refused(name: str, value: Any) -> None:
    _refused(lambda: Batching(max_duration=1.0, **{name: value}), name)


@pytest.mark.parametrize("source", [None, 123])
def test_source_of_wrong_type(source: Any) -> None:
    _refused(lambda: ShardDataset(source, batch_size=2, world=W), "source")


def test_storage_options_with_loaded_index_refused(data: dict[str, Path]) -> None:
    index = ShardDataset(data["a"], batch_size=2, world=W).index
    _refused(
        lambda: ShardDataset(index, batch_size=2, world=W, reading=Reading(storage_options={"anon": True})),
        "storage_options",
    )


def test_valid_options_normalised(data: dict[str, Path]) -> None:
    ds = ShardDataset(
        data["a"], batch_size=np.int64(2), world=W, sample_rate=np.int32(8000), shuffle=np.bool_(True)
    )
    assert type(ds.batching.batch_size) is int and type(ds.sample_rate) is int and ds.ordering.shuffle is True
    assert len(next(iter(ds))["keys"]) == 2


@pytest.mark.parametrize(
    "options",
    [
        dict(shuffle_shards=2.5),
        dict(shuffle_shards=True),
        dict(shuffle="x"),
        dict(node_stable="yes"),
        dict(node_stable=1),
        dict(node_stable=None),
    ],
)
def test_ordering(options: dict[str, Any]) -> None:
    _refused(lambda: Ordering(**options), next(iter(options)))


@pytest.mark.parametrize(
    "options",
    [
        dict(rank=True, world_size=2),
        dict(rank=0.5, world_size=2),
        dict(rank=0, world_size=2.5),
        dict(rank="0", world_size=2),
        dict(rank=None, world_size=2),
        dict(rank=0, world_size=10**18),
        dict(rank=0, world_size=INF),
        dict(num_workers=2.5),
        dict(num_workers=True),
        dict(ranks_per_node=0),
        dict(ranks_per_node=1.5),
        dict(ranks_per_node=True),
        dict(ranks_per_node=10**18),
    ],
)
def test_world(options: dict[str, Any]) -> None:
    words = [k for k, v in options.items() if not (type(v) is int and v < 10)]
    _refused(lambda: World(**options), *words)


@pytest.mark.parametrize(
    "options",
    [
        dict(attempts=2.5),
        dict(attempts=True),
        dict(attempts=NAN),
        dict(attempts=INF),
        dict(attempts=10**18),
        dict(attempts="3"),
        dict(backoff=NAN),
        dict(backoff=INF),
        dict(backoff=None),
        dict(max_backoff=NAN),
        dict(max_backoff=INF),
        dict(max_backoff=1e300),
    ],
)
def test_retry_policy(options: dict[str, Any]) -> None:
    _refused(lambda: RetryPolicy(**options), next(iter(options)))


@pytest.mark.parametrize("options", [dict(hours=True), dict(hours="1"), dict(batches=True), dict(primary=1)])
def test_epoch_size(options: dict[str, Any]) -> None:
    _refused(lambda: EpochSize(**options), next(iter(options)))


def _mix(data: dict[str, Path], weights: Any = None, epoch_size: Any = None, **options: Any) -> MixedDataset:
    options.setdefault("world", W)
    if "batching" not in options:
        options.setdefault("batch_size", 2)
    return MixedDataset(
        {"a": data["a"], "b": data["b"]},
        {"a": 1, "b": 1} if weights is None else weights,
        EpochSize(primary="a") if epoch_size is None else epoch_size,
        **options,
    )


@pytest.mark.parametrize(
    ("options", "word"),
    [
        (dict(weights={"a": True, "b": 1}), "weights"),
        (dict(weights={"a": 10**400, "b": 1}), "weights"),
        (dict(weights={"a": 1e308, "b": 1e308}), "finite"),
        (dict(weights={"a": 1e-300, "b": 1}), "epoch_size"),
        (dict(epoch_size=EpochSize(hours=1e300)), "epoch_size"),
        (dict(epoch_size=EpochSize(batches=10**18)), "epoch_size"),
        (dict(epoch_size="x"), "epoch_size"),
        (dict(single_corpus_batches="no"), "single_corpus_batches"),
        (dict(batching="x"), "batching"),
        (dict(storage_options="x"), "storage_options"),
    ],
)
def test_mixed_dataset_refused_when_made(data: dict[str, Path], options: dict[str, Any], word: str) -> None:
    _refused(lambda: _mix(data, **_grouped(options)), word)


def test_mixed_dataset_valid_still_plans(data: dict[str, Path]) -> None:
    mix = _mix(data, epoch_size=EpochSize(batches=3))
    assert len(next(iter(mix))["keys"]) == 2


@pytest.mark.parametrize(
    "options",
    [
        dict(num_workers=10**6),
        dict(prefetch=10**18),
        dict(timeout=NAN),
        dict(timeout=True),
        dict(timeout=10**400),
        dict(multiprocessing_context="bogus"),
        dict(multiprocessing_context=3),
        dict(persistent_workers="no"),
        dict(pin_memory="no"),
    ],
)
def test_loader(data: dict[str, Path], options: dict[str, Any]) -> None:
    ds = ShardDataset(data["a"], batch_size=2, world=W)
    _refused(lambda: ShardLoader(ds, **options), next(iter(options)))


def test_loader_infinite_timeout_is_no_limit(data: dict[str, Path]) -> None:
    loader = ShardLoader(ShardDataset(data["a"], batch_size=2, world=W), num_workers=0, timeout=INF)
    assert loader.timeout == 0.0 and len(list(loader)) == len(loader)  # no limit, as 0


def _sample(key: str, frames: int, **fields: Any) -> dict[str, Any]:
    return {"key": key, "audio": np.ones((1, frames), np.float32), "sample_rate": 8000, **fields}


def test_collate_keeps_every_samples_fields() -> None:
    batch = collate([_sample("a", 3), _sample("b", 5, text="hello")])
    assert batch["text"] == [None, "hello"] and batch["keys"] == ["a", "b"]
    assert batch["audio"].shape == (2, 1, 5)


@pytest.mark.parametrize(
    "samples", [None, [1, 2], "ab", [_sample("a", 3), {"key": "b", "sample_rate": 8000}]]
)
def test_collate_refuses(samples: Any) -> None:
    _refused(lambda: collate(samples))


@pytest.mark.parametrize(
    "options",
    [
        dict(max_samples=2.5),
        dict(max_samples=True),
        dict(max_bytes=NAN),
        dict(zstd_level=100),
        dict(zstd_level="3"),
        dict(frame_bytes=0),
        dict(frame_bytes=-1),
        dict(frame_bytes=2.5),
    ],
)
def test_shard_writer(tmp_path: Path, options: dict[str, Any]) -> None:
    _refused(lambda: ShardWriter(tmp_path / "out", **options), next(iter(options)))


@pytest.mark.parametrize(
    "options",
    [
        {"batching": Batching(min_duration=10.0)},
        {"batching": Batching(max_sample_duration=0.001)},
        {"max_duration": 0.01},
        {"batching": Batching(batch_size=2, min_duration=10.0)},
    ],
)
def test_duration_filters_that_leave_no_sample_are_refused(
    data: dict[str, Path], options: dict[str, Any]
) -> None:
    """Every epoch would be empty (it was, with a warning in the log): refused when the dataset is made."""
    with pytest.raises(OptionError, match=r"no sample can be planned with .* the dataset's samples last"):
        ShardDataset(data["a"], **options)


@pytest.mark.parametrize("location,storage_options", [(None, None), (123, None), ("data/", [])])
def test_index_load_takes_a_location_and_a_dict(location: Any, storage_options: Any) -> None:
    with pytest.raises(OptionError, match="Index.load takes a dataset's location"):
        Index.load(location, storage_options)


def cost_of(durations: np.ndarray) -> float:
    return float(np.max(durations)) * len(durations)


OLD_VALUES: dict[str, dict[str, Any]] = {
    "max_batch_size": {"max_batch_size": 3},
    "remainder": {"remainder": "drop"},
    "duration_bins": {"duration_bins": (0.1,)},
    "quadratic_duration": {"quadratic_duration": 5.0},
    "min_duration": {"min_duration": 0.01},
    "max_sample_duration": {"max_sample_duration": 100.0},
    "sync_buckets": {"sync_buckets": True},
    "batch_cost": {"batch_cost": cost_of, "batch_cost_name": "v1", "num_buckets": 2},
    "batch_cost_name": {"batch_cost": cost_of, "batch_cost_name": "v1", "num_buckets": 2},
    "shuffle_shards": {"shuffle_shards": 3},
    "mono": {"mono": True},
    "transform": {"transform": cost_of},
    "check_finite": {"check_finite": False},
    "dtype": {"dtype": "int16"},
    "retry": {"retry": RetryPolicy(attempts=2)},
    "storage_options": {"storage_options": {}},
    "read_ahead": {"read_ahead": 0},
    "cache_bytes": {"cache_bytes": 1 << 20},
}


@pytest.mark.parametrize("name", sorted(DEPRECATED))
def test_every_old_keyword_works_as_its_group_field(data: dict[str, Path], name: str) -> None:
    """The 18 keywords that are not shortcuts: the same dataset as the group form, with
    a DeprecationWarning."""
    assert set(OLD_VALUES) == set(DEPRECATED)
    given, group = OLD_VALUES[name], DEPRECATED[name]
    with pytest.warns(DeprecationWarning, match=r"ShardDataset\(\w+=\.\.\.\) is deprecated") as caught:
        old = ShardDataset(data["a"], max_duration=1.0, world=W, **given)
    expected = rf"give {group}=shardio\.\w+\({name}=\.\.\.\)"
    assert any(re.search(expected, str(warning.message)) for warning in caught)
    cls = type(getattr(old, group))
    fields = {**given, **({"max_duration": 1.0} if group == "batching" else {})}
    shortcut = {} if group == "batching" else {"max_duration": 1.0}
    new = ShardDataset(data["a"], world=W, **shortcut, **{group: cls(**fields)})
    assert (old.batching, old.ordering, old.decoding, old.reading) == (
        new.batching,
        new.ordering,
        new.decoding,
        new.reading,
    )
    assert old.options == new.options


def test_no_shipped_code_gives_a_deprecated_keyword() -> None:
    """The package, the example scripts in ``tools/`` (which users copy, and which tests run in subprocesses,
    where pytest's warning filter does not reach) and the benchmarks make datasets with the option groups: a
    dataset made with an old keyword would warn every user who runs them."""
    from shardio.datasets.options import DEPRECATED

    repo = Path(__file__).resolve().parents[2]
    found = []
    for folder in ("shardio", "tools", "benchmarks"):
        for path in sorted((repo / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and getattr(
                    node.func, "id", getattr(node.func, "attr", "")
                ) in (
                    "ShardDataset",
                    "MixedDataset",
                ):
                    old = [k.arg for k in node.keywords if k.arg in DEPRECATED]
                    if old:
                        found.append(f"{path.relative_to(repo)}:{node.lineno}: {old}")
    assert found == []
