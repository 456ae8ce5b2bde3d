"""``python -m bench.gpu_proof --out DIR``: everything a GPU claim rests on, in one command.

    make gpu-proof OUT=dir PARTS="env kernels tests service oom"   # the checks (one device command)
    make gpu-proof OUT=dir PARTS="kernels calibrate core-bench batching service-bench"  # the measurements
    LU_DEVICE=cpu make gpu-proof OUT=dir         # the rehearsal CI runs: no device needed

A session lent a device has 15 minutes of device time, its start included, so the limits
below add up to at most 14.5 minutes, in two commands of at most 10: the checks first, then the
measurements. The benchmarks stop starting cases when their time is spent (cheapest cases first)
and report what they left out. Nothing measures beside a compile: on 2026-11-27 the core grid's
1x128 cases ran 1.4-3.2x slower (torch's 1.1-1.8x) than on a quiet host while ``kernels``
compiled beside them.

Parts, in order (each a subprocess or an isolated step with its own time limit, so a
hang or crash in one still leaves the others' results):

``env``           versions, the GPU's name and memory, nvidia-smi
``kernels``       the CPU kernels of a GPU service's host path (``LU_GPU_HOST_MAX_N``: the service's
                  warm-up up to that order on a CPU device), compiled into Numba's cache or loaded
                  from it, in a process of its own that runs *in the background*. In the checks'
                  command it runs beside the GPU tests (which compile their CPU oracles into a cache
                  of their own: two processes compiling one kernel into one cache can cross its
                  entries); every later part waits for it (services need its kernels, measurements a
                  quiet host). The measurements' command lists it again: 2 s from the cache when
                  both commands ran on one machine, the whole compile on a fresh one. Cold, this is
                  minutes of compiling, which used to fall on service-bench's first server under
                  that part's limit (2026-11-27: still compiling after 150 s)
``tests``         the GPU test suite: ``tests/lu_core/_gpu`` and every test marked ``gpu``
``service``       ``python -m service`` end to end: native JSON, binary, ``/v2`` through
                  ``tritonclient.http``, stored factorizations and batching where the routes
                  and settings exist, device memory in ``/metrics``, start time, the 256 MiB
                  transfers (the first of each watched: past 1 and 3 s, the server's stacks)
``oom``           device memory: a request over ``LU_GPU_MEMORY_BYTES`` is refused before
                  upload, an allocation failure during compute is a 503 and the next request works
``calibrate``     ``python -m bench.calibrate_gpu`` (fills ``lu_core/_gpu/_tuning.py``; its diff is kept)
``core-bench``    ``python -m bench.profile_gpu`` (where a small call's time goes; the first large
                  solve in two fresh processes), ``python -m bench.trace_gpu`` (each small call's
                  API calls, kernels, copies and waits against torch's), then
                  ``python -m bench.core_gpu`` (lu_core against torch CUDA and cupyx)
``batching``      ``python -m bench.batching --proof``: batching off and on at 64 and 256 clients
                  (issue 15's GPU goal: at least 3x the requests per second)
``service-bench`` ``python -m bench.service --only transport concurrency`` on the device (the 8x8
                  comparison adds the same service with ``LU_DEVICE=cpu``: the GPU one's goal is its rate)

It writes at most 8 files into DIR, named ``gpu-proof-<device>-<what>`` (``<device>`` is
``h100``, ``h200``, ... or ``cpu``), ready to be committed to ``bench/results/``, and
exits 1 if any part failed, after running all of them. With ``--device cpu`` (the default
when ``LU_DEVICE=cpu``) the parts that need a GPU say so and are skipped; the rest run.
Wheels carried beside the checkout (``--wheels .whl``, made by ``make gpu-wheels``) are
installed into a private folder first (the device machine has no internet).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("env", "kernels", "tests", "service", "oom", "calibrate", "core-bench", "batching", "service-bench")
# The two device commands, in order: each under the 10-minute limit of one command. ``kernels`` is in
# both: beside the tests in the first, from the cache (or compiling, on a fresh machine) in the second.
COMMANDS = (
    ("env", "kernels", "tests", "service", "oom"),
    ("kernels", "calibrate", "core-bench", "batching", "service-bench"),
)
# Parts that run in the background, beside the parts after them, and the parts that wait for them first:
# every later part but ``tests``, which waits itself once its GPU tests ran (the tests marked gpu
# elsewhere start services). Services need the kernels; measurements a host that compiles nothing.
BACKGROUND = ("kernels",)
WAITS = ("service", "oom", "calibrate", "core-bench", "batching", "service-bench")
# Seconds per part on a device: 12 minutes in all without ``kernels``, so that a session's 15 minutes
# of device time (the machine's start included) hold the whole proof when both commands run on one
# machine (``kernels`` then loads from its cache in the second). On a fresh machine for the second
# command (the first went back while idle), its compile (up to 150 s) and a second start come on top:
# 14.5 minutes of limits and two starts, which the budget may not hold. Seconds used on the H100 on
# 2026-11-27 (fourth run, ``kernels`` beside the measurements) in the comments.
LIMITS = {
    "env": 20,  # 1
    "kernels": 150,  # 134 cold (52 builds compiled, 23 loaded); 109 on a 2-vCPU Intel Xeon; 2 from the cache
    "tests": 290,  # 249 (pytest: 207 + 32), 2026-11-27, before ~40 more GPU tests: TESTS_ELSEWHERE_S of it elsewhere
    "service": 35,  # 19
    "oom": 30,  # 10
    "calibrate": 60,  # 38 (it stops when its budget is spent)
    "core-bench": 135,  # 85, before bench/trace_gpu.py (27 s on the H100, 2026-11-27) joined it
    "batching": 40,  # 35
    "service-bench": 110,  # 98
}
# Seconds a budgeted benchmark keeps for writing its report before its part's limit.
REPORT_S = 25
# Of the core-bench part: seconds for bench/profile_gpu.py's cases before the grid, and for its two
# fresh processes timing the first large solve (FIRST_CALL_TIMEOUT_S each).
PROFILE_S = 20
#: Of the core-bench part: seconds for bench/trace_gpu.py's cases (what each small call does on the device).
TRACE_S = 25
FIRST_CALL_S = 60
# Of the tests part: seconds for the few tests marked gpu outside tests/lu_core/_gpu (the service's: 23 s).
TESTS_ELSEWHERE_S = 40
MAX_FILES = 8


@dataclasses.dataclass
class Outcome:
    status: str  # ok, failed, skipped, missing; started (a background part, until it ends)
    note: str = ""
    seconds: float = 0.0


class Proof:
    """Runs the parts and owns the output folder (never more than MAX_FILES files)."""

    def __init__(self, out: Path, device: str, quick: bool, log: Callable[[str], None]) -> None:
        self.out = out
        self.device = device  # "gpu" or "cpu": what the service and the checks are asked to use
        self.quick = quick
        self.log = log
        self.slug = "cpu" if device == "cpu" else gpu_slug()
        self.env = dict(os.environ)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env["LU_DEVICE"] = device
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), self.env.get("PYTHONPATH", "")) if p)
        self.files: dict[str, Path] = {}
        self.facts: dict[str, str] = {  # whatever the parts: each command's summary says when and where
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "asked device": device,
        }
        self.checks: list[str] = []
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu-proof-"))
        # A background part's process, its output file, deadline and reader of the outcome; and the
        # outcomes of those that ended (the summary takes them in).
        self.running: dict[str, tuple[subprocess.Popen, Path, float, str, Callable[[int, str], Outcome]]] = {}
        self.finished: dict[str, Outcome] = {}

    # ------------------------------------------------------------------ output files

    def limit(self, part: str) -> float:
        """Seconds for ``part``: the device's budget, four times that for the rehearsal on a busy CI machine."""
        return LIMITS[part] * (4 if self.device == "cpu" else 1)

    def path(self, what: str) -> Path:
        """The one file of ``what`` (``tests.log``, ``core.md``, ...), counted against MAX_FILES."""
        if what not in self.files:
            if len(self.files) >= MAX_FILES:
                raise RuntimeError(f"more than {MAX_FILES} output files: {sorted(self.files)}")
            self.files[what] = self.out / f"gpu-proof-{self.slug}-{what}"
        return self.files[what]

    def append(self, what: str, text: str) -> None:
        with self.path(what).open("a") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    # ------------------------------------------------------------------ subprocesses

    def sh(self, what: str, argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
        """Run ``argv`` in the checkout, its output appended to file ``what``; (rc, output). rc 124: timed out."""
        self.log(f"$ {' '.join(argv)}")
        self.append(what, f"\n$ {' '.join(argv)}\n")
        # Its own process group: on a timeout the servers a benchmark started go with it (they would
        # hold the device, its memory and their ports for the parts after).
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env or self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            text, _ = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            text, _ = proc.communicate()
            rc, text = 124, (text or "") + f"\n[timed out after {timeout:.0f} s]\n"
        self.append(what, text + f"[exit {rc}]\n")
        return rc, text

    def start(self, part: str, what: str, argv: list[str], read: Callable[[int, str], Outcome]) -> None:
        """Start ``argv`` for a background part: its output goes to file ``what`` when it ends (:meth:`wait`)."""
        self.log(f"$ {' '.join(argv)} (in the background)")
        output = self.scratch / f"{part}.out"
        with output.open("w") as f:
            proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)  # fmt: skip
        self.running[part] = (proc, output, time.monotonic() + self.limit(part), what, read)
        self.append(what, f"\n$ {' '.join(argv)} (in the background)\n")

    def wait(self) -> None:
        """Wait for every background part, each until its limit from its start; one still running then
        is killed (with its process group), at this wait, and failed."""
        for part, (proc, output, deadline, what, read) in list(self.running.items()):
            started = deadline - self.limit(part)
            try:
                rc = proc.wait(max(0.0, deadline - time.monotonic()))
                cut = ""
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
                rc, cut = (
                    124,
                    f"\n[past its {self.limit(part):.0f} s: killed after {time.monotonic() - started:.0f} s]\n",
                )
            del self.running[part]
            try:
                text = output.read_text() + cut
                self.append(what, f"\n--- {part} (in the background), its output ---\n{text}[exit {rc}]\n")
                outcome = read(rc, text)
            except Exception as exc:  # an unreadable report: the part failed, the proof goes on
                outcome = Outcome("failed", f"{type(exc).__name__}: {exc}"[:300])
            outcome.seconds = outcome.seconds or time.monotonic() - started  # its own, else until this wait
            self.finished[part] = outcome
            self.log(f"part {part} (background): {outcome.status} ({outcome.seconds:.0f} s) {outcome.note}")

    def abandon(self) -> None:
        """Kill what still runs in the background (the proof stops early: an error, an interrupt)."""
        for proc, *_ in self.running.values():
            _kill_group(proc)
            proc.wait()
        self.running.clear()


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc``'s process group (it was started in a session of its own): the servers and
    processes it started go with it (they would hold the device, its memory and their ports)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def gpu_slug() -> str:
    """h100, h200, ... from the GPU's name (``gpu`` when it cannot be read)."""
    from bench._report import device_slug

    return device_slug(gpu_name())


