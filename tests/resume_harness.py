"""The one resume harness (issue 12): run, stop, save, restore, compare, for every loader configuration.

A :class:`Case` is one configuration (dataset, batching, loader, workers, start method, epochs, stop points,
rollback). :func:`run` plays it as a job that is stopped at each stop point (everything dropped, as a killed
process) and restarted from its saved state, the state travelling through JSON as a checkpoint would;
:func:`uninterrupted` plays the same epochs without a stop. Same world: the two agree batch for batch, keys
and augmentation draws. Another world: :func:`check_elastic` checks that the rest of the epoch is consumed
exactly once, plus only the padding the new plan reports. Every life also checks that each
rank yields ``len(ds)``.

Rank processes (real gloo groups, launched by ``tests/process_groups.py``, ``torch.multiprocessing.spawn`` or
``torchrun``) run :func:`rank_entry`, which plays one life of a case on its rank.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

Record = tuple[int, tuple[str, ...], tuple[float, ...]]
"""One consumed batch: its epoch, its keys and its augmentation draws."""

SHARDS = {"main": (1, 9, 30, 3, 17, 2), "extra": (5, 11, 2)}
"""Shard sizes of the test corpora: ``main`` alone, or mixed with ``extra``."""
SEED = 7
BATCHINGS: dict[str, dict[str, Any]] = {
    "fixed": {"batch_size": 4},
    "duration": {"max_duration": 1.5},
    "bucketed": {"max_duration": 1.5, "num_buckets": 3, "quadratic_duration": 20.0},
    "unbatched": {},
    "collated": {},
}
"""The dataset's batching (``shardio.Batching`` fields); ``collated``: unbatched samples that the DataLoader
batches, :data:`COLLATED` at a time, with ``shardio.collate`` (a worker's batch is its next samples: with
several workers, out of plan order)."""
COLLATED = 3
LOADERS = ("state_after", "in_process", "stateful", "shardio")
"""``state_after``: a plain DataLoader, ``ds.state_after(batch)``; ``in_process``: ``num_workers=0`` and
``ds.state_dict()``; ``stateful``: torchdata's ``StatefulDataLoader`` and its own state; ``shardio``:
:class:`shardio.ShardLoader` and its own state (batched datasets only)."""


@dataclass(frozen=True)
class Case:
    """One configuration of the resume matrix."""

    mixed: bool = False
    batching: str = "duration"
    loader: str = "state_after"
    workers: int = 0
    persistent: bool = False
    start_method: str = "fork"
    epoch: int = 0
    epochs: int = 2
    stops: tuple[int, ...] = ()
    """Batch counts (from the start of the run) at which the job is stopped and restarted from its state."""
    rollback: tuple[int, int] | None = None
    """In the last life, after batch ``[1]`` of it, the same dataset and loader go back to the state saved
    after batch ``[0]`` of it (and play on from there)."""
    ds_load: bool = False
    """A ``stateful`` restart loads the loader's whole state with ``ds.load_state_dict`` (the route for
    another world or worker count) instead of ``loader.load_state_dict``."""
    resume_workers: int | None = None
    """The workers of every life after the first (``None``: ``workers``); with
    ``stateful``, needs ``ds_load``."""
    pin_memory: bool = False
    """A ShardLoader pins its batches (in its pin-memory thread); see :func:`make_loader`."""
    snapshot_every: int = 1
    """A StatefulDataLoader's ``snapshot_every_n_steps`` (its workers' states lag the batches by up to this
    less one; a state loaded into the dataset counts the batches since)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """``shardio.Batching`` fields over the batching's, and ``seed`` (JSON values: a case travels as JSON)."""
    decoded_cache: bool = False
    """Read through a decoded cache (``Reading(decoded_cache=...)``) beside the corpora, shared by every life
    and rank: the first fills it, the later read it."""
    weights: tuple[tuple[str, float], ...] = (("main", 0.7), ("extra", 0.3))
    """A mixed case's corpora and weights (another mix: a re-mix, ``shardio.remix``)."""
    node_stable: bool = False
    """``Ordering(node_stable=True)``: each node of the world plays its part of the corpus every epoch."""

    def __post_init__(self) -> None:
        if self.loader == "in_process" and self.workers:
            raise ValueError("in_process runs without workers")
        if self.persistent and not self.workers:
            raise ValueError("persistent workers need workers")
        if self.loader == "shardio" and self.batching == "unbatched":
            raise ValueError("ShardLoader hands over batches only")
        if self.pin_memory and self.loader != "shardio":
            raise ValueError("pin_memory is a ShardLoader case")
        if self.resume_workers is not None and self.loader == "stateful" and not self.ds_load:
            raise ValueError("a StatefulDataLoader's own state resumes the same workers only")
        if self.snapshot_every != 1 and self.loader != "stateful":
            raise ValueError("snapshot_every is a StatefulDataLoader case")
        if self.batching == "collated" and self.loader == "shardio":
            raise ValueError("ShardLoader hands over the dataset's batches only")
        # refused loudly (tests/promises/test_resume_refusals.py): a state that no position describes
        if self.batching == "collated" and self.loader == "state_after":
            raise ValueError("state_after refuses a batch the DataLoader made of several samples")
        if self.ds_load and self.snapshot_every != 1 and self.batching in ("unbatched", "collated"):
            raise ValueError("an unbatched dataset's state after a snapshot's last step is refused")


