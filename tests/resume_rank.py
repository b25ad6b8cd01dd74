"""A rank of a ``torchrun`` group for the resume matrix:
``python -m torch.distributed.run ... resume_rank.py CONFIG``."""

from __future__ import annotations

import json
import os
import sys

from resume_harness import rank_entry

if __name__ == "__main__":
    config = json.loads(open(sys.argv[1]).read())
    rank_entry(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["MASTER_PORT"]), config)
