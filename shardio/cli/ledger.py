"""The data ledger's subcommands of the ``shardio`` command line: ``trace`` and ``quarantine`` (``remix``:
:mod:`shardio.cli.remix`).

Each is a pair as in :mod:`shardio.cli.main`: ``add_NAME(subparsers)`` builds its parser and sets ``run``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from typing import Any

from ..errors import OptionError, shown_path

__all__ = ["OUT_HELP", "STATE_HELP", "add_quarantine", "add_trace", "counted_from"]

STATE_HELP = (
    "the saved loader state: a JSON state, a torch.save checkpoint holding one (a Lightning .ckpt "
    "too), or an Accelerate save_state directory; read with torch.load(weights_only=True)"
)
COUNTED_FROM_HELP = (
    "how the global steps given count: 1 (the default, but for a Lightning .ckpt): the number of batches "
    "trained once that batch was, what the HF Trainer's state.global_step and a loop that adds 1 after "
    "each batch log for it; 0 (the default for a Lightning .ckpt): Lightning's trainer.global_step and "
    "logged step, or a loop that logs before its += 1"
)
OUT_HELP = (
    "where to write the new state: a copy of --state's checkpoint (same kind, the model's weights "
    "unchanged) with the new state in the old one's place, so the job resumes from it as it did"
)


def add_trace(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "trace",
        help="which samples each rank's batch held at a step, or where a key is",
        description="Answer from the plan alone (no audio read): the keys of every rank's "
        "batch at a step, every (epoch, step, rank) of a key, or a whole epoch.",
    )
    parser.add_argument("dataset", nargs="+", help="the dataset directory (a mix: NAME=LOCATION per corpus)")
    parser.add_argument("--state", required=True, help=STATE_HELP)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--step",
        type=int,
        metavar="S",
        help="epoch step S: batches per rank since the epoch's start, from 0 (its first batch is step 0); "
        "with Batching(step_batches=K), optimizer steps: each of K / world batches per rank (micro-batches)",
    )
    what.add_argument(
        "--global-step",
        type=int,
        metavar="G",
        help="the global step G your trainer logged for a batch, across epochs (counted as "
        "--counted-from says): mapped to an epoch and epoch step through each epoch's planned "
        "length, printed first with the count applied",
    )
    what.add_argument("--key", action="append", metavar="K", help="a sample key (repeat for several)")
    what.add_argument("--epoch", type=int, metavar="E", help="the whole epoch E, one row per (step, rank)")
    parser.add_argument("--stop", type=int, metavar="S2", help="with --step: epoch steps S to S2 - 1")
    parser.add_argument("--rank", type=int, metavar="R", help="with --step: rank R only")
    parser.add_argument(
        "--in-epoch", type=int, metavar="E", help="with --step: this epoch (default: the state's)"
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=1,
        metavar="N",
        help="with --key: search N epochs from the state's (default 1, at most 1000)",
    )
    parser.add_argument(
        "--counted-from", type=int, choices=(0, 1), help="with --global-step: " + COUNTED_FROM_HELP
    )
    parser.add_argument("--json", action="store_true", help="JSON Lines: one object per (epoch, step, rank)")
    parser.add_argument("--csv", action="store_true", help="with --step/--epoch: CSV, one line per sample")
    parser.set_defaults(run=_run_trace)


def _run_trace(args: argparse.Namespace) -> int:
    from ..ledger.checkpoints import read_checkpoint
    from ..ledger.rebuild import open_for_state, write_rows, write_samples
    from ..ledger.trace import Trace

    _check_trace_args(args)
    checkpoint = read_checkpoint(args.state)
    state = checkpoint.state
    trace = Trace(open_for_state(args.dataset, state), state)
    if args.global_step is not None:
        _check_global_steps(trace, checkpoint)
        base, why = counted_from(checkpoint.container, args.counted_from)
        args.in_epoch, args.step = trace.epoch_step(_from_zero(args.global_step, base))
        print(
            f"# global step {args.global_step} ({why}) is epoch {args.in_epoch} epoch step {args.step} "
            "(from 0), if every epoch before ran whole on this world size",
            file=sys.stderr,
        )
    if args.key:
        epochs = range(trace.state.epoch, trace.state.epoch + args.epochs)
        for found in trace.find(args.key, epochs):
            corpus = f" ({found['corpus']})" if "corpus" in found else ""
            ahead = " (consumed ahead)" if found.get("ahead") else ""
            print(
                json.dumps(found)
                if args.json
                else f"{shown_path(found['key'])}{corpus}: epoch {found['epoch']} step {found['step']} rank "
                f"{found['rank']}{ahead}"
            )
        return 0
    if args.epoch is not None:
        records = trace.epoch(args.epoch)
    else:
        epoch = trace.state.epoch if args.in_epoch is None else args.in_epoch
        records = iter(trace.steps(epoch, args.step, args.stop, args.rank))
    rows = (trace.row(record) for record in records)
    if not (args.csv or args.json or args.epoch is not None):
        print(
            "# step: the epoch step, batches per rank from 0 at the epoch's start (--global-step takes a "
            "trainer's)"
        )
    if args.csv:
        write_samples(rows, sys.stdout, trace.planner.batching.step_batches is not None)
    else:
        write_rows(rows, sys.stdout, args.json or args.epoch is not None)
    return 0


def _check_trace_args(args: argparse.Namespace) -> None:
    """An :class:`OptionError` for options the chosen question does not take (never silently ignored), or for
    more epochs than one search takes (:data:`~shardio.ledger.trace.MAX_FIND_EPOCHS`)."""
    from ..ledger.trace import MAX_FIND_EPOCHS

    by_step = args.step is not None or args.global_step is not None
    stray = [
        name
        for name, given in (
            ("--stop", args.stop is not None),
            ("--rank", args.rank is not None),
            ("--in-epoch", args.in_epoch is not None),
        )
        if given and not by_step
    ]
    stray += ["--counted-from"] if args.counted_from is not None and args.global_step is None else []
    stray += ["--in-epoch"] if args.in_epoch is not None and args.global_step is not None else []
    stray += ["--stop"] if args.stop is not None and args.global_step is not None else []
    stray += ["--epochs"] if args.epochs != 1 and not args.key else []
    stray += ["--csv"] if args.csv and args.key else []
    if stray:
        raise OptionError(
            f"not with this question: {', '.join(stray)} (--stop, --rank and --in-epoch go with --step, "
            "--epochs with --key, --csv with --step or --epoch)"
        )
    if args.key and args.epochs < 1:
        raise OptionError(f"--epochs must be at least 1, not {args.epochs}")
    if args.key and args.epochs > MAX_FIND_EPOCHS:
        raise OptionError(
            f"--epochs must be at most {MAX_FIND_EPOCHS} (each epoch searched is planned in "
            f"full), not {args.epochs}: search from a later epoch's state for later epochs"
        )
    if args.csv and args.json:
        raise OptionError("--csv and --json: choose one")


def _step_range(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+):(\d+)", text)
    if match is None or int(match.group(1)) >= int(match.group(2)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a step range A:B with A < B")
    return int(match.group(1)), int(match.group(2))


def add_quarantine(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "quarantine",
        help="a state that resumes without some keys or steps",
        description="Write a copy of a saved loader state whose resume leaves the given "
        "keys (or every rank's batch at the given steps) out of the rest of "
        "the epoch; every other remaining sample is still seen once.",
    )
    parser.add_argument("dataset", nargs="+", help="the dataset directory (a mix: NAME=LOCATION per corpus)")
    parser.add_argument("--state", required=True, help=STATE_HELP)
    parser.add_argument("--out", required=True, help=OUT_HELP)
    parser.add_argument("--key", action="append", default=[], metavar="K", help="a key to leave out (repeat)")
    parser.add_argument(
        "--steps",
        type=_step_range,
        metavar="A:B",
        help="leave out every rank's batch at epoch steps A to B - 1 (from 0 at the epoch's "
        "start, as trace --step counts: optimizer steps with step_batches; trace --global-step G names "
        "the epoch step of a trainer's global step)",
    )
    parser.add_argument(
        "--global-steps",
        type=_step_range,
        metavar="G1:G2",
        help="as --steps, for the global steps G1 to G2 - 1 your trainer logged (across epochs, "
        "counted as --counted-from says; mapped as trace --global-step maps them, within the state's "
        "epoch)",
    )
    parser.add_argument(
        "--counted-from", type=int, choices=(0, 1), help="with --global-steps: " + COUNTED_FROM_HELP
    )
    parser.add_argument("--carry", action="store_true", help="leave them out of later epochs too")
    parser.set_defaults(run=_run_quarantine)


def _run_quarantine(args: argparse.Namespace) -> int:
    from ..ledger.checkpoints import read_checkpoint, write_checkpoint
    from ..ledger.quarantine import quarantine, quarantine_report
    from ..ledger.rebuild import open_for_state

    checkpoint = read_checkpoint(args.state)
    state = checkpoint.state
    dataset = open_for_state(args.dataset, state)
    steps = args.steps
    if args.counted_from is not None and args.global_steps is None:
        raise OptionError("--counted-from goes with --global-steps")
    if args.global_steps is not None:
        steps = _epoch_steps(dataset, checkpoint, args)
    healed = quarantine(state, dataset, keys=args.key, steps=steps, carry=args.carry)
    written = write_checkpoint(checkpoint, healed, args.out)  # --out may be --state: never half-written
    rows = quarantine_report(healed)
    print(
        f"quarantined {len(rows)} samples; resume from {shown_path(args.out)} (the state at "
        f"{_place(checkpoint, written)})"
    )
    for row in rows:
        notes = ("\talready consumed this epoch" if row["already_consumed"] else "") + (
            "\tcarried" if row["carry"] else ""
        )
        print(f"  {shown_path(row['key'])}\tepoch {row['epoch']} from step {row['from_step']}{notes}")
    return 0


def _epoch_steps(dataset: Any, checkpoint: Any, args: argparse.Namespace) -> tuple[int, int]:
    """``--global-steps G1:G2`` as epoch steps of the state's epoch (an :class:`OptionError` otherwise)."""
    from ..ledger.trace import Trace

    if args.steps is not None:
        raise OptionError("--steps and --global-steps: choose one")
    trace = Trace(dataset, checkpoint.state)
    _check_global_steps(trace, checkpoint)
    base, why = counted_from(checkpoint.container, args.counted_from)
    first, last = (
        trace.epoch_step(_from_zero(g, base)) for g in (args.global_steps[0], args.global_steps[1] - 1)
    )
    if first[0] != trace.state.epoch or last[0] != trace.state.epoch:
        raise OptionError(
            f"global steps {args.global_steps[0]}:{args.global_steps[1]} are epoch {first[0]} step "
            f"{first[1]} to epoch {last[0]} step {last[1]}; a quarantine takes steps of the state's "
            f"epoch {trace.state.epoch} (keys: --key, with --carry for later epochs)"
        )
    print(
        f"# global steps {args.global_steps[0]}:{args.global_steps[1]} ({why}) are epoch {first[0]} epoch "
        f"steps {first[1]}:{last[1] + 1} (from 0)",
        file=sys.stderr,
    )
    return first[1], last[1] + 1


