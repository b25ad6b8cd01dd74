"""``python -m shardio.cli``: the ``shardio`` command, for environments without its script."""

import sys

from .main import main

sys.exit(main())