def gpu_name() -> str | None:
    try:
        from bench.core_gpu import device_name

        return device_name()
    except Exception:
        return None


def gpu_problem() -> str | None:
    """None when CuPy sees a GPU, else why not (the service's own test, so both agree)."""
    from service.device import gpu_problem as problem

    return problem(0)


# --------------------------------------------------------------------------- parts


def part_env(p: Proof) -> Outcome:
    facts: dict[str, str] = {}
    for dist in ("lu-service", "numpy", "scipy", "numba", "cupy-cuda12x", "cupy-cuda13x", "torch", "fastapi"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            facts[dist] = importlib.metadata.version(dist)
    problem = gpu_problem()
    facts["gpu"] = gpu_name() or f"none ({problem})"
    if shutil.which("nvidia-smi"):
        rc, text = p.sh("summary.md", ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                       "--format=csv,noheader"], 30)  # fmt: skip
        if rc == 0:
            facts["nvidia-smi"] = text.strip().splitlines()[0]
    p.facts.update(facts)
    if p.device == "gpu" and problem is not None:
        return Outcome("failed", f"asked for the GPU but {problem}")
    return Outcome("ok", facts["gpu"])


# The ``kernels`` part's process: the service's own warm-up on a CPU device, up to the order a GPU
# service computes on the host (every operation, dtype and kernel twin there), then what it compiled.
KERNELS_CODE = """
import time
t0 = time.perf_counter()
import json
import numba
from numba.core.caching import NullCache
from lu_core._cpu import _kernels, _lanes, _refine_kernels
from service.app import warm_up
from service.config import Settings
from service.device import CpuDevice

seconds = warm_up(CpuDevice(), max_n=Settings().gpu_host_max_n, refined=False)
compiled = loaded = 0
for module in (_kernels, _lanes, _refine_kernels):
    for v in vars(module).values():
        for d in (getattr(v, "serial", None), getattr(v, "parallel", None), v):
            if isinstance(d, numba.core.dispatcher.Dispatcher) and not isinstance(d._cache, NullCache):
                compiled += sum(d.stats.cache_misses.values())
                loaded += sum(d.stats.cache_hits.values())
print(json.dumps({"seconds": seconds, "compiled": compiled, "loaded": loaded, "cache": numba.config.CACHE_DIR,
                  "wall": time.perf_counter() - t0}))
"""


