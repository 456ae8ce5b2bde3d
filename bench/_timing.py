"""Timing helpers shared by the benchmarks: interleaved rounds, medians, machine facts."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Timing:
    median: float
    spread: float  # (p75 - p25) / median
    runs: int


def interleaved(
    contenders: dict[str, Callable[[], object]], budget_s: float = 3.0, max_rounds: int = 50
) -> dict[str, Timing]:
    """Time every contender once per round, rounds interleaved so that noise on a
    shared machine hits all of them alike; medians over the rounds."""
    for fn in contenders.values():  # warm-up: JIT, caches, thread pools
        fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    start = time.perf_counter()
    rounds = 0
    while rounds < max_rounds and (rounds < 5 or time.perf_counter() - start < budget_s):
        for name, fn in contenders.items():
            t = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t)
        rounds += 1
    out = {}
    for name, xs in samples.items():
        q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
        med = statistics.median(xs)
        out[name] = Timing(med, (q[2] - q[0]) / med if med else 0.0, len(xs))
    return out


def machine() -> dict[str, str]:
    import numba
    import numpy
    import scipy

    facts = {
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "numba": numba.__version__,
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    facts["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        facts["torch"] = f"{torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        facts["torch"] = "not installed"
    return facts
