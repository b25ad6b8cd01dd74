"""The ``shardio remix`` subcommand: a state of a mix that resumes under new weights or corpora (see
:func:`shardio.remix`). A pair as in :mod:`shardio.cli.main`: ``add_remix(subparsers)`` builds its
parser and sets ``run``."""

from __future__ import annotations

import argparse
from collections import Counter

from ..errors import OptionError, shown_path
from .ledger import OUT_HELP, STATE_HELP

__all__ = ["add_remix"]


def _weight(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    try:
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=WEIGHT") from None


def add_remix(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "remix",
        help="a state of a mix that resumes under new weights or corpora",
        description="Write a state for a new mix (weights changed, corpora added or "
        "dropped) that continues a saved state of the old one, at an epoch "
        "boundary or mid-epoch, every corpus's passes exact "
        "(see shardio.remix).",
    )
    parser.add_argument(
        "dataset", nargs="+", help="NAME=LOCATION for every corpus of the old and the new mix"
    )
    parser.add_argument("--state", required=True, help="the old mix's state: " + STATE_HELP)
    parser.add_argument(
        "--weight",
        type=_weight,
        action="append",
        required=True,
        metavar="NAME=W",
        help="a corpus of the new mix and its weight (repeat)",
    )
    parser.add_argument(
        "--primary", help="the new mix's epoch is one pass over this corpus (default: the old epoch size)"
    )
    parser.add_argument("--out", required=True, help=OUT_HELP)
    parser.set_defaults(run=_run_remix)


def _run_remix(args: argparse.Namespace) -> int:
    from ..datasets.mixed import MixedDataset
    from ..jobstate import job_state
    from ..ledger.checkpoints import read_checkpoint, write_checkpoint
    from ..ledger.rebuild import open_for_state, state_corpora
    from ..ledger.remix import remix, remix_report
    from ..planning.mixoptions import EpochSize

    checkpoint = read_checkpoint(args.state)
    state = checkpoint.state
    sources = _sources(args.dataset)
    weights = dict(args.weight)
    twice = sorted(name for name, count in Counter(name for name, _ in args.weight).items() if count > 1)
    if twice:
        raise OptionError(f"--weight names {twice} more than once")
    old_names = state_corpora(job_state(state).options)  # a StateError where it is not a mix's
    if not old_names:
        raise OptionError("remix needs the state of a mix; this state is of one dataset")
    old = open_for_state([f"{n}={sources[n]}" for n in old_names if n in sources], state)
    missing = sorted(set(weights) - set(sources))
    if not isinstance(old, MixedDataset) or missing:
        raise OptionError(
            f"remix needs a mix's state and NAME=LOCATION for every corpus of the new mix "
            f"(missing: {missing})"
        )
    size = EpochSize(primary=args.primary) if args.primary else old.mix.epoch_size
    new = MixedDataset(
        {n: sources[n] for n in weights},
        weights,
        size,
        weight_by=old.mix.weight_by,
        single_corpus_batches=old.mix.single_corpus_batches,
        batching=old.batching,
        seed=old.seed,
        ordering=old.ordering,
    )
    mixed = remix(state, old, new)
    write_checkpoint(checkpoint, mixed, args.out)
    event = remix_report(mixed)[
        -len(mixed["extra"]["remix"]["events"][-1]["corpora"]) :
    ]  # this re-mix's rows
    print(
        f"re-mixed at epoch {event[0]['epoch']} step {event[0]['step']} ({event[0]['at']}); resume from "
        f"{shown_path(args.out)}"
    )
    for row in event:
        extra = (
            f"\t{row['remaining']} of its {row['slice']} positions this epoch left" if "slice" in row else ""
        )
        print(
            f"  {row['corpus']}\t{row['status']}\tweight {row['old_weight']} -> {row['new_weight']}{extra}"
            + (f"\t{row['pending']} pending" if row["pending"] else "")
        )
    return 0


def _sources(locations: list[str]) -> dict[str, str]:
    """``NAME=LOCATION`` arguments as a dict: an :class:`OptionError` for one without a name
    or a name given twice."""
    pairs = [location.split("=", 1) for location in locations]
    bad = [
        location for location, pair in zip(locations, pairs) if len(pair) != 2 or not pair[0] or not pair[1]
    ]
    if bad:
        raise OptionError(f"remix takes NAME=LOCATION for every corpus, not {bad[:3]}")
    names = [pair[0] for pair in pairs]
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:
        raise OptionError(f"corpora {twice} are given more than once")
    return dict(pairs)
