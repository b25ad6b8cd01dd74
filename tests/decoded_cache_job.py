"""A rank of a job reading through a decoded cache, as its own process (see
tests/reading/test_decoded_cache_processes.py).

``python tests/decoded_cache_job.py CONFIG_JSON``: reads ``epochs`` epochs of the dataset at ``data`` as rank
``rank`` of ``world`` (``workers`` DataLoader workers), through the decoded cache at ``cache`` (none: null),
and writes each batch's keys and the SHA-256 of its audio tensor's bytes to ``out`` as JSON. With
``fsize_limit``, the process may write no file larger than that many bytes (``RLIMIT_FSIZE``: a full disk).
"""

from __future__ import annotations

import hashlib
import json
import resource
import sys
from typing import Any


def digests(config: dict[str, Any]) -> list[list[Any]]:
    from torch.utils.data import DataLoader

    from shardio import Decoding, Reading, ShardDataset, World

    reading = Reading() if config["cache"] is None else Reading(decoded_cache=config["cache"])
    dataset = ShardDataset(
        config["data"],
        batch_size=4,
        seed=11,
        world=World(config["rank"], config["world"]),
        decoding=Decoding(**config.get("decoding", {})),
        reading=reading,
    )
    workers = config["workers"]
    loader = DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=bool(workers))
    found = []
    for epoch in range(config["epochs"]):
        dataset.set_epoch(epoch)
        for batch in loader:
            digest = hashlib.sha256(batch["audio"].numpy().tobytes()).hexdigest()
            found.append([epoch, list(batch["keys"]), digest, batch["lengths"].tolist()])
    return found


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("fsize_limit"):
        limit = int(config["fsize_limit"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    found = digests(config)
    with open(config["out"], "w") as out:
        json.dump(found, out)


if __name__ == "__main__":
    main()