def gain(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The augmentation: one draw from the sample's generator."""
    sample["gain"] = float(rng.uniform())
    return sample


def write_corpora(root: Path) -> dict[str, str]:
    """The test corpora under ``root``; their directories by name."""
    from sample_shards import make_uneven_dataset

    dirs = {}
    for number, (name, sizes) in enumerate(SHARDS.items()):
        make_uneven_dataset(
            root / name,
            sizes,
            seed=number,
            compression="zstd" if number else "none",
            duration_range=(0.05, 0.5),
        )
        dirs[name] = str(root / name)
    return dirs


def make_dataset(case: Case, dirs: dict[str, str], world: Any = None) -> Any:
    """The case's dataset (``world``: an explicit :class:`shardio.World`, or ``None`` to detect it)."""
    from shardio import Batching, Decoding, EpochSize, MixedDataset, Ordering, Reading, ShardDataset

    batching = {**BATCHINGS[case.batching], **case.extra}
    options: dict[str, Any] = {
        "seed": batching.pop("seed", SEED),
        "batching": Batching(**batching),
        "ordering": Ordering(shuffle_shards=2, node_stable=case.node_stable),
        "decoding": Decoding(transform=gain),
        "world": world,
    }
    if case.decoded_cache:
        options["reading"] = Reading(decoded_cache=os.path.join(os.path.dirname(dirs["main"]), "decoded"))
    if case.mixed:
        weights = dict(case.weights)
        return MixedDataset(
            {name: dirs[name] for name in weights}, weights, EpochSize(primary="main"), **options
        )
    return ShardDataset(dirs["main"], **options)


def make_loader(case: Case, ds: Any) -> Any:
    """The case's loader over ``ds``."""
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardio import ShardLoader, collate

    if case.loader == "shardio":
        import torch

        from shardio.loader import pinning

        accelerated = torch.cuda.is_available()
        loader = ShardLoader(
            ds,
            num_workers=case.workers,
            persistent_workers=case.persistent,
            multiprocessing_context=case.start_method,
            pin_memory=case.pin_memory and accelerated,
        )
        if case.pin_memory and not accelerated:  # the same path, with a copy standing in for page-locking
            loader.pin_memory = True
            pinning.pin_memory = _copied
        return loader
    options: dict[str, Any] = {"batch_size": None, "num_workers": case.workers}
    if case.batching == "collated":
        options.update(batch_size=COLLATED, collate_fn=collate)
    if case.workers:
        options.update(persistent_workers=case.persistent, multiprocessing_context=case.start_method)
    if case.loader == "stateful":
        return StatefulDataLoader(ds, snapshot_every_n_steps=case.snapshot_every, **options)
    return DataLoader(ds, **options)


def loader_batches(case: Case, samples: int, start: int) -> int:
    """The batches the case's loader yields for a rank's ``samples`` batches (or samples) from ``start``: a
    collated case's workers each batch their own share, :data:`COLLATED` samples at a time."""
    if case.batching != "collated":
        return samples - start
    workers = max(case.workers, 1)
    return sum(-(-len(range(start + worker, samples, workers)) // COLLATED) for worker in range(workers))


def _copied(batch: dict[str, Any]) -> dict[str, Any]:
    return {name: value.clone() if hasattr(value, "clone") else value for name, value in batch.items()}


def record(batch: dict[str, Any]) -> Record:
    """What the harness compares of a batch."""
    keys = list(batch["keys"]) if "keys" in batch else [batch["key"]]
    gains = list(batch["gain"]) if "keys" in batch else [batch["gain"]]
    epochs = (
        set(batch["epoch"]) if isinstance(batch["epoch"], list) else {int(batch["epoch"])}
    )  # a collated batch's
    assert len(epochs) == 1, f"a batch of samples from epochs {sorted(epochs)}"
    return epochs.pop(), tuple(keys), tuple(float(g) for g in gains)


def save(case: Case, ds: Any, loader: Any, batch: dict[str, Any] | None) -> dict[str, Any]:
    """The state the case's loader saves after ``batch`` (``None``: before the first), through JSON."""
    if case.loader in ("stateful", "shardio"):
        state = loader.state_dict()
    elif case.loader == "in_process" or batch is None:
        state = ds.state_dict()
    else:
        state = ds.state_after(batch)
    return json.loads(json.dumps(state))


def restore(case: Case, ds: Any, loader: Any, state: dict[str, Any]) -> None:
    """Load ``state`` the case's way."""
    if case.loader in ("stateful", "shardio") and not case.ds_load:
        loader.load_state_dict(state)
    else:
        ds.load_state_dict(state)


def epoch_of(state: dict[str, Any]) -> int:
    """The epoch a saved state (a shardio state or a whole StatefulDataLoader state) is in."""
    from shardio.jobstate import find_states

    epochs = {found.epoch for found in find_states(state)}  # its workers' states, which need not combine
    assert len(epochs) == 1, f"a state of epochs {sorted(epochs)}"
    return epochs.pop()


def life(
    case: Case,
    dirs: dict[str, str],
    world: Any,
    state: dict[str, Any] | None,
    stop: int | None,
    rollback: tuple[int, int] | None = None,
) -> tuple[list[Record], dict[str, Any] | None]:
    """One life of the job: build, restore ``state``, train ``stop`` batches (``None``: to the end of the
    run); the batches consumed and the state saved after the last. Checks ``len(ds)`` against
    what each epoch yields."""
    ds = make_dataset(case, dirs, world)
    loader = make_loader(case, ds)
    first = case.epoch
    if state is not None:
        restore(case, ds, loader, state)
        first = epoch_of(state)
    records: list[Record] = []
    states: dict[int, dict[str, Any] | None] = {0: state}
    epoch, rolled = first, False
    # StatefulDataLoader's own load_state_dict restores the workers only (without workers, the dataset at its
    # next iter()): until its iteration begins, the training process's len(ds) does not know the loaded
    # position (ds.load_state_dict gives it to both)
    loaded_unseen = case.loader == "stateful" and not case.ds_load and state is not None
    while epoch < case.epoch + case.epochs:
        ds.set_epoch(epoch)
        if states[0] is None:
            states[0] = save(case, ds, loader, None)
        if stop == len(records):
            return records, states[len(records)]
        knows, loaded_unseen = not loaded_unseen, False
        planned, yielded, restart = loader_batches(case, len(ds), ds.state_dict()["start"]), 0, None
        for batch in loader:
            records.append(record(batch))
            yielded += 1
            states[len(records)] = save(case, ds, loader, batch)
            if rollback is not None and not rolled and len(records) == rollback[1]:
                restart = states[rollback[0]]
                break
            if stop == len(records):
                return records, states[len(records)]
        if restart is not None:
            rolled = True
            assert restart is not None
            restore(case, ds, loader, restart)
            loaded_unseen = case.loader == "stateful" and not case.ds_load
            epoch = epoch_of(restart)
            continue
        assert yielded == planned or not knows, (
            f"epoch {epoch}: len(ds) said {planned}, the loader yielded {yielded}"
        )
        epoch += 1
    return records, states[len(records)]


def run(case: Case, dirs: dict[str, str], world: Any = None) -> list[Record]:
    """The whole job, stopped at ``case.stops`` and restarted each time: every batch consumed, in order."""
    records: list[Record] = []
    state, done = None, 0
    for number, stop in enumerate(case.stops):
        lived = (
            case if number == 0 or case.resume_workers is None else replace(case, workers=case.resume_workers)
        )
        taken, state = life(lived, dirs, world, state, stop - done)
        records += taken
        done = stop
    later = case if case.resume_workers is None else replace(case, workers=case.resume_workers)
    taken, _ = life(later if case.stops else case, dirs, world, state, None, case.rollback)
    return records + taken


def uninterrupted(case: Case, dirs: dict[str, str], world: Any = None) -> list[Record]:
    """The case's epochs played straight through in this process (a collated case: by its loader, whose
    workers' batches are what it yields)."""
    if case.batching == "collated":
        return life(replace(case, stops=(), rollback=None), dirs, world, None, None)[0]
    ds = make_dataset(case, dirs, world)
    records: list[Record] = []
    for epoch in range(case.epoch, case.epoch + case.epochs):
        ds.set_epoch(epoch)
        records += [record(batch) for batch in ds]
    return records


def expected(case: Case, straight: list[Record]) -> list[Record]:
    """What :func:`run` must consume: the straight run, with the rollback's stretch played twice."""
    base = case.stops[-1] if case.stops else 0
    if case.rollback is None or base + case.rollback[1] > len(straight):  # the last life ends before it
        return straight
    first, second = case.rollback
    return straight[: base + second] + straight[base + first :]


def check_same_world(case: Case, dirs: dict[str, str], world: Any = None) -> None:
    """The stopped and restarted run consumes what the uninterrupted one does (:func:`expected`)."""
    straight = uninterrupted(case, dirs, world)
    got = run(case, dirs, world)
    assert got == expected(case, straight), f"{case} diverged from the uninterrupted run"


def check_elastic(
    before: list[Record],
    after: list[Record],
    draws: list[Record],
    padded: int,
    dropped: int = 0,
    padded_before: int = 0,
) -> None:
    """``after`` consumes every draw of the epoch not in ``before`` exactly once, plus ``padded`` repeats,
    less the ``dropped`` ones (``remainder="drop"``: ``draws`` then holds every sample once). ``before`` may
    hold up to ``padded_before`` repeats of the old plan's padding (a DataLoader's workers that batch samples
    reach the last round's before the loader's last batch)."""
    consumed = Counter(key for _, keys, _ in before for key in keys)
    remaining = Counter(key for _, keys, _ in draws for key in keys) - consumed
    over = (consumed - Counter(key for _, keys, _ in draws for key in keys)).total()
    assert over <= padded_before, (
        f"consumed {over} keys more often than drawn, the old plan pads {padded_before}"
    )
    got = Counter(key for _, keys, _ in after for key in keys)
    lost = remaining - got
    assert lost.total() == dropped, (
        f"{lost.total()} lost in the elastic resume (the plan drops {dropped}): {sorted(lost.elements())[:5]}"
    )
    assert (got - remaining).total() == padded, (
        f"{(got - remaining).total()} repeats, the plan reports {padded}"
    )


def resumed_dataset(case: Case, dirs: dict[str, str], world: Any, state: dict[str, Any]) -> Any:
    """The case's dataset for ``world`` with ``state`` loaded."""
    ds = make_dataset(case, dirs, world)
    ds.load_state_dict(state)
    return ds


def length(case: Case, dirs: dict[str, str], world: Any = None) -> int:
    """Batches per rank in the case's first epoch."""
    return sum(1 for record in uninterrupted(replace(case, epochs=1), dirs, world))


def stopped(
    case: Case, dirs: dict[str, str], world_size: int, batches: int, per_node: int = 1
) -> tuple[list[list[Record]], dict[str, Any]]:
    """``world_size`` ranks (``per_node`` a node) start the job and play ``batches`` batches each; each rank's
    records and rank 0's state."""
    from shardio import World

    ranks, state = [], None
    for rank in range(world_size):
        records, saved = life(case, dirs, World(rank, world_size, ranks_per_node=per_node), None, batches)
        ranks.append(records)
        state = saved if rank == 0 else state
    assert state is not None
    return ranks, state


def check_world_change(
    case: Case, dirs: dict[str, str], old: int, new: int, stop: int, per_node: tuple[int, int] = (1, 1)
) -> None:
    """``old`` ranks play ``stop`` batches of the epoch, then ``new`` ranks resume rank 0's state: the rest of
    the epoch once (:func:`check_elastic`), with the resumed plan's padding, or less its dropped samples.
    ``per_node``: the old and the new world's ranks per node (``World.ranks_per_node``)."""
    from shardio import World

    ranks, state = stopped(case, dirs, old, stop, per_node[0])
    before = [record for records in ranks for record in records]
    after = []
    for rank in range(new):
        records, _ = life(case, dirs, World(rank, new, ranks_per_node=per_node[1]), state, None)
        after += records
    plan = resumed_dataset(case, dirs, World(0, new, ranks_per_node=per_node[1]), state).plan()
    old_plan = make_dataset(case, dirs, World(0, old, ranks_per_node=per_node[0])).plan(case.epoch)
    if case.extra.get("remainder") == "drop":
        every = make_dataset(case, dirs, World(0, 1)).index.keys
        check_elastic(before, after, [(case.epoch, tuple(every), ())], 0, plan.dropped)
    else:
        check_elastic(
            before,
            after,
            uninterrupted(case, dirs, World(0, 1)),
            plan.padded,
            padded_before=old_plan.padded if case.batching == "collated" else 0,
        )


# -- rank processes ------------------------------------------------------------------------------


def rank_entry(rank: int, world_size: int, port: int, config: dict[str, Any]) -> None:
    """One rank of a gloo group: join it as ``config["ranks"]`` says, play one life, write the result.

    ``ranks``: ``env`` (``RANK``/``WORLD_SIZE`` set, as torchrun does), ``init``
    (``init_process_group(rank=..., world_size=...)`` with no such environment), ``explicit``
    (``world=World(...)``, no environment either).
    """
    import traceback
    from datetime import timedelta

    import torch.distributed as dist

    from shardio import World

    out = Path(config["out"])
    try:
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            if config["ranks"] != "env" or name not in os.environ:
                os.environ.pop(name, None)
        if config["ranks"] == "env" and "RANK" not in os.environ:
            os.environ.update(
                {
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world_size),
                }
            )
        world = None
        if config["ranks"] == "init":
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=60),
            )
        elif config["ranks"] == "env":
            dist.init_process_group("gloo", timeout=timedelta(seconds=60))
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            world = World(rank=rank, world_size=world_size)
        case = Case(
            **{
                **config["case"],
                "stops": tuple(config["case"]["stops"]),
                "rollback": None if config["case"]["rollback"] is None else tuple(config["case"]["rollback"]),
            }
        )
        state = json.loads(Path(config["load"]).read_text()) if config.get("load") else None
        if config.get("whole"):
            records, saved = run(case, config["dirs"], world), None
        else:
            records, saved = life(case, config["dirs"], world, state, config.get("stop"))
        result = {"rank": rank, "world_size": world_size, "records": records, "state": saved}
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except BaseException:
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        raise


