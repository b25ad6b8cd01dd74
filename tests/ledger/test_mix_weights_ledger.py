"""The ledger takes ordinary mix checkpoints (issue 41): a state records a mix's normalised weights, and the
commands rebuild the mix with exactly those floats (normalising them again moved one by an ulp, and the state
was refused as another mix's), after any chain of re-mixes; where two states' options do differ, the message
names the leaf that differs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sample_shards import make_uneven_dataset

from shardio import EpochSize, OptionError, StateError
from shardio.cli import main
from shardio.datasets.mixed import MixedDataset
from shardio.ledger.rebuild import open_for_state
from shardio.planning.mixoptions import Mix, recorded_weights

pytestmark = pytest.mark.timeout(600)

WEIGHTS = st.one_of(
    st.floats(0.01, 10, allow_nan=False, allow_infinity=False),
    st.integers(1, 9),
    st.sampled_from([0.1, 0.2, 0.3, 1 / 3, 0.7]),
)
SMALL_MIX = st.one_of(st.floats(0.05, 1.5), st.sampled_from([0.1, 0.2, 0.3, 1 / 3, 0.7, 1]))
"""Weights of f and g against a's 1: an epoch is one pass over a, so these keep it a few batches."""


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mixweights")
    make_uneven_dataset(root / "a", [7, 5], seed=1, duration_range=(0.05, 0.2))
    make_uneven_dataset(root / "f", [9, 12], seed=4, duration_range=(0.05, 0.3))
    make_uneven_dataset(root / "g", [6], seed=7, duration_range=(0.05, 0.2))
    return {name: str(root / name) for name in "afg"}


def mix(corpora: dict[str, str], weights: dict[str, float]) -> MixedDataset:
    return MixedDataset(
        {n: corpora[n] for n in weights}, weights, EpochSize(primary="a"), seed=5, max_duration=0.8
    )


def locations(corpora: dict[str, str], names: Any) -> list[str]:
    return [f"{name}={corpora[name]}" for name in sorted(names)]


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(args)
    return code, capsys.readouterr().err


def test_the_reported_mix_checkpoint_is_traced_and_quarantined(
    corpora: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = mix(corpora, {"f": 0.3, "a": 1})
    state = ds.state_after({"epoch": 0, "batch_index": 1})
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    where = locations(corpora, "af")
    assert cli(["trace", *where, "--state", str(path), "--step", "0"], capsys) == (0, "")  # exit 2 before
    key = ds.index.keys[0]
    code, err = cli(["quarantine", *where, "--state", str(path), "--key", key, "--out", str(path)], capsys)
    assert code == 0, err
    rebuilt = open_for_state(where, json.loads(path.read_text()))
    assert rebuilt.mix.weights == ds.mix.weights  # bit for bit: the floats the planner used
    assert (rebuilt.planner.plan(0, 1).samples == ds.plan().samples).all()


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    first=st.fixed_dictionaries({"a": st.just(1), "f": SMALL_MIX}),
    chain=st.lists(
        st.dictionaries(st.sampled_from("fg"), SMALL_MIX, min_size=0, max_size=2), min_size=1, max_size=5
    ),
)
@example(first={"a": 1, "f": 1.0}, chain=[{"f": 0.3}] * 5)  # the reported weights, re-mixed to 5 times over
def test_a_chain_of_remixes_on_its_own_output_keeps_loading(
    corpora: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    first: dict[str, float],
    chain: list[dict[str, float]],
) -> None:
    """Every state a re-mix writes (of the weights drawn, from the previous one's output) is traced, and
    re-mixed again; before, the 4th re-mix of a chain (or the first trace) failed."""
    ds = mix(corpora, first)
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(ds.state_dict()))  # at the start of epoch 0: each re-mix plays from there
    names = set(first)
    for number, drawn in enumerate(chain):
        weights = {"a": 1.0, **drawn}
        arguments = [arg for name, w in sorted(weights.items()) for arg in ("--weight", f"{name}={w!r}")]
        code, err = cli(
            [
                "remix",
                *locations(corpora, names | set(weights)),
                "--state",
                str(path),
                *arguments,
                "--out",
                str(path),
            ],
            capsys,
        )
        assert code == 0, f"re-mix {number}: {err}"
        names = set(weights)
        code, err = cli(["trace", *locations(corpora, names), "--state", str(path), "--step", "0"], capsys)
        assert code == 0, f"trace after re-mix {number}: {err}"
        given = dict(sorted(weights.items()))  # in the order the command line gave them
        assert json.loads(path.read_text())["options"]["mix"]["weights"] == mix(corpora, given).mix.weights


