"""Timing helpers shared by the benchmarks: interleaved rounds, medians, machine facts."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass
class Timing:
    median: float
    spread: float  # (p75 - p25) / median
    runs: int
    cold: float = 0.0  # median of the first ``block`` calls of each block, right after its pause


def interleaved(
    contenders: dict[str, Callable[[], object]],
    budget_s: float = 4.0,
    max_rounds: int = 12,
    block: int = 3,
    pause: float = 0.01,
    slow_factor: float = float("inf"),
    settle: Mapping[str, float] | None = None,
    min_block_s: float = 0.0,
    max_block: int = 1000,
) -> dict[str, Timing]:
    """Time the contenders in alternating blocks of back-to-back calls (``block`` of them, more where
    ``min_block_s`` asks), the order rotated every round, so that noise on a shared machine hits all
    of them alike; medians over every call, and (``Timing.cold``) over the first ``block`` calls of
    each block.

    Blocks rather than single calls: each library then runs in its own steady
    state (allocator caches, thread pools), not in the state the previous
    library left behind. A pause before each block lets OpenMP/OpenBLAS worker
    threads, which spin for a while after a call, go idle. A contender whose warm
    call takes over ``slow_factor`` times the fastest one's (and over 10 ms) is
    not timed further: that call is its only sample.

    ``settle`` maps a contender to seconds the harness busy-waits after each of its
    blocks (its warm-up included), before the pause: for a library whose idle threads spin longer than the
    pause (OpenBLAS: ~0.1 s after each threaded call), so that they do not take the
    cores from whichever contender comes next. Busy, not asleep, so that the machine
    is left as warm as after any other contender (on a VM an idle core is slow to
    come back: an idle 0.2 s made the next call up to 2x slower, measured).

    ``min_block_s``: a block goes on past ``block`` calls until it has lasted that long (or made
    ``max_block`` calls), so that a call of microseconds is timed in its steady state, not in the few
    calls after the pause: on a 2-vCPU VM, after a 20 ms pause, one 8 x 8 factor took ~150-220 us on
    its first call, ~23 on its second, ~13 on its third and ~11 from the fifth on, for lu_core and
    PyTorch alike, so blocks of three put the median on the second or third call, where the VM's
    wake-up sets the time as much as the library. ``Timing.cold`` keeps that measure (the first
    ``block`` calls after each pause: a caller's first calls after idling).
    """
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    cold: dict[str, list[float]] = {name: [] for name in contenders}
    first: dict[str, float] = {}

    def wait_out(name: str) -> None:
        if settle and name in settle:
            until = time.perf_counter() + settle[name]
            while time.perf_counter() < until:
                pass

    for name, fn in contenders.items():  # warm-up: JIT, caches, thread pools; the second call is timed
        time.sleep(pause)
        fn()
        t = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - t
        wait_out(name)
    # A contender far slower than the fastest cannot change which is fastest, nor a ratio to
    # it much: its warm call is its one sample, which keeps slow peers from eating the budget.
    fastest = min(first.values())
    names = []
    for name in contenders:
        if first[name] > slow_factor * fastest and first[name] > 0.01:
            samples[name].append(first[name])
            cold[name].append(first[name])
        else:
            names.append(name)
    start = time.perf_counter()
    rounds = 0
    while rounds < max_rounds and (rounds < 3 or time.perf_counter() - start < budget_s):
        for name in names[rounds % len(names) :] + names[: rounds % len(names)]:
            fn, xs = contenders[name], samples[name]
            time.sleep(pause)
            began = time.perf_counter()
            calls = 0
            while calls < block or (calls < max_block and time.perf_counter() - began < min_block_s):
                t = time.perf_counter()
                fn()
                xs.append(time.perf_counter() - t)
                calls += 1
            cold[name] += xs[-calls:][:block]
            wait_out(name)
        rounds += 1
    out = {}
    for name, xs in samples.items():
        q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
        med = statistics.median(xs)
        out[name] = Timing(med, (q[2] - q[0]) / med if med else 0.0, len(xs), statistics.median(cold[name]))
    return out


def _cpu(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The first CPU's model name, family and model, and widest vector ISA: ``AMD EPYC (family 25, model 1;
    AVX2, no AVX-512)``. One name covers several generations on cloud VMs ("AMD EPYC"), and the kernels
    compile for the CPU they run on, so the vector width decides some crossovers (``_tuning``)."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor's block only
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return None
    if "model name" not in fields:
        return None
    flags = set(fields.get("flags", "").split())
    isa = "AVX-512" if "avx512f" in flags else "AVX2, no AVX-512" if "avx2" in flags else "no AVX2"
    return f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}; {isa})"


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
    cpu = _cpu()
    if cpu:
        facts["cpu"] = cpu
    try:
        import torch

        blas = "MKL" if torch.backends.mkl.is_available() else "not MKL"
        facts["torch"] = f"{torch.__version__} ({torch.get_num_threads()} threads, LAPACK from {blas})"
    except ImportError:
        facts["torch"] = "not installed"
    try:
        import jax

        facts["jax"] = f"{jax.__version__} (XLA CPU: {jax.device_count()} device, intra-op threads on every core)"
    except ImportError:
        facts["jax"] = "not installed"
    from lu_core._cpu import _lapack

    facts["lu_core's LAPACK (LU_CORE_LAPACK)"] = _lapack.lapack().name
    facts["BLAS libraries loaded"] = _blas()
    facts["lu_core threads"] = (
        f"Numba {numba.get_num_threads()} ({numba.config.THREADING_LAYER} layer), "
        f"LAPACK per-matrix pool {len(os.sched_getaffinity(0))}"
    )
    return facts


def _blas() -> str:
    """The BLAS libraries loaded so far, with the kernel set each picked (OpenBLAS on AVX-512 Intel
    and on AMD choose different kernels: a report says which ran)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - lu_core's CPU backend depends on it
        return "unknown (no threadpoolctl)"
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return (
        "; ".join(
            f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture') or 'architecture unknown'}, "
            f"{i.get('num_threads')} threads)"
            for i in libs
        )
        or "none loaded"
    )