def _check_global_steps(trace: Any, checkpoint: Any) -> None:
    """An :class:`OptionError` where the checkpoint records a trainer's global step that the plan does not
    give its state (earlier epochs cut short or on another world size, or gradient accumulation): a global
    step would map to the wrong batch."""
    recorded = checkpoint.global_step
    if recorded is None:
        return
    planned = trace.global_step(trace.state.epoch, trace.position_step())
    if planned != recorded:
        raise OptionError(
            f"the checkpoint records global_step {recorded}, but its state stands at epoch "
            f"{trace.state.epoch} epoch step {trace.position_step()}, global step {planned} as the "
            "plan counts (earlier epochs cut short or on another world size, or several batches an "
            "optimizer step): a global step would name the wrong batch; use --step with --in-epoch"
        )


def counted_from(container: Any, given: int | None) -> tuple[int, str]:
    """How a global step a user gives counts (0 or 1), and that in words for the mapping's line: ``given``
    (``--counted-from``), else by the checkpoint ``container``: a Lightning checkpoint's from 0 (its
    ``trainer.global_step`` while the batch trains, the step its loggers record), every other from 1 (the HF
    Trainer's ``state.global_step`` after the batch's update, the documented loops' count after ``+= 1``)."""
    if given is not None:
        return given, f"counted from {given}, as --counted-from {given} says"
    if isinstance(container, Mapping) and "pytorch-lightning_version" in container:
        return 0, "counted from 0: a Lightning checkpoint's, as its trainer.global_step and loggers count"
    return 1, (
        "counted from 1: the batches trained once it was, as a loop logs global_step after its += 1 and the "
        "HF Trainer its state.global_step; --counted-from 0 for a count from 0"
    )


def _from_zero(global_step: int, base: int) -> int:
    if global_step < base:
        raise OptionError(f"global step {global_step}: counted from {base}, the first batch's is {base}")
    return global_step - base


def _place(checkpoint: Any, written: str) -> str:
    """Where the new state is in the file written, in words (``out.pt['loader']``)."""
    return shown_path(written) + "".join(f"[{key!r}]" for key in checkpoint.where or ())
