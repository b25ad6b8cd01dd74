"""The ledger's command-line side: open a dataset as a saved state describes it, and write the answers.

``shardio trace`` and ``shardio quarantine`` take the dataset's location(s) and a saved state; the state
records every option that shapes the plan (batching, ordering, seed, and for a mix the weights and epoch
size), so the dataset is rebuilt from it exactly as the job that saved it planned. Those options are the
state's, not the caller's arguments: one the dataset refuses (an :class:`~shardio.OptionError` where it is
made) is a :class:`~shardio.StateError` naming the state's field and value, the refusal as its reason.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar

from ..errors import OptionError, StateError, shown, shown_path
from ..jobstate import job_state
from ..planning.options import MAX_BUCKETS
from ..storage.statefiles import load_state_file

if TYPE_CHECKING:
    from ..datasets.dataset import ShardDataset

__all__ = ["open_for_state", "read_state", "state_corpora", "write_rows", "write_samples"]

_T = TypeVar("_T")

_ORDERING = ("shuffle", "shuffle_shards")
# what each plan option a state records may be (JSON types; ranges are Batching's and Ordering's to check)
_INT, _NUMBER, _TEXT, _FLAG = "an integer", "a number", "a string", "true or false"
_KINDS = {
    "batch_size": (_INT, True),
    "max_batch_size": (_INT, True),
    "num_buckets": (_INT, True),
    "max_duration": (_NUMBER, True),
    "quadratic_duration": (_NUMBER, True),
    "min_duration": (_NUMBER, True),
    "max_sample_duration": (_NUMBER, True),
    "remainder": (_TEXT, False),
    "sync_buckets": (_FLAG, True),
    "batch_cost_name": (_TEXT, True),
    "step_batches": (_INT, True),
    "shuffle": (_FLAG, False),
    "shuffle_shards": (_INT, False),
}
_TYPES: dict[str, tuple[type, ...]] = {_INT: (int,), _NUMBER: (int, float), _TEXT: (str,), _FLAG: (bool,)}


def read_state(path: str) -> dict[str, Any]:
    """A saved loader state from a JSON file (a shardio state, or a checkpoint dict holding one), read as
    untrusted data (:func:`~shardio.storage.statefiles.load_state_file`: a regular file, bounded)."""
    state = load_state_file(path)
    job_state(state)  # a typed error now if there is none (a list at the top is one)
    return dict(state)


def open_for_state(locations: Sequence[str], state: Mapping[str, Any]) -> ShardDataset:
    """The dataset at ``locations`` (one directory, or ``NAME=LOCATION`` per corpus of a mix) with the
    options ``state`` records. The index fingerprints must match the state's (a :class:`StateError`)."""
    from ..datasets.dataset import ShardDataset
    from ..datasets.mixed import MixedDataset
    from ..planning.mixoptions import EpochSize, recorded_weights
    from ..planning.plan import Batching, Ordering
    from ..shards.index import Index

    loaded = job_state(state)
    corpora = state_corpora(loaded.options)
    options = dict(loaded.options)
    mix = options.pop("mix", None)
    options.pop("corpora", None)
    ordering = {name: options.pop(name) for name in _ORDERING if name in options}
    if options.get("batch_cost") is not None:
        raise OptionError(
            f"the run planned with batch_cost {shown(options['batch_cost'])}, a function the state "
            "names but does not hold: trace it from Python, shardio.Trace(dataset, state)"
        )
    options.pop("batch_cost", None)
    _check_kinds({**options, **ordering})
    options["sync_buckets"] = bool(options.get("sync_buckets"))  # a state records it only when on
    values = {f"options.{name}": value for name, value in {**options, **ordering}.items()}
    if options.get("duration_bins") is not None:
        options["duration_bins"] = tuple(options["duration_bins"])
    batching = _from_state(values, lambda: Batching(**options))
    order = _from_state(values, lambda: Ordering(**ordering))
    common: dict[str, Any] = {"seed": loaded.seed, "ordering": order}
    if mix is None:
        if len(locations) != 1:
            raise OptionError(f"the state is of one dataset: give one location, not {list(locations)}")
        index = Index.load(locations[0])  # the caller's location: its errors are the caller's
        ds: ShardDataset = _from_state(values, lambda: ShardDataset(index, batching=batching, **common))
    else:
        sources = dict(location.split("=", 1) for location in locations if "=" in location)
        if len(sources) != len(locations) or set(sources) != set(corpora or {}):
            raise OptionError(
                f"the state is of a mix of {sorted(corpora or {})}: give NAME=LOCATION for each"
            )
        if not isinstance(mix, dict):
            raise StateError(f"state field options.mix must be a shardio mix's options, not {shown(mix)}")
        values.update({f"options.mix.{name}": value for name, value in mix.items()})
        try:
            epoch_size = _from_state(values, lambda: EpochSize(**mix["epoch_size"]))
            arguments = {"weight_by": mix["weight_by"], "single_corpus_batches": mix["single_corpus_batches"]}
            # as recorded: the planner used these very floats (normalising them again may move one an ulp)
            weights = _from_state(values, lambda: recorded_weights(mix["weights"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(
                f"state field options.mix is not a shardio mix's options ({shown(exc)})"
            ) from exc
        indexes = {name: Index.load(location) for name, location in sources.items()}
        ds = _from_state(
            values,
            lambda: MixedDataset(indexes, weights, epoch_size, batching=batching, **arguments, **common),
        )
    if ds.index.fingerprint != loaded.index:
        raise StateError(
            f"the state was saved for index {shown(loaded.index)}, the dataset's is "
            f"{ds.index.fingerprint} (another dataset or a re-pack)"
        )
    return ds


def state_corpora(options: Mapping[str, Any]) -> dict[str, str] | None:
    """The corpora (name: index fingerprint) a mix's state records in ``options``, ``None`` for one dataset's
    state; a :class:`StateError` where the field is not a mix's."""
    corpora = options.get("corpora")
    if corpora is None and options.get("mix") is None:
        return None
    if not (
        isinstance(corpora, dict)
        and corpora
        and all(isinstance(n, str) and isinstance(v, str) for n, v in corpora.items())
    ):
        raise StateError(
            f"state field options.corpora must map a mix's corpus names to their index "
            f"fingerprints, not {shown(corpora)}"
        )
    return dict(corpora)


def _from_state(values: Mapping[str, Any], make: Callable[[], _T]) -> _T:
    """``make()``, which builds a dataset or its options from the state's ``values`` (field name: value), its
    :class:`OptionError` a :class:`StateError` naming the fields (and values) the refusal is about."""
    try:
        return make()
    except OptionError as exc:
        reason = str(exc)
        names = {field: field.rsplit(".", 1)[-1] for field in values}
        named = [
            field
            for field, name in names.items()
            if re.search(rf"\b{re.escape(name)}\b", reason)
            or ("_" in name and name.replace("_", "") in reason.lower())
        ]  # EpochSize: epoch_size
        named = [field for field in named if values[field] is not None] or named  # "or num_buckets=1": a hint
        where = ", ".join(f"{field} ({shown(values[field], 60)})" for field in named[:3]) or "options"
        raise StateError(f"state field {where}: the dataset refuses this saved option ({reason})") from exc


def _check_kinds(options: Mapping[str, Any]) -> None:
    """A :class:`StateError` naming the first option of the state that is not a plan option, or not the JSON
    type the plan takes (``2.5`` or ``"3"`` batches, ``"yes"`` to shuffle); ranges are Batching's to check."""
    for name, value in options.items():
        if name == "duration_bins":
            if value is not None and not (
                isinstance(value, (list, tuple))
                and len(value) < MAX_BUCKETS
                and all(type(edge) in (int, float) for edge in value)
            ):
                raise StateError(
                    f"state field options: duration_bins must be a list of fewer than {MAX_BUCKETS} "
                    f"numbers, or null, not {shown(value)}"
                )
            continue
        if name not in _KINDS:
            raise StateError(f"state field options: {shown(name)} is not a shardio plan option")
        kind, optional = _KINDS[name]
        if not (optional and value is None) and type(value) not in _TYPES[kind]:
            raise StateError(
                f"state field options: {name} must be {kind}{' or null' if optional else ''}, not "
                f"{shown(value)}"
            )


def write_rows(rows: Iterable[Mapping[str, Any]], out: IO[str], as_json: bool) -> int:
    """Write step rows (one per (epoch, step, rank)) as JSON Lines, or as readable text; return the count."""
    count = 0
    for row in rows:
        count += 1
        if as_json:
            out.write(json.dumps(row) + "\n")
            continue
        seconds = sum(row["durations"])
        ahead = ", consumed ahead" if row.get("ahead") else ""
        ahead += f", micro-batch {row['micro_batch']}" if "micro_batch" in row else ""
        out.write(
            f"epoch {row['epoch']} step {row['step']} rank {row['rank']} (segment {row['segment']}, "
            f"batch_index {row['batch_index']}, world {row['world_size']}{ahead}): "
            f"{len(row['keys'])} samples, {seconds:.2f} s\n"
        )
        size = len(row["keys"])
        corpora = row.get("corpus") or [None] * size
        passes = row.get("corpus_pass") or [None] * size
        repeats = row.get("repeat") or [False] * size
        for key, duration, corpus, number, repeat in zip(
            row["keys"], row["durations"], corpora, passes, repeats
        ):
            where = (f"\t{corpus}" if corpus else "") + (f"\tpass {number}" if number is not None else "")
            line = f"  {shown_path(key)}\t{duration:.3f}{where}"  # keys are the dataset's data, maybe hostile
            out.write(line + ("\trepeat (padding)" if repeat else "") + "\n")
    return count


def write_samples(rows: Iterable[Mapping[str, Any]], out: IO[str], micro_batches: bool = False) -> None:
    """Write step rows as CSV, one line per sample: epoch, step, rank, segment, batch_index, key, duration,
    corpus (empty outside a mix), ahead (1 for a batch consumed ahead of its segment's position, else 0),
    repeat (1 for padding, a planned repeat, else 0), corpus_pass (a mix's pass of the corpus, else empty),
    and with ``micro_batches`` (``Batching(step_batches=K)``: a step is an optimizer step) micro_batch, the
    batch's place among the rank's batches of its step."""
    writer = csv.writer(out)
    writer.writerow(
        ["epoch", "step", "rank", "segment", "batch_index", "key", "duration", "corpus", "ahead"]
        + ["repeat", "corpus_pass"]
        + (["micro_batch"] if micro_batches else [])
    )
    for row in rows:
        count = len(row["keys"])
        corpora = row.get("corpus") or [""] * count
        passes = row.get("corpus_pass") or [""] * count
        repeats = row.get("repeat") or [False] * count
        within = [row["micro_batch"]] if micro_batches else []
        for key, duration, corpus, number, repeat in zip(
            row["keys"], row["durations"], corpora, passes, repeats
        ):
            writer.writerow(
                [
                    row["epoch"],
                    row["step"],
                    row["rank"],
                    row["segment"],
                    row["batch_index"],
                    key,
                    duration,
                    corpus,
                    int(bool(row.get("ahead"))),
                    int(bool(repeat)),
                    number,
                    *within,
                ]
            )