def _kernels_outcome(rc: int, text: str) -> Outcome:
    if rc != 0:
        cut = " (cut while compiling: the servers compile the rest)" if rc == 124 else ""
        return Outcome("failed", f"exit {rc}{cut}")
    said = next(json.loads(ln) for ln in reversed(text.splitlines()) if ln.startswith('{"seconds"'))
    where = said["cache"] or "beside the sources"
    return Outcome("ok", f"{said['compiled']} kernel builds compiled, {said['loaded']} loaded from "
                         f"Numba's cache ({where}) in {said['seconds']:.1f} s", said["wall"])  # fmt: skip


def part_kernels(p: Proof) -> Outcome:
    p.start("kernels", "service.log", [sys.executable, "-c", KERNELS_CODE], _kernels_outcome)
    return Outcome("started", "in the background; the parts after it wait for it (tests: once its GPU tests ran)")


def _pytest_counts(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if re.search(r"\d+ (passed|failed|skipped|error|deselected)", ln)]
    return lines[-1].strip("= ") if lines else "no summary"


EMULATION = "tests/lu_core/_gpu/test_kernels_emulated.py"


def gpu_marked_elsewhere() -> list[str]:
    """The test files outside tests/lu_core/_gpu with tests marked gpu: only those are collected on the
    device, whose environment lacks the dev-only packages other test modules import (schemathesis, ...).
    Not tests/bench (its gpu test runs a quick calibration: the calibrate part measures that)."""
    skip = (ROOT / "tests" / "lu_core" / "_gpu", ROOT / "tests" / "bench")
    marked = re.compile(r"pytest\.mark\.gpu\b")
    return sorted(
        str(f.relative_to(ROOT))
        for f in (ROOT / "tests").rglob("test_*.py")
        if not any(d in f.parents for d in skip) and marked.search(f.read_text())
    )


