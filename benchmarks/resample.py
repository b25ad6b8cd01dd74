"""Resampling: soxr (what ``shardio.reading.decode.resample`` uses) against the hand-written polyphase sinc it
replaced.

Run ``python benchmarks/resample.py [--seconds 10] [--runs 5]``. For each rate pair (to and from 16 kHz,
including the classic Mac rates 11127 and 22254 Hz and 44056 Hz, whose ratios to 16 kHz reduce to large
numbers), on ``--seconds`` of mono audio:

- time: the first call (the old code builds and caches a filter per ratio; soxr plans per call) and the
  median of ``--runs`` further calls (``time.perf_counter``);
- accuracy: the input is a sum of 8 sines below 0.8 of the lower Nyquist frequency, whose exact values at
  the output times are known; the error is the RMS difference from them over the middle 90% (away from the
  edges), in dB relative to the signal's RMS;
- alias rejection: a tone at 1.3x the new Nyquist frequency (downsampling only); its output RMS in dB
  relative to its input RMS.

The old implementation is kept here (it left ``shardio/reading/decode.py``) for this comparison only. Writes
``benchmarks/results/resample.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from shardio.bench.report import write_results
from shardio.reading.decode import resample as soxr_resample

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
PAIRS = [
    (44100, 16000),
    (48000, 16000),
    (22050, 16000),
    (8000, 16000),
    (16000, 44100),
    (11127, 16000),
    (22254, 16000),
    (44056, 16000),
]
_CHUNK_ELEMENTS = 1 << 20


def polyphase_resample(
    audio: np.ndarray,
    orig_rate: int,
    new_rate: int,
    *,
    lowpass_width: int = 16,
    rolloff: float = 0.945,
    beta: float = 8.6,
) -> np.ndarray:
    """shardio's former resampler: a polyphase Kaiser-windowed sinc over the reduced ratio (torchaudio's
    ``sinc_interp_kaiser`` design), ``ceil(frames * new / orig)`` outputs."""
    divisor = math.gcd(orig_rate, new_rate)
    orig, new = orig_rate // divisor, new_rate // divisor
    kernel, width = _sinc_kernel(orig, new, lowpass_width, rolloff, beta)
    taps = kernel.shape[0]
    channels, frames = audio.shape
    blocks = frames // orig + 1
    padded = np.zeros((channels, (blocks - 1) * orig + taps), np.float32)
    padded[:, width : width + frames] = audio
    windows = sliding_window_view(padded, taps, axis=1)[:, ::orig]
    out = np.empty((channels, blocks, new), np.float32)
    step = max(1, _CHUNK_ELEMENTS // (taps * channels))
    for start in range(0, blocks, step):
        part = slice(start, start + step)
        np.matmul(np.ascontiguousarray(windows[:, part]), kernel, out=out[:, part])
    target = -(-frames * new // orig)
    return np.ascontiguousarray(out.reshape(channels, blocks * new)[:, :target])


@lru_cache(maxsize=32)
def _sinc_kernel(
    orig: int, new: int, lowpass_width: int, rolloff: float, beta: float
) -> tuple[np.ndarray, int]:
    base = min(orig, new) * rolloff
    width = math.ceil(lowpass_width * orig / base)
    if new * (2 * width + orig) > _CHUNK_ELEMENTS * 16:
        raise ValueError(f"resampling {orig}:{new} needs a filter of {new} x {2 * width + orig} taps")
    offsets = np.arange(-width, width + orig, dtype=np.float64) / orig
    t = (offsets[None, :] - np.arange(new, dtype=np.float64)[:, None] / new) * base
    t = np.clip(t, -lowpass_width, lowpass_width)
    window = np.i0(beta * np.sqrt(np.maximum(0.0, 1.0 - (t / lowpass_width) ** 2))) / np.i0(beta)
    kernel = np.ascontiguousarray((np.sinc(t) * window * (base / orig)).T, dtype=np.float32)
    return kernel, width


def _tones(rate: int, frames: int, freqs: np.ndarray, phases: np.ndarray) -> np.ndarray:
    t = np.arange(frames, dtype=np.float64) / rate
    return (0.1 * np.sin(2 * np.pi * freqs[:, None] * t[None, :] + phases[:, None]).sum(axis=0))[None]


def accuracy_db(function: Callable[..., np.ndarray], orig: int, new: int, seconds: float) -> float:
    """RMS error against the exact band-limited signal, dB relative to the signal (lower is better)."""
    rng = np.random.default_rng([orig, new])
    freqs = rng.uniform(50, 0.8 * min(orig, new) / 2, 8)
    phases = rng.uniform(0, 2 * np.pi, 8)
    frames = int(orig * seconds)
    out = function(_tones(orig, frames, freqs, phases).astype(np.float32), orig, new)
    exact = _tones(new, out.shape[1], freqs, phases)
    middle = slice(out.shape[1] // 20, -out.shape[1] // 20)
    error = np.sqrt(np.mean((out[:, middle] - exact[:, middle]) ** 2))
    return round(float(20 * np.log10(error / np.sqrt(np.mean(exact[:, middle] ** 2)))), 1)


def alias_db(function: Callable[..., np.ndarray], orig: int, new: int, seconds: float) -> float | None:
    """Output RMS of a tone at 1.3x the new Nyquist frequency, dB re the input (downsampling only)."""
    frequency = 1.3 * new / 2
    if new >= orig or frequency >= orig / 2:
        return None
    tone = _tones(orig, int(orig * seconds), np.array([frequency]), np.zeros(1)).astype(np.float32)
    out = function(tone, orig, new)[:, new // 20 : -new // 20]
    return round(float(20 * np.log10(np.sqrt(np.mean(out**2)) / np.sqrt(np.mean(tone**2)) + 1e-12)), 1)


def timing(
    function: Callable[..., np.ndarray], orig: int, new: int, seconds: float, runs: int
) -> dict[str, Any]:
    audio = np.random.default_rng(0).uniform(-0.5, 0.5, (1, int(orig * seconds))).astype(np.float32)
    _sinc_kernel.cache_clear()
    started = time.perf_counter()
    function(audio, orig, new)
    first = time.perf_counter() - started
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        function(audio, orig, new)
        times.append(time.perf_counter() - started)
    return {
        "first_s": round(first, 4),
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
    }


def measure(
    function: Callable[..., np.ndarray], orig: int, new: int, args: argparse.Namespace
) -> dict[str, Any]:
    try:
        return {
            **timing(function, orig, new, args.seconds, args.runs),
            "error_db": accuracy_db(function, orig, new, min(args.seconds, 2.0)),
            "alias_db": alias_db(function, orig, new, min(args.seconds, 2.0)),
        }
    except (ValueError, MemoryError) as exc:
        return {"failed": f"{type(exc).__name__}: {exc}"}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Resampling: soxr vs the former polyphase sinc",
        "",
        f"`{report['command']}` on {report['machine']['cpu']} ({report['machine']['cores']} cores, load "
        f"average {report['machine']['load_average'][0]:.1f}: a shared, loaded machine; timings are "
        f"noisy). {report['seconds']} s of mono float32 audio per call; time: first call (filter build "
        "included) and "
        f"median of {report['runs']} more; error: RMS vs the exact band-limited signal (dB re signal); "
        "alias: a tone at 1.3x the new Nyquist (dB re input).",
        "",
        "| rates | old first s | old median s | soxr first s | soxr median s | speed-up (median) | "
        "old error dB | soxr error dB | old alias dB | soxr alias dB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        old, new = row["old"], row["soxr"]
        if "failed" in old:
            lines.append(
                f"| {row['rates']} | fails | fails | {new['first_s']} | {new['median_s']} | - | - | "
                f"{new['error_db']} | - | {new['alias_db']} |"
            )
            continue
        lines.append(
            f"| {row['rates']} | {old['first_s']} | {old['median_s']} | {new['first_s']} | "
            f"{new['median_s']} | {old['median_s'] / max(new['median_s'], 1e-9):.1f}x | "
            f"{old['error_db']} | "
            f"{new['error_db']} | {old['alias_db']} | {new['alias_db']} |"
        )
    failed = [row for row in report["results"] if "failed" in row["old"]]
    lines += [""] + [f"- old code, {row['rates']}: {row['old']['failed']}" for row in failed]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of audio per call (default 10)")
    parser.add_argument("--runs", type=int, default=5, help="timed calls after the first (default 5)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write resample.json/.md")
    args = parser.parse_args()
    results = []
    for orig, new in PAIRS:
        results.append(
            {
                "rates": f"{orig} -> {new}",
                "old": measure(polyphase_resample, orig, new, args),
                "soxr": measure(soxr_resample, orig, new, args),
            }
        )
        print(results[-1])
    import soxr

    report = {
        "command": f"python benchmarks/resample.py --seconds {args.seconds} --runs {args.runs}",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_average": list(os.getloadavg()),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "soxr": soxr.__version__,
        },
        "seconds": args.seconds,
        "runs": args.runs,
        "results": results,
    }
    write_results(args.out, "resample", report, markdown(report))
    print(f"wrote {args.out / 'resample.json'} and {args.out / 'resample.md'}")


if __name__ == "__main__":
    main()