@settings(max_examples=200, deadline=None)
@given(weights=st.dictionaries(st.sampled_from("abcdefg"), WEIGHTS, min_size=1, max_size=7))
def test_recorded_weights_are_kept_bit_for_bit(weights: dict[str, float]) -> None:
    normalised = Mix(weights, EpochSize(hours=1)).weights
    again = Mix(recorded_weights(normalised), EpochSize(hours=1)).weights
    assert again == normalised and list(again) == sorted(weights)


def test_recorded_weights_must_be_normalised() -> None:
    with pytest.raises(OptionError, match="recorded weights must be normalised"):
        Mix(recorded_weights({"a": 2.0, "b": 3.0}), EpochSize(hours=1))
    with pytest.raises(OptionError, match="positive"):
        Mix(recorded_weights({"a": 1.5, "b": -0.5}), EpochSize(hours=1))


def test_a_difference_names_the_leaf_that_differs(
    corpora: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = mix(corpora, {"f": 0.3, "a": 1})
    state = json.loads(json.dumps(ds.state_after({"epoch": 0, "batch_index": 1})))
    other = mix(corpora, {"f": 0.3000001, "a": 1})
    with pytest.raises(StateError) as caught:
        other.load_state_dict(state)
    message = str(caught.value)
    assert "option mix.weights.a: state 0.7692307692307692, dataset 0.769230710059" in message, message
    assert "option mix.weights.f: state 0.23076923076923075" in message, message
    state["options"]["mix"]["weights"]["a"] += 0.5  # a hand-edited state: no longer normalised
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(state))
    code, err = cli(["trace", *locations(corpora, "af"), "--state", str(path), "--step", "0"], capsys)
    assert code == 2 and "options.mix.weights" in err and "must be normalised" in err, err


def test_a_mix_quarantine_entry_whose_corpus_disagrees_is_refused(corpora: dict[str, str]) -> None:
    ds = mix(corpora, {"f": 0.3, "a": 1})
    key = ds.index.keys[0]  # of corpus a
    entry = {
        "epoch": 0,
        "segment": 0,
        "ids": [0],
        "keys": [key],
        "corpora": ["f"],
        "steps": None,
        "carry": True,
        "consumed": [],
    }
    state = {**ds.state_dict(), "epoch": 1, "extra": {"quarantine": [entry]}}
    with pytest.raises(StateError, match="id 0 is of corpus 'a', but the entry's corpus 0 is 'f'"):
        mix(corpora, {"f": 0.3, "a": 1}).load_state_dict(state)
    mix(corpora, {"f": 0.3, "a": 1}).load_state_dict(
        {**state, "extra": {"quarantine": [{**entry, "corpora": ["a"]}]}}
    )


def test_weights_given_in_another_order_say_why_they_differ(corpora: dict[str, str]) -> None:
    """Mix normalises by the sum taken in the order the weights come in, so the same weights in another order
    can differ in their last bits (plans keep today's floats): the refusal says so, and how to resume."""
    saved = mix(corpora, {"g": 0.7, "f": 0.1, "a": 0.2}).state_dict()
    with pytest.raises(
        StateError,
        match=r"mix.weights.a: state 0.2, dataset 0.20000000000000004 \(a few ulps "
        r"apart: .* give them in the order of the run that saved the state\)",
    ):
        mix(corpora, {"a": 0.2, "g": 0.7, "f": 0.1}).load_state_dict(saved)
    mix(corpora, {"g": 0.7, "f": 0.1, "a": 0.2}).load_state_dict(saved)
