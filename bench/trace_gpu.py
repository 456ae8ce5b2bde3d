"""What a GPU call is made of: every CUDA API call, kernel, copy and wait of one call, lu_core against torch.

    python -m bench.trace_gpu --out DIR

``bench/profile_gpu.py`` says how long a call takes on the host and on the device, and where its
Python time goes; this suite says what the call does to the GPU and when. On the H100 (2026-11-27,
``bench/results/2026-11-27-gpu-proof-h100-run5``) a 1x128 float64 ``lu_solve`` took 0.246 ms
against torch's 0.069 ms although both call cuSOLVER's ``getrs`` there (torch's heuristic: one
problem, n <= 128, one right-hand side), and a 1x512 one spent 474 us on the host against
torch's 145: the cProfile could not say which library call, copy or wait holds the time.

CUPTI's record of the process (through ``torch.profiler``, which records every CUDA activity of
the process: CuPy's launches and the libraries' kernels too) of ``TRACED`` calls per contender
after ``WARM`` untraced ones, each call alone (the stream synchronised after it, outside the
call's window). Per case, first the same calls' times without the profiler (``bench.profile_gpu``'s
measure); then the median host span of a call, the device's busy time (kernels,
copies, memsets of the call), when its last device work ended (from the call's start), the API
calls by name (count and host time), then the median call's timeline: host API calls and device
work in start order, offsets from the call's start. A gap on the host between API calls is Python
(ours) or C++ (torch) work; device work that starts long after its launch waited for the host or
for earlier work. CUPTI adds its own cost to every API call: compare the two contenders, not these
times with the grid's.
Writes ``DIR/trace-gpu-<device>.md``. Without a device (or without torch) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from bench._report import device_slug
from bench.core_gpu import available, device_name, seconds_budget
from bench.profile_gpu import CALLS

#: (op, batch, n, dtype): the grid's cells where we lose most to torch on one call, and a small one.
CASES = (
    ("lu_solve", 1, 128, "float64"),
    ("lu_solve", 1, 512, "float64"),
    ("lu_solve", 100, 128, "float64"),
    ("solve", 1, 128, "float64"),
    ("lu_unpack", 1, 128, "float64"),
    ("lu_factor", 1, 128, "float64"),
    ("lu_solve", 1, 8, "float64"),
    ("solve", 1, 8, "float64"),
)
WARM = 10
TRACED = 7
#: Rows of a call's timeline shown (its first ones).
TIMELINE_ROWS = 60
#: Chrome-trace categories: host API calls and device work.
HOST_CATS = ("cuda_runtime", "cuda_driver")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def calls(op: str, batch: int, n: int, dtype: str, torch) -> dict[str, Callable[[], object]]:
    """The case's call for each contender (``bench.profile_gpu``'s inputs: well-conditioned, one rhs); for
    the operations with a short path, ours also with the short paths off (``general``: what they save)."""
    from bench.profile_gpu import _calls, _general_path

    ours, peer = _calls(op, batch, n, dtype, torch)
    out = {"lu_core": ours, "torch": peer}
    if op != "lu_factor":

        def general() -> object:
            with _general_path():
                return ours()

        out["general"] = general
    return out


def windows(events: list[dict], prefix: str) -> list[dict]:
    """The host spans of the calls named ``prefix``-i (``record_function`` annotations), in call order."""
    found = [
        e for e in events
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(prefix + "#")
    ]  # fmt: skip
    return sorted(found, key=lambda e: int(str(e["name"]).rsplit("#", 1)[1]))


def _corr(e: dict) -> object:
    return (e.get("args") or {}).get("correlation")


def call_events(events: list[dict], window: dict) -> tuple[list[dict], list[dict]]:
    """The host API calls inside ``window`` and the device work they launched (matched by CUPTI's
    correlation id), each sorted by start."""
    start, end = float(window["ts"]), float(window["ts"]) + float(window["dur"])
    host = [
        e for e in events
        if e.get("ph") == "X" and e.get("cat") in HOST_CATS and start <= float(e["ts"]) <= end
    ]  # fmt: skip
    ids = {_corr(e) for e in host if _corr(e) is not None}
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS and _corr(e) in ids]
    key = lambda e: float(e["ts"])  # noqa: E731
    return sorted(host, key=key), sorted(device, key=key)


def summarize(events: list[dict], window: dict) -> dict:
    """One call: host span, device busy time, when its device work ended, API calls by name, timeline."""
    host, device = call_events(events, window)
    t0 = float(window["ts"])
    by_name: dict[str, list[float]] = {}
    for e in host:
        by_name.setdefault(str(e["name"]), []).append(float(e.get("dur", 0.0)))
    rows = [("host", float(e["ts"]) - t0, float(e.get("dur", 0.0)), str(e["name"])) for e in host]
    rows += [("device", float(e["ts"]) - t0, float(e.get("dur", 0.0)), str(e["name"])) for e in device]
    rows.sort(key=lambda r: (r[1], r[0] == "device"))
    return {
        "host us": float(window["dur"]),
        "device busy us": sum(float(e.get("dur", 0.0)) for e in device),
        "device end us": max((float(e["ts"]) + float(e.get("dur", 0.0)) - t0 for e in device), default=0.0),
        "api": {name: (len(d), sum(d)) for name, d in by_name.items()},
        "timeline": rows,
    }


def untraced(fns: dict[str, Callable[[], object]]) -> dict[str, tuple[float, float]]:
    """Each contender's median host and device microseconds per call without the profiler
    (``bench.profile_gpu``'s measure: ``cupyx.profiler.benchmark``, CUDA events around each call)."""
    from bench.profile_gpu import _host_device_us

    return {who: _host_device_us(fn) for who, fn in fns.items() if fn is not None}


def trace(fns: dict[str, Callable[[], object]], torch) -> dict[str, list[dict]]:
    """``TRACED`` calls of each contender under the profiler, each synchronised after its window."""
    import cupy
    from torch.profiler import ProfilerActivity, profile, record_function

    def sync() -> None:
        cupy.cuda.get_current_stream().synchronize()
        torch.cuda.synchronize()

    live = {who: fn for who, fn in fns.items() if fn is not None}
    for fn in live.values():
        for _ in range(WARM):
            fn()
        sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(TRACED):
            for who, fn in live.items():
                with record_function(f"{who}#{i}"):
                    fn()
                sync()
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return {who: [summarize(events, w) for w in windows(events, who)] for who in live}


def _median_call(summaries: list[dict]) -> dict:
    ordered = sorted(summaries, key=lambda s: s["host us"])
    return ordered[len(ordered) // 2]


def case_report(
    title: str, traced: dict[str, list[dict]], plain: dict[str, tuple[float, float]] | None = None
) -> list[str]:
    lines = [f"## {title}", ""]
    if plain:
        lines += [f"Without the profiler (medians of {CALLS} calls): " + "; ".join(
            f"{who} host {host:.1f} us, device {device:.1f} us" for who, (host, device) in plain.items()
        ), ""]  # fmt: skip
    lines += [
        "| contender | calls | host us | device busy us | device end us | API calls (count, host us), by host time |"
    ]
    lines += ["|---|---:|---:|---:|---:|---|"]
    for who, summaries in traced.items():
        if not summaries:
            lines.append(f"| {who} | 0 | – | – | – | no call found in the trace |")
            continue
        med = lambda k: statistics.median(s[k] for s in summaries)  # noqa: E731,B023
        api = sorted(_median_call(summaries)["api"].items(), key=lambda kv: -kv[1][1])
        text = "; ".join(f"{name} {count}, {total:.1f}" for name, (count, total) in api)
        lines.append(
            f"| {who} | {len(summaries)} | {med('host us'):.1f} | {med('device busy us'):.1f} "
            f"| {med('device end us'):.1f} | {text} |"
        )
    for who, summaries in traced.items():
        if not summaries:
            continue
        call = _median_call(summaries)
        lines += ["", f"{who}, the median call (by host span): side, start us, duration us, name", "", "```"]
        for side, start, dur, name in call["timeline"][:TIMELINE_ROWS]:
            lines.append(f"{side:6} {start:9.1f} {dur:8.1f}  {name[:110]}")
        if len(call["timeline"]) > TIMELINE_ROWS:
            lines.append(f"... {len(call['timeline']) - TIMELINE_ROWS} more")
        lines.append("```")
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.trace_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the report")
    ap.add_argument("--seconds", type=seconds_budget, default=None, help="start no case after this many seconds")
    args = ap.parse_args(argv)
    problem = available()
    if problem is not None:
        print(f"no CUDA device: {problem}; nothing to trace", file=sys.stderr)
        return 0
    try:
        import torch
    except ImportError:
        print("torch is not installed: its profiler records the trace; nothing to trace", file=sys.stderr)
        return 0
    device = device_name()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"trace-gpu-{device_slug(device)}.md"
    what = f"{TRACED} traced calls per contender after {WARM} untraced ones; torch {torch.__version__}."
    head = [
        f"# What a GPU call is made of, {device}",
        "",
        f"Command: `python -m bench.trace_gpu --out DIR`. {what}",
        "",
    ]
    body: list[str] = []
    start = time.perf_counter()
    for op, batch, n, dtype in CASES:
        if args.seconds is not None and time.perf_counter() - start > args.seconds:
            body.append(f"Time budget spent: {op} {batch}x{n} {dtype} and after left out.")
            break
        title = f"{op} {batch}x{n} {dtype}"
        try:
            fns = calls(op, batch, n, dtype, torch)
            plain = untraced(fns)  # first: nothing of the profiler attached yet
            body += case_report(title, trace(fns, torch), plain)
        except Exception as exc:  # one case's failure is reported, the others still run
            body += [f"## {title}", "", f"failed: {type(exc).__name__}: {exc}", ""]
        print(f"[trace-gpu] {title}", file=sys.stderr, flush=True)
        path.write_text("\n".join(head + body))
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
