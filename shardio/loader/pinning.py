"""Pinner: a loader's batches copied into page-locked memory by a thread of their own.

Copying a batch into pinned memory in the training loop's thread costs that thread milliseconds per batch, and
with torch's intra-op threads many times that in CPU (``benchmarks/results/gpu_feed.md``: 160 against 27 ms
of CPU per step on an H100 host). As torch's DataLoader does, one background thread with one intra-op thread
takes the batches from their source, pins them and queues up to ``depth`` of them; the training loop only
takes them off the queue.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import Any

import torch
from torch.utils.data._utils.pin_memory import pin_memory

__all__ = ["Pinner", "pinned"]

_BATCH, _END, _ERROR = "batch", "end", "error"
_WATCH_S = 1.0
"""How often a waiting side looks whether the other has stopped."""


def pinned(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with its tensors copied into pinned memory."""
    return pin_memory(batch)


class Pinner:
    """Iterates ``source`` in a thread, yielding its batches pinned, in order; the source's exceptions are
    raised here. :meth:`stop` ends the thread and closes ``source`` in it (so its clean-up runs there, never
    beside the training loop's own use of what the source touches)."""

    def __init__(self, source: Generator[dict[str, Any], None, None], depth: int, device: int | None) -> None:
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(source, device), name="shardio-pin-memory", daemon=True
        )
        self._thread.start()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            try:
                kind, payload = self._queue.get(timeout=_WATCH_S)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError(
                        "shardio's pin-memory thread ended without handing over its batches"
                    ) from None
                continue
            if kind == _END:
                return
            if kind == _ERROR:
                raise payload
            yield payload

    def stop(self) -> None:
        """End the thread (at once if it waits to hand a batch over); batches not yet taken are dropped."""
        self._stopping.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        while not self._queue.empty():
            self._queue.get_nowait()

    def _run(self, source: Generator[dict[str, Any], None, None], device: int | None) -> None:
        torch.set_num_threads(1)  # this thread's own setting: a copy must not wake every intra-op thread
        if device is not None:
            torch.cuda.set_device(device)  # pin for the training process's device, not a new context on GPU 0
        try:
            for batch in source:
                copy = pinned(batch)
                del batch  # its shared-memory block goes back to the worker now
                if not self._hand((_BATCH, copy)):
                    return
            self._hand((_END, None))
        except Exception as exc:
            self._hand((_ERROR, exc))
        finally:
            source.close()

    def _hand(self, item: tuple[str, Any]) -> bool:
        """Queue ``item`` once there is room; False when told to stop first."""
        while not self._stopping.is_set():
            try:
                self._queue.put(item, timeout=_WATCH_S)
                return True
            except queue.Full:
                continue
        return False