def part_tests(p: Proof) -> Outcome:
    base = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-o", "addopts=--strict-markers"]
    base += ["--durations=15"]  # where the part's time goes, for its limit
    limit = p.limit("tests") - TESTS_ELSEWHERE_S * (4 if p.device == "cpu" else 1)
    if p.device == "cpu":
        # Without a device the suite only skips, and `make test` already runs its device-free
        # tests (the kernel compile checks): collect it, to prove that it is found and marked.
        rc, text = p.sh("tests.log", [*base, "--collect-only", "tests/lu_core/_gpu", "tests", "-m", "gpu"], limit)
        if rc not in (0, 5):
            return Outcome("failed", f"collection: {_pytest_counts(text)}")
        return Outcome("skipped", f"needs the device; collected {_pytest_counts(text)}")
    # -rfE: the failures by name at the end (what a cut-off log still shows). The host emulation of
    # the kernels is a CPU test (CI runs it; 3 minutes) and stays out of the device's time.
    base[base.index("-rs")] = "-rsfE"  # skips, failures and errors (pytest keeps the last -r only)
    # Beside ``kernels``: the tests' CPU oracles compile into a Numba cache of their own.
    own_cache = {**p.env, "NUMBA_CACHE_DIR": str(p.scratch / "numba-tests")}
    rc1, t1 = p.sh("tests.log", [*base, "tests/lu_core/_gpu", f"--ignore={EMULATION}"], limit, own_cache)
    p.wait()  # the tests marked gpu elsewhere start services: the kernels first
    elsewhere = gpu_marked_elsewhere()
    rc2, t2 = p.sh("tests.log", [*base, "-m", "gpu", *elsewhere], TESTS_ELSEWHERE_S) if elsewhere else (5, "")
    note = f"tests/lu_core/_gpu: {_pytest_counts(t1)}; marked gpu elsewhere: {_pytest_counts(t2)}"
    if rc1 not in (0, 5) or rc2 not in (0, 5):
        return Outcome("failed", note)
    skipped = re.search(r"(\d+) skipped", t1 + t2)
    if skipped and "no CUDA device" in t1 + t2:
        return Outcome("failed", note + " (tests skipped for lack of a device on a GPU run)")
    return Outcome("ok", note)


