"""Read throughput: shardio against WebDataset + soundfile and against the decoder floors, on the same shards.

Run ``python benchmarks/bench.py [DATASET_DIR] [--quick] [--reps N]`` (the same as ``shardio bench``). Without
a dataset it generates 1-5 s 16 kHz PCM16 WAV utterances and takes the LJ Speech FLACs of the shared corpora
(``../shared/corpora``, when present; else generated FLAC), packs them under ``bench-out/`` and measures:
shardio and WebDataset + soundfile through a DataLoader with 0/1/2 workers, shardio on ``.tar.zst`` and in
unbatched mode, the soundfile, numpy and zstd decompression floors, shard codecs (none, zstd 1/3/19, gzip,
bz2), resume latency, per-rank balance and a training-loop stall. Writes ``benchmarks/results/bench.json``,
``bench.md`` and ``bench.png``; see ``shardio.bench``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

from shardio.bench import run_bench

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", nargs="?", help="a shardio dataset directory (default: generate corpora)")
    parser.add_argument("--out-dir", default=str(REPO / "bench-out"), help="where corpora and datasets go")
    parser.add_argument("--results", default=str(RESULTS), help="where bench.json/.md/.png are copied")
    parser.add_argument("--quick", action="store_true", help="tiny corpora, 2 rounds: a smoke test")
    parser.add_argument("--reps", type=int, default=None, help="timed rounds (default 5, quick 2)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    command = "python benchmarks/bench.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    result = run_bench(args.dataset, out_dir=args.out_dir, quick=args.quick, reps=args.reps, command=command)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    for name in result["files"].values():
        shutil.copyfile(Path(args.out_dir) / name, results / name)
    print((results / "bench.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
