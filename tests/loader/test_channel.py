"""A ShardLoader worker's pipe end (shardio.loader.channel): its waits, and messages a
plain Connection reads."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch

from shardio.loader.channel import Channel


def test_ready_waits_for_a_message_and_receive_returns_it() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    channel = Channel(ours)
    began = time.monotonic()
    assert not channel.ready(0.05)
    assert time.monotonic() - began >= 0.04  # it waited
    assert not channel.ready()
    theirs.send(("start", 2))
    assert channel.ready(5.0)
    assert channel.receive() == ("start", 2)
    assert not channel.ready()


def test_a_plain_connection_reads_what_a_channel_sends_tensors_in_shared_memory() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    channel = Channel(ours)
    tensor = torch.arange(10, dtype=torch.float32)
    channel.send(("batch", {"keys": ["a", "b"], "audio": tensor}))
    kind, batch = theirs.recv()
    assert kind == "batch" and batch["keys"] == ["a", "b"] and torch.equal(batch["audio"], tensor)
    assert batch["audio"].is_shared()  # torch's reducer sent it (its storage moved to shared memory)


def test_the_other_end_closing_makes_it_ready_and_receive_raise() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    channel = Channel(ours)
    theirs.close()
    assert channel.ready(5.0)
    with pytest.raises(EOFError):
        channel.receive()