def part_calibrate(p: Proof) -> Outcome:
    if importlib.util.find_spec("bench.calibrate_gpu") is None:
        return Outcome("missing", "bench/calibrate_gpu.py does not exist yet (issue 11)")
    folder = p.scratch / "calibration"
    tuning = ROOT / "lu_core" / "_gpu" / "_tuning.py"
    before = tuning.read_text() if tuning.exists() else ""
    budget = ["--seconds", str(p.limit("calibrate") - REPORT_S)]
    rc, _ = p.sh("calibration.md", [sys.executable, "-m", "bench.calibrate_gpu", "--out", str(folder), *budget],
                    p.limit("calibrate"))  # fmt: skip
    for f in sorted(folder.glob("*.md")) if folder.exists() else []:
        p.append("calibration.md", f"\n## {f.name}\n\n{f.read_text()}")
    after = tuning.read_text() if tuning.exists() else ""
    if after != before:
        p.append("calibration.md", f"\n## lu_core/_gpu/_tuning.py as calibrated\n\n```python\n{after}```\n")
    if rc != 0:
        return Outcome("failed", f"exit {rc}")
    if gpu_problem() is not None:
        return Outcome("skipped", "needs the device (calibrate_gpu ran and said so)")
    return Outcome("ok", "tuning changed" if after != before else "tuning unchanged")


def part_core_bench(p: Proof) -> Outcome:
    if gpu_problem() is not None:
        # Still run it: the suite must skip itself cleanly without a device.
        rc, _ = p.sh("core.md", [sys.executable, "-m", "bench", "--suite", "core-gpu", "--quick", "--out", ""], 240)
        profile_rc, _ = p.sh("core.md", [sys.executable, "-m", "bench.profile_gpu", "--out", str(p.scratch)], 120)
        trace_rc, _ = p.sh("core.md", [sys.executable, "-m", "bench.trace_gpu", "--out", str(p.scratch)], 120)
        if rc != 0 or profile_rc != 0 or trace_rc != 0:
            return Outcome("failed", f"exit {rc} (grid), {profile_rc} (profile), {trace_rc} (trace) without a device")
        return Outcome("skipped", "needs the device (the suite ran and skipped itself)")
    folder = p.scratch / "core"
    # First where a small call's time goes (host work, waits, device work: bench/profile_gpu.py), then
    # the grid against torch and cupyx in the time left.
    t0 = time.perf_counter()
    profile_rc, _ = p.sh("core.log", [sys.executable, "-m", "bench.profile_gpu", "--out", str(folder),
                                      "--seconds", str(PROFILE_S)], PROFILE_S + FIRST_CALL_S + REPORT_S)  # fmt: skip
    trace_rc, _ = p.sh("core.log", [sys.executable, "-m", "bench.trace_gpu", "--out", str(folder),
                                    "--seconds", str(TRACE_S)], TRACE_S + REPORT_S)  # fmt: skip
    left = p.limit("core-bench") - (time.perf_counter() - t0)
    argv = [sys.executable, "-m", "bench.core_gpu", "--out", str(folder)]
    argv += ["--seconds", str(max(1, int(left - REPORT_S)))]
    rc, _ = p.sh("core.log", [*argv, *(["--quick"] if p.quick else [])], left)
    diagnoses = ("profile-", "trace-")  # appended after the grid
    reports = sorted(folder.glob("*.md"), key=lambda f: f.name.startswith(diagnoses)) if folder.exists() else []
    for f in reports:
        p.append("core.md", f.read_text())
    grid = [f for f in reports if not f.name.startswith(diagnoses)]
    if rc != 0:
        return Outcome("failed", f"exit {rc}")
    if not grid:
        return Outcome("failed", "no report written")
    # The grid stands on its own; a profile cut short keeps the rows it wrote (in core.md).
    stopped = f"; the profile stopped (exit {profile_rc}), see core.log" if profile_rc != 0 else ""
    stopped += f"; the trace stopped (exit {trace_rc}), see core.log" if trace_rc != 0 else ""
    return Outcome("ok", f"{len(grid)} report(s){stopped}")