def spawn_entry(rank: int, world_size: int, port: int, config: dict[str, Any]) -> None:
    """:func:`rank_entry` with ``torch.multiprocessing.spawn``'s argument order."""
    rank_entry(rank, world_size, port, config)


def case_config(case: Case) -> dict[str, Any]:
    """``case`` as JSON-ready fields, for a rank process."""
    return asdict(case)


def records_of(result: dict[str, Any]) -> list[Record]:
    """A rank's records back from JSON."""
    return [(int(e), tuple(k), tuple(g)) for e, k, g in result["records"]]


def step_records(ranks: list[list[Record]], accumulation: int) -> list[tuple[tuple[str, float], ...]]:
    """Each optimizer step's samples (key and augmentation draw), over every rank's ``accumulation``
    batches of it, whichever rank and micro-batch held them."""
    count = len(ranks[0]) // accumulation
    assert all(len(records) == count * accumulation for records in ranks), "ranks of unequal step counts"
    return [
        tuple(
            sorted(
                (key, draw)
                for records in ranks
                for _, keys, draws in records[s * accumulation : (s + 1) * accumulation]
                for key, draw in zip(keys, draws)
            )
        )
        for s in range(count)
    ]


def check_steps_world_change(
    case: Case, dirs: dict[str, str], old: int, new: int, step: int, epochs: int = 1
) -> None:
    """With ``step_batches`` (in ``case.extra``): ``old`` ranks play ``step`` optimizer steps of the epoch,
    then ``new`` ranks resume rank 0's state and play the straight ``old``-rank run's steps from ``step``
    on, sample for sample (and every rank the same number of batches), to the end of ``epochs`` epochs (more
    than one: persistent workers carry the resumed life into the next epoch)."""
    from shardio import World

    k = case.extra["step_batches"]
    case = replace(case, epochs=epochs)
    straight = step_records([uninterrupted(case, dirs, World(r, old)) for r in range(old)], k // old)
    assert 0 <= step <= len(straight)
    before, state = stopped(case, dirs, old, step * k // old)
    assert step_records(before, k // old) == straight[:step]
    assert resumed_dataset(case, dirs, World(0, new), state).accumulation == k // new
    after = [life(case, dirs, World(rank, new), state, None)[0] for rank in range(new)]
    assert step_records(after, k // new) == straight[step:], f"{case}: {old} -> {new} ranks left the steps"
