"""The comparison behind ``shardio check-resume``: what a killed and restarted run trained on, against what a
straight run did, from their yield logs (:mod:`shardio.runtime.yieldlog`).

What a restarted run *trained on*: each killed part's batches up to the state that the next part loaded (the
batches after it were trained on by a model that the restart threw away), then the next part's. A part that
loaded no state is taken whole. With one world size the check is step by step, rank by rank; across world
sizes it is exactly-once: each epoch's keys (planned repeats left out) the same, over all ranks.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..runtime.yieldlog import BatchRecord, LoadRecord

__all__ = ["Verdict", "compare_runs", "trained_batches"]

PAGE = "docs/guides/checkpoint-resume.md"
CHECK_PAGE = "docs/guides/check-resume.md"
LIGHTNING_PAGE = "docs/trainers/lightning.md"

Records = Sequence[BatchRecord | LoadRecord]


@dataclass
class Verdict:
    """The outcome: ``exact``, else the first difference (``kind``), its likely cause and the page that fixes
    it, as report lines."""

    exact: bool
    lines: list[str] = field(default_factory=list)
    kind: str | None = None
    page: str | None = None


@dataclass(frozen=True)
class _Trained:
    batch: BatchRecord
    part: int  # which run of the restarted job (0: the one killed first)
    first: bool  # the first batch of its part


def _streams(records: Records) -> dict[tuple[str, int], list[BatchRecord]]:
    """Each (dataset, rank)'s batches in the order they were handed over: iterations in the order they began,
    each in plan order."""
    groups: dict[tuple[str, int], dict[str, list[BatchRecord]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if isinstance(record, BatchRecord):
            groups[(record.src, record.rank)][record.iteration].append(record)
    return {
        stream: [
            b
            for group in sorted(its.values(), key=lambda g: min(b.t for b in g))
            for b in sorted(group, key=lambda b: b.step)
        ]
        for stream, its in groups.items()
    }


def _first_load(records: Records, src: str) -> LoadRecord | None:
    loads = [r for r in records if isinstance(r, LoadRecord) and r.src == src]
    return min(loads, key=lambda r: r.t) if loads else None


def _cut(trained: list[_Trained], epoch: int, position: int) -> bool:
    """Keep the batches up to the one after which the state (``epoch``, ``position``) was saved; False when
    no batch trained so far stands there."""
    for i in range(len(trained) - 1, -1, -1):
        b = trained[i].batch
        if (position > 0 and (b.epoch, b.step) == (epoch, position - 1)) or (
            position == 0 and b.epoch < epoch
        ):
            del trained[i + 1 :]
            return True
    if position == 0:
        trained.clear()
        return True
    return False


def trained_batches(
    parts: Sequence[Records], src: str
) -> tuple[dict[int, list[_Trained]], list[LoadRecord | None], list[bool]]:
    """What the restarted run trained on, per rank; each part's first loaded state, and whether it was one the
    parts before had reached."""
    trained: dict[int, list[_Trained]] = defaultdict(list)
    loads: list[LoadRecord | None] = []
    placed: list[bool] = []
    for number, records in enumerate(parts):
        load = _first_load(records, src) if number else None
        loads.append(load)
        placed.append(load is None or all(_cut(t, load.epoch, load.position) for t in trained.values()))
        for (source, rank), batches in _streams(records).items():
            if source == src:
                trained[rank] += [_Trained(b, number, i == 0) for i, b in enumerate(batches)]
    return trained, loads, placed


def _where(b: BatchRecord) -> str:
    return f"epoch {b.epoch} step {b.step}"


def compare_runs(straight: Records, parts: Sequence[Records], *, exactly_once: bool = False) -> Verdict:
    """Compare a restarted run (its parts, the first killed) with a straight run.

    Args:
        straight: The straight run's records.
        parts: The restarted run's records, part by part.
        exactly_once: Compare each epoch's keys over all ranks (a world-size change), not step by step.

    Returns:
        The verdict.
    """
    expected = _streams(straight)
    if not expected:
        return Verdict(False, ["the straight run yielded no batch with the yield log on"], "nothing")
    loaded = {r.src for part in parts for r in part if isinstance(r, LoadRecord)}
    sources = sorted({src for src, _ in expected if not loaded or src in loaded})
    for src in sources:
        trained, loads, placed = trained_batches(parts, src)
        found = (
            _exactly_once(expected, trained, src, loads)
            if exactly_once
            else _step_by_step(expected, trained, src, loads, placed)
        )
        if found is not None:
            return found
    ranks = len({rank for _, rank in expected})
    steps = sum(len(b) for (s, _), b in expected.items() if s in sources)
    return Verdict(True, [f"exact: {steps} batches over {ranks} rank(s) trained as in the straight run"])


def _cause(
    part: int, load: LoadRecord | None, placed: bool, trainer: str | None = None
) -> tuple[str, str, str]:
    """The likely cause of a difference first seen in ``part`` (run under ``trainer``): (what, why, page)."""
    if part == 0:
        return (
            "not reproducible",
            "the first run differs from the straight run before any kill: the job is not the same run to run "
            "(an unseeded shuffle or model, a time or step limit): fix the seed, or give --steps",
            f"{CHECK_PAGE}#jobs-that-differ-run-to-run",
        )
    if load is None and trainer == "lightning":
        return (
            "state never loaded",
            "the restarted Lightning run loaded no loader state: Lightning saves none for a plain DataLoader "
            "and restarts the epoch at its first batch (and the dataset at epoch 0); add ShardioCallback and "
            "pass the dataset through its attach()",
            f"{LIGHTNING_PAGE}#without-the-callback",
        )
    if load is None:
        return (
            "state never loaded",
            "the restarted run loaded no loader state: save loader.state_dict() in the checkpoint and call "
            "loader.load_state_dict() before the first iteration",
            f"{PAGE}#what-each-loader-saves",
        )
    if load.after_iter:
        return (
            "loaded after the first iter()",
            "the loader state was loaded once an iteration had begun, so that iteration restarted its epoch: "
            "load it before the loop (before iter(loader))",
            f"{PAGE}#a-plain-loop-with-dataloader",
        )
    if not placed:
        return (
            "an older state",
            f"the state loaded (epoch {load.epoch}, position {load.position}) is not one the killed run "
            "reached: the checkpoint and the loader state were saved at different times",
            f"{PAGE}#what-each-loader-saves",
        )
    return ("", "", PAGE)


def _step_by_step(
    expected: dict[tuple[str, int], list[BatchRecord]],
    trained: dict[int, list[_Trained]],
    src: str,
    loads: list[LoadRecord | None],
    placed: list[bool],
) -> Verdict | None:
    for (source, rank), want in sorted(expected.items()):
        if source != src:
            continue
        got = trained.get(rank, [])
        n = next((i for i, (w, g) in enumerate(zip(want, got)) if w.digest != g.batch.digest), None)
        if n is None and len(want) == len(got):
            continue
        n = min(len(want), len(got)) if n is None else n
        part = got[n].part if n < len(got) else (got[-1].part if got else len(loads) - 1)
        trainer = next((t.batch.trainer for t in got if t.part == part and t.batch.trainer), None)
        what, why, page = _cause(part, loads[part], placed[part], trainer)
        lines = [f"rank {rank}, trained batch {n} (counted from 0 over the epochs):"]
        if (
            part and loads[part] is None
        ):  # no state loaded: nothing says where the killed run's checkpoint stood
            lines[0] = lines[0][:-2] + ", with every batch the killed run yielded):"
        if n >= len(got):
            kind = what or "skipped"
            lines.append(
                f"  the restarted run ended after {len(got)} batches; the straight run trained {len(want)} "
                f"(from {_where(want[n])} on: skipped)"
            )
        elif n >= len(want):
            kind = what or "repeated"
            lines.append(
                f"  the restarted run trained {len(got) - len(want)} batches more than the straight run's "
                f"{len(want)} (from {_where(got[n].batch)}: repeated)"
            )
        else:
            w, g = want[n], got[n].batch
            how, kind, why, page = _how(want, got, n, loads[part], (what, why, page))
            place = f"(the first batch after restart {got[n].part})" if got[n].first else ""
            lines.append(f"  straight run: {_where(w)}; restarted run: {_where(g)} {place}".rstrip())
            lines.append(f"  {how}")
        if not what and (n >= len(got) or n >= len(want)):
            why, page = TRAINER_CAUSE, f"{CHECK_PAGE}#what-it-compares"
        if what == "state never loaded" and n < len(got) and got[n].batch.digest == want[0].digest:
            why += " (or the kill came before the job's first checkpoint: give a later --kill-at)"
        if why:
            lines.append(f"  likely cause: {why}")
        lines.append(f"  see {page}")
        return Verdict(False, [f"differs: {kind}", *lines], kind, page)
    return None


TRAINER_CAUSE = (
    "the state was loaded in time: the trainer itself skips or repeats batches (a step count restored apart "
    "from the loader's state, a break at a step limit), or the loader's state was saved at another moment "
    "than the model"
)


def _how(
    want: list[BatchRecord],
    got: list[_Trained],
    n: int,
    load: LoadRecord | None,
    cause: tuple[str, str, str],
) -> tuple[str, str, str, str]:
    """How trained batch ``n`` differs: (how, kind, likely cause, page); ``cause``: the restart's, if any."""
    what, why, page = cause
    w, g = want[n], got[n].batch
    before = {t.batch.digest: i for i, t in enumerate(got[:n])}
    if not what and g.epoch != w.epoch and load is not None and g.epoch != load.epoch:
        why = (
            f"the epoch set after the restart ({g.epoch}) is not the loaded state's ({load.epoch}): "
            "set_epoch(epoch) from the state's epoch (state['epoch']), as the straight run did"
        )
        how = f"another epoch: epoch {g.epoch} where the straight run trained epoch {w.epoch}"
        return how, "another epoch", why, f"{CHECK_PAGE}#what-it-compares"
    if g.digest in before:
        how, kind = f"repeated: the batch trained already as batch {before[g.digest]}", "repeated"
    elif g.epoch != w.epoch:
        how, kind = (
            f"another epoch: epoch {g.epoch} where the straight run trained epoch {w.epoch}",
            "another epoch",
        )
    elif w.digest in {t.batch.digest for t in got[n + 1 :]}:
        how, kind = "another order: the straight run's batch comes later", "another order"
    elif g.digest in {b.digest for b in want[n + 1 :]}:
        how, kind = "skipped: the straight run's batches up to this one were never trained", "skipped"
    else:
        how, kind = "other samples than the straight run's", "other batches"
    if not what:
        return how, kind, TRAINER_CAUSE, f"{CHECK_PAGE}#what-it-compares"
    return how, what, why, page