def part_service(p: Proof) -> Outcome:
    from bench import _proof_service

    return _proof_service.end_to_end(p)


def part_oom(p: Proof) -> Outcome:
    from bench import _proof_service

    if p.device == "cpu" or gpu_problem() is not None:
        return Outcome(
            "skipped",
            "needs the device (the same logic runs on CPU stand-ins in tests/service/test_device_memory.py)",
        )
    return _proof_service.out_of_memory(p)


def _bench_part(p: Proof, part: str, argv: list[str]) -> Outcome:
    """A benchmark suite writing its report into a scratch folder; the report appended to
    ``service-bench.md`` (one file for the service's benchmarks: the file cap)."""
    folder = p.scratch / part
    argv = [sys.executable, *argv, "--out", str(folder), *(["--quick"] if p.quick else [])]
    rc, _ = p.sh("service.log", argv, p.limit(part))
    reports = sorted(folder.glob("*.md")) if folder.exists() else []
    for f in reports:
        p.append("service-bench.md", f.read_text())
    if rc != 0:
        return Outcome("failed", f"exit {rc}")
    return Outcome("ok", reports[0].name) if reports else Outcome("failed", "no report written")


def part_service_bench(p: Proof) -> Outcome:
    # Transport (big binary bodies, the receive cost) and small requests (against the bare app); the
    # stored-factorization and gRPC parts do not fit the device budget (run them alone if time is left).
    return _bench_part(p, "service-bench", ["-m", "bench.service", "--only", "transport", "concurrency"])


def part_batching(p: Proof) -> Outcome:
    return _bench_part(p, "batching", ["-m", "bench.batching", "--proof"])


RUNNERS: dict[str, Callable[[Proof], Outcome]] = {
    "env": part_env,
    "kernels": part_kernels,
    "tests": part_tests,
    "calibrate": part_calibrate,
    "core-bench": part_core_bench,
    "service": part_service,
    "oom": part_oom,
    "service-bench": part_service_bench,
    "batching": part_batching,
}


# --------------------------------------------------------------------------- wheels, summary, main


def install_wheels(folder: Path, log: Callable[[str], None]) -> str | None:
    """pip-install the wheels in ``folder`` into a private target; returns that folder (None: no wheels)."""
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if not wheels:
        return None
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abis = {w.name: re.search(r"-(cp3\d+)-(cp3\d+m?)-", w.name) for w in wheels}  # abi3 wheels fit any
    foreign = [name for name, m in abis.items() if m and m.group(2) != here]
    if foreign:
        log(f"not installing {folder}: its wheels are for another Python than this {here} ({foreign[0]})")
        return None
    target = Path(tempfile.gettempdir()) / "lu-gpu-proof-site"
    log(f"installing {len(wheels)} carried wheels into {target}")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
         "--target", str(target), *map(str, wheels)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"installing the wheels failed:\n{done.stdout}{done.stderr}")
    return str(target)


