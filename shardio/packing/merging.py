"""The merge of a partitioned pack: the committed index parts joined into the dataset's index.

:func:`merge_partitions` runs on the driver once every partition of a
:class:`~shardio.packing.partitions.PartitionPlan` has committed its index part (``_parts/{p:05d}/``). It
refuses a part that another plan packed (its report names another plan, or it holds other samples than the
plan gives that partition), joins the parts in partition order (never completion order), so the result does
not depend on which engine ran the partitions, renumbers their shards and audio formats, checks keys are
unique over the whole dataset, writes the rejected inputs (``on_error="skip"``), the columns file and then
``index.json``, and removes what the plan wrote under ``_parts`` (:mod:`shardio.packing.partfiles`). Under
``on_error="raise"`` a part with rejected inputs is uncommitted again and nothing is written.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np

from ..errors import FormatError, InputError, InputProblem, shown, shown_path
from ..shards.index import INDEX_COLUMNS, INDEX_JSON, Index
from ..shards.keys import Keys
from .pack import REJECTED_FILE
from .partfiles import PartReport, part_dir, read_report, remove_part, remove_parts
from .partitions import PartitionPlan, partition_done

__all__ = ["merge_partitions"]


def merge_partitions(plan: PartitionPlan) -> tuple[Index, list[InputProblem], int]:
    """Join the committed index parts in partition order and write the dataset's index (last).

    Returns ``(index, rejected inputs, input bytes)``; raises :class:`~shardio.errors.InputError` when
    ``on_error="raise"`` and any input failed (no index is written then).
    """
    out, output = plan.out_dir, plan.output
    problems = list(plan.problems)
    shards: list[Any] = []
    formats: list[str] = []
    columns: dict[str, list[np.ndarray]] = {}
    keys: list[str] = []
    input_bytes = 0
    failed: list[int] = []
    for number in range(len(plan.partitions)):
        if not partition_done(plan, number):
            raise FormatError(
                f"{shown_path(output.path(part_dir(number)))}: partition {number} has no committed index "
                "part; pack it before merging"
            )
        part = Index.load(output.path(part_dir(number)), plan.storage_options)
        report = read_report(output, number, len(plan.partitions[number]))
        _check_part(plan, number, report, list(part.keys))
        problems.extend(report.problems)
        if report.problems:
            failed.append(number)
        input_bytes += report.input_bytes
        remap = np.array([_format_id(formats, f) for f in part.formats] or [0], dtype=np.uint8)
        for name, column in part.columns.items():
            if name == "shard":
                column = (column + len(shards)).astype(column.dtype)
            elif name == "format":
                column = remap[column]
            columns.setdefault(name, []).append(column)
        shards.extend(part.shards)
        keys.extend(part.keys)
    if problems and plan.options.on_error == "raise":
        for number in failed:  # uncommitted again: a re-run after the inputs are mended packs them anew
            remove_part(output, number)
        raise InputError(problems)
    if not keys:
        raise InputError(problems or [InputProblem(out, "", "no sample was packed")])
    if len(set(keys)) != len(keys):
        seen: set[str] = set()
        duplicate = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise FormatError(
            f"{shown_path(out)}: key {duplicate!r} is in two partitions; the plan's keys must be unique"
        )
    merged = Index(
        root=out,
        shards=shards,
        formats=formats,
        columns={name: np.concatenate(parts) for name, parts in columns.items()},
        _keys=Keys.of(keys),
        storage_options=plan.storage_options,
    )
    merged.validate(out)
    if plan.options.on_error == "skip":
        lines = [
            json.dumps(
                {"source": p.source, "key": p.key, "reason": p.reason}, sort_keys=True, ensure_ascii=False
            )
            + "\n"
            for p in problems
        ]
        output.write(REJECTED_FILE, "".join(lines).encode("utf-8"))
    if output.remote:
        with tempfile.TemporaryDirectory(prefix="shardio-index-") as local:
            merged.save(local)
            output.publish(os.path.join(local, INDEX_COLUMNS), INDEX_COLUMNS)
            output.publish(os.path.join(local, INDEX_JSON), INDEX_JSON)
    else:
        merged.save(out)
    remove_parts(output, len(plan.partitions))
    return merged, problems, input_bytes


def _check_part(plan: PartitionPlan, number: int, report: PartReport, keys: list[str]) -> None:
    """Refuse a committed part that another plan packed: its report names another plan, or its samples are not
    this plan's partition ``number`` (less its rejected inputs), which merged would lose or repeat samples."""
    where = shown_path(plan.output.path(part_dir(number)))
    shards = shown_path(plan.output.path(f"{plan.options.prefix}-{number:05d}-*"))
    redo = f"remove {where} and its shards {shards}, and pack again (only that partition is packed anew)"
    recorded = report.plan
    if recorded and plan.fingerprint and recorded != plan.fingerprint:
        raise FormatError(
            f"{where}: partition {number} was packed by another plan ({shown(recorded)}, this plan is "
            f"{plan.fingerprint}): an earlier run's task committed it; {redo}"
        )
    if report.problems and plan.options.on_error == "raise":
        return  # not merged: removed with the error that lists its problems
    rejected = {problem.key for problem in report.problems}
    expected = [task.key for task in plan.partitions[number] if task.key not in rejected]
    if keys != expected:
        have, want = set(keys), set(expected)
        missing = next((key for key in expected if key not in have), None)
        extra = next((key for key in keys if key not in want), None)
        detail = (
            f"it lacks {missing!r}"
            if missing is not None
            else f"it holds {extra!r}, which is not in this partition"
            if extra is not None
            else "its order differs"
        )
        raise FormatError(
            f"{where}: partition {number} holds {len(keys)} samples, the plan gives it "
            f"{len(expected)} ({detail}): another run's task committed it; {redo}"
        )


def _format_id(formats: list[str], ext: str) -> int:
    if ext not in formats:
        formats.append(ext)
    return formats.index(ext)