def _exactly_once(
    expected: dict[tuple[str, int], list[BatchRecord]],
    trained: dict[int, list[_Trained]],
    src: str,
    loads: list[LoadRecord | None],
) -> Verdict | None:
    want: dict[int, Counter[str]] = defaultdict(Counter)
    got: dict[int, Counter[str]] = defaultdict(Counter)
    for (source, _), batches in expected.items():
        for b in batches if source == src else ():
            want[b.epoch].update(b.fresh or ())
    for t in (t for ts in trained.values() for t in ts):
        got[t.batch.epoch].update(t.batch.fresh or ())
    if not any(want.values()):
        return Verdict(False, ["the yield log holds no keys (SHARDIO_YIELD_LOG_KEYS=1 is needed)"], "nothing")
    for epoch in sorted(set(want) | set(got)):
        missing, extra = want[epoch] - got[epoch], got[epoch] - want[epoch]
        if not missing and not extra:
            continue
        part = next((i for i, load in enumerate(loads) if i and load is None), None)
        what, why, page = _cause(part, None, True) if part is not None else ("", "", PAGE)
        kind = what or ("skipped" if missing else "repeated")
        lines = [f"differs: {kind}", f"  epoch {epoch}: {sum(missing.values())} samples never trained"]
        lines.append(f"  {sum(extra.values())} trained more often than in the straight run")
        shown_keys = sorted(missing or extra)[:3]
        lines.append(f"  e.g. {', '.join(repr(k) for k in shown_keys)}")
        if why:
            lines.append(f"  likely cause: {why}")
        lines.append(f"  see {page}")
        return Verdict(False, lines, kind, page)
    return None