def _cell(text: str) -> str:
    """One markdown table cell: one line, no pipes, bounded (the detail is in the logs)."""
    flat = " ".join(text.split()).replace("|", "/")
    return flat if len(flat) <= 300 else flat[:297] + "..."


def summary(p: Proof, outcomes: dict[str, Outcome], parts: list[str], total: float) -> str:
    lines = [
        f"# GPU proof ({p.facts.get('date', '')[:10]}, {p.slug})",
        "",
        f"Command: `{'LU_DEVICE=cpu ' if p.device == 'cpu' else ''}make gpu-proof OUT=... "
        f'PARTS="{" ".join(parts)}"`{" (quick)" if p.quick else ""}; {total:.0f} s in all.',
        "",
        "| part | status | seconds | note |",
        "|---|---|---:|---|",
        *[f"| {n} | {o.status} | {o.seconds:.0f} | {_cell(o.note)} |" for n, o in outcomes.items()],
        "",
        "## Environment",
        "",
        *[f"- {k}: {v}" for k, v in p.facts.items()],
    ]
    if p.checks:
        lines += ["", "## Service checks", "", *[f"- {c}" for c in p.checks]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.gpu_proof", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, help="folder for the (at most 8) result files")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), metavar="PART",
                    help=f"parts to run, in the fixed order ({' '.join(PARTS)}); default: all")  # fmt: skip
    ap.add_argument("--device", choices=("gpu", "cpu"), default=None,
                    help="gpu (default) or cpu (the rehearsal); default from LU_DEVICE when it is cpu")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="small grids (the default with --device cpu)")
    ap.add_argument("--wheels", default=str(ROOT / ".whl"), help="folder of carried wheels to install first")
    args = ap.parse_args(argv)
    device = args.device or ("cpu" if os.environ.get("LU_DEVICE", "").lower() == "cpu" else "gpu")
    quick = args.quick or device == "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[gpu-proof {time.perf_counter() - start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    site = install_wheels(Path(args.wheels), log)
    if site is not None:
        sys.path.insert(0, site)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    p = Proof(out, device, quick, log)
    if site is not None:
        p.env["PYTHONPATH"] = os.pathsep.join((site, p.env["PYTHONPATH"]))
        p.facts["carried wheels"] = site
    parts = [name for name in PARTS if name in args.parts]
    outcomes: dict[str, Outcome] = {}
    try:
        for name in parts:
            if name in WAITS and p.running:
                p.wait()
                outcomes.update(p.finished)
            log(f"part {name} ...")
            t0 = time.perf_counter()
            try:
                outcome = RUNNERS[name](p)
            except Exception as exc:  # a part that breaks must not stop the others
                import traceback

                p.append("proof.log", f"part {name} raised:\n{traceback.format_exc()}")
                outcome = Outcome("failed", f"{type(exc).__name__}: {exc}"[:300])
            outcome.seconds = time.perf_counter() - t0
            outcomes[name] = p.finished.get(name, outcome)
            outcomes.update(p.finished)  # a background part a part waited for itself (tests)
            log(f"part {name}: {outcome.status} ({outcome.seconds:.0f} s) {outcome.note}")
            p.path("summary.md").write_text(summary(p, outcomes, parts, time.perf_counter() - start))
        p.wait()  # a background part that nothing waited for (PARTS="kernels" alone)
        outcomes.update(p.finished)
    finally:
        p.abandon()  # only if the loop stopped early: nothing is left running past the proof
    shutil.rmtree(p.scratch, ignore_errors=True)
    text = summary(p, outcomes, parts, time.perf_counter() - start)
    p.path("summary.md").write_text(text)
    p.path("proof.json").write_text(
        json.dumps({n: dataclasses.asdict(o) for n, o in outcomes.items()} | {"facts": p.facts}, indent=1) + "\n"
    )
    print(text)
    failed = [n for n, o in outcomes.items() if o.status == "failed" or (o.status == "missing" and device == "gpu")]
    if failed:
        log(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
