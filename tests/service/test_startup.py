"""Starting the service: the command line, the port opened before warm-up, readiness while warming up."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import uvicorn

import service.app as app_module
from service.__main__ import main as service_main
from service.app import create_app
from service.cli import FLAGS, build_parser, overrides, service_version
from service.config import Settings
from tests.service.conftest import make_settings
from tests.service.test_e2e import ROOT, Server, free_port


def run_service(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "LU_DEVICE": "cpu", "LU_LOG_JSON": "false", **env}
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------- the command line


def test_help_lists_every_flag_with_its_variable_and_starts_nothing():
    done = run_service("--help", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: lu-service")
    for name in FLAGS:
        assert f"--{name.replace('_', '-')}" in done.stdout and f"LU_{name.upper()}" in done.stdout
    assert "listening" not in done.stderr


def test_version():
    done = run_service("--version", timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"lu-service {service_version()}"
    assert service_version()[0].isdigit()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "70000"], "invalid settings"),  # out of range: pydantic's bound, from Settings
        (["--port", "eighty"], "invalid int value"),
        (["--port", "-1"], "invalid settings"),
        (["--device", "tpu"], "invalid choice"),
        (["--max-queue", "0"], "invalid settings"),
        (["--max-request-bytes", "1e400"], "invalid int value"),
        (["--graceful-shutdown-s", "nan"], "invalid settings"),
        (["--log-level", "LOUD"], "invalid choice"),
        (["--no-such-flag"], "unrecognized arguments"),
        (["--api-key", "secret"], "unrecognized arguments"),  # secrets stay out of process lists
        (["--port"], "expected one argument"),
    ],
)
def test_bad_flags_exit_2_with_a_message(args, message, capsys):
    # In-process: the same main() as the command, without paying an interpreter start per case.
    try:
        status = service_main(args)
    except SystemExit as exc:  # argparse's own usage errors
        status = exc.code
    assert status == 2, args
    assert message in capsys.readouterr().err


def test_a_bad_lapack_choice_exits_2_with_a_message(monkeypatch, capsys):
    from lu_core._cpu import _lapack

    monkeypatch.setattr(_lapack, "_chosen", None)
    monkeypatch.setenv("LU_CORE_LAPACK", "openblas")
    assert service_main(["--device", "cpu", "--port", "0", "--no-warmup"]) == 2
    assert "LU_CORE_LAPACK must be one of auto, mkl, scipy, not 'openblas'" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "many", "1e400", "2.5", ""])
@pytest.mark.parametrize("name", ["LU_STORE_MAX_ENTRIES", "LU_MAX_CONNECTIONS"])
def test_a_bad_count_setting_exits_2_with_a_message(monkeypatch, capsys, name, value):
    """The newer count settings are checked as every setting is: negative, non-integer or empty values
    stop the start with status 2 and name the variable."""
    monkeypatch.setenv(name, value)
    assert service_main(["--device", "cpu", "--port", "0", "--no-warmup"]) == 2
    err = capsys.readouterr().err
    assert "invalid settings" in err and name.removeprefix("LU_").lower() in err.lower()


def test_no_connections_at_all_is_refused(monkeypatch, capsys):
    """LU_MAX_CONNECTIONS = 0 would serve nothing: refused at start (a limit is at least 1)."""
    monkeypatch.setenv("LU_MAX_CONNECTIONS", "0")
    assert service_main(["--device", "cpu", "--port", "0", "--no-warmup"]) == 2
    assert "max_connections" in capsys.readouterr().err.lower()


def test_flags_override_the_environment(monkeypatch):
    monkeypatch.setenv("LU_PORT", "1234")
    monkeypatch.setenv("LU_LOG_JSON", "true")
    monkeypatch.setenv("LU_MAX_QUEUE", "7")
    args = build_parser().parse_args(["--port", "4321", "--no-log-json", "--device", "cpu", "--no-warmup"])
    settings = Settings(**overrides(args))
    assert (settings.port, settings.log_json, settings.device, settings.warmup) == (4321, False, "cpu", False)
    assert settings.max_queue == 7  # not given as a flag: the environment decides
    assert overrides(build_parser().parse_args([])) == {}


def test_every_flag_is_a_setting():
    assert set(FLAGS) <= set(Settings.model_fields)
    assert "api_key" not in FLAGS


def test_a_started_server_takes_its_flags_over_the_environment():
    port = free_port()
    with socket.socket() as busy:  # the environment names a port that is taken: the flag must win
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        env = {"LU_PORT": str(busy.getsockname()[1]), "LU_DEVICE": "gpu", "CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "--port", str(port), "--device", "cpu", "--no-warmup", "--max-queue", "3"],
            cwd=ROOT, env={**os.environ, **env}, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            body = _wait_ready(f"http://127.0.0.1:{port}", proc)
            assert body["device"]["kind"] == "cpu" and body["queue"]["max"] == 3
        finally:
            proc.terminate()
            proc.communicate(timeout=60)


def _wait_ready(url: str, proc: subprocess.Popen[str], timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            r = httpx.get(f"{url}/readyz", timeout=2)
            if r.status_code == 200:
                return r.json()
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("not ready")


# ---------------------------------------------------------------- the port first


def test_a_port_in_use_fails_before_anything_slow():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        done = run_service("--port", str(port), timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "in use" in done.stderr
    # It failed before choosing the device (let alone warming up): nothing heavy was started.
    assert "computing on" not in done.stderr and "warm-up" not in done.stderr


def test_an_address_that_cannot_be_bound_fails_the_same_way():
    done = run_service("--host", "203.0.113.7", "--port", str(free_port()), timeout=60)  # TEST-NET-3: not ours
    assert done.returncode == 1 and "cannot listen on 203.0.113.7" in done.stderr, done.stderr


class _LiveApp:
    """An app served by uvicorn on loopback in a thread, as ``python -m service`` serves it."""

    def __init__(self, **settings) -> None:
        self.app = create_app(make_settings(**settings))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_config=None, access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _LiveApp:
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/healthz", timeout=2)
                return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError("the port never opened")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)


@pytest.fixture
def held_warm_up(monkeypatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Warm-up that waits for the test's go-ahead, then runs the real warm-up."""
    started, release = threading.Event(), threading.Event()
    real = app_module.warm_up

    def held(device):
        started.set()
        release.wait(120)
        return real(device)

    monkeypatch.setattr(app_module, "warm_up", held)
    yield started, release
    release.set()


def test_readyz_answers_503_while_warming_up_then_200(held_warm_up):
    started, release = held_warm_up
    with _LiveApp(warmup=True) as live:
        assert started.wait(60)
        assert httpx.get(f"{live.url}/healthz").status_code == 200
        r = httpx.get(f"{live.url}/readyz")
        assert r.status_code == 503 and r.json()["status"] == "starting"
        assert httpx.get(f"{live.url}/v2/health/ready").status_code == 503
        assert httpx.get(f"{live.url}/v2/health/live").status_code == 200

        # A request sent while warming up waits behind the warm-up instead of failing.
        answers: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"{live.url}/solve", json={"A": [[3, 1], [1, 2]], "B": [9, 8]}, timeout=120)
            )
        )
        sender.start()
        time.sleep(0.3)
        assert not answers
        release.set()
        sender.join(120)
        assert answers[0].status_code == 200 and answers[0].json()["X"]["data"] == [2.0, 3.0]
        deadline = time.monotonic() + 60
        while httpx.get(f"{live.url}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert httpx.get(f"{live.url}/v2/health/ready").status_code == 200


def test_a_failed_warm_up_keeps_readyz_at_503(monkeypatch, caplog):
    def broken(device):
        raise RuntimeError("the device fell over")

    monkeypatch.setattr(app_module, "warm_up", broken)
    caplog.set_level(logging.ERROR, logger="service")
    with _LiveApp(warmup=True) as live:
        deadline = time.monotonic() + 60
        while "warm-up failed" not in caplog.text:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert httpx.get(f"{live.url}/readyz").status_code == 503
        assert httpx.get(f"{live.url}/healthz").status_code == 200


def test_the_real_process_opens_its_port_before_it_is_ready():
    """`python -m service` logs `listening` before the device is chosen and the warm-up starts."""
    srv = Server(LU_WARMUP="true", LU_API_KEY="")  # (blank: unset, whatever the environment holds)
    try:
        srv.wait_ready()
        deadline = time.monotonic() + 30  # the log is read by a thread: let it catch up
        while "ready on the CPU" not in "".join(srv.log) and time.monotonic() < deadline:
            time.sleep(0.05)
        text = "".join(srv.log)
        assert (
            text.index("listening on http://127.0.0.1")
            < text.index("computing on the CPU")
            < text.index("warm-up done")
        )
        assert text.index("warm-up done") < text.index("ready on the CPU")
        assert "(authentication off: LU_API_KEY unset or empty)" in text  # said once, at start
    finally:
        srv.stop()


# The start of both fresh-process scripts below: a CPU device, warmed up as the service warms it up.
_WARMED_UP = (
    "import numba\n"
    "import numpy as np\n"
    "from service.app import warm_up, _as_body, OPERATIONS\n"
    "from service.device import CpuDevice\n"
    "from lu_core._cpu import _kernels, _lanes, _refine_kernels\n"
    "device = CpuDevice()\n"
    "warm_up(device)\n"
)


def _in_a_fresh_process(code: str) -> str:
    """``_WARMED_UP`` then ``code`` in a new interpreter (nothing compiled before it); its stdout."""
    out = subprocess.run(
        [sys.executable, "-c", _WARMED_UP + code], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_warm_up_compiles_both_twins_of_every_cpu_factor_kernel():
    """In a fresh process (so nothing compiled them before): after the warm-up, the serial and parallel
    twins of both factorization kernels (SIMD lanes and one matrix at a time) exist for every dtype
    they take, for read-only inputs only (the device hands every request's tensors to the kernels
    read-only: a binary request's are views of its body, the others are made so), so no request
    compiles one (2-3 s each; the image's readiness check allows 10) and none is compiled twice."""
    stdout = _in_a_fresh_process(
        "for name, twin, dtypes in (('lanes', _lanes.getrf, 'fd'), ('one by one', _kernels.getrf, 'fdFD')):\n"
        "    for kind in ('serial', 'parallel'):\n"
        "        got = {(str(sig[0].dtype), sig[0].mutable) for sig in getattr(twin, kind).signatures}\n"
        "        want = {(str(np.dtype(c)), False) for c in dtypes}\n"
        "        print(name, kind, 'ok' if want == got else f'want {sorted(want)}, got {sorted(got)}')\n"
    )
    lines = stdout.strip().splitlines()
    assert len(lines) == 4 and all(line.endswith(" ok") for line in lines), stdout


@pytest.mark.parametrize("body", ["binary", "json"])
def test_a_request_after_the_warm_up_compiles_nothing(body):
    """The first request of every operation, in a fresh process after the warm-up, adds no compiled
    signature to any CPU kernel: a binary request's tensors (read-only views of its body) and a JSON
    request's (writable arrays, made read-only views by the device). Before, a first ``solve_refined``
    compiled its refinement kernels at request time (the warm-up did not run it), and the warm-up
    compiled every kernel twice, once per writability."""
    stdout = _in_a_fresh_process(
        f"frozen = {body == 'binary'}\n"
        "def count():\n"
        "    n = 0\n"
        "    for mod in (_kernels, _lanes, _refine_kernels):\n"
        "        for v in vars(mod).values():\n"
        "            for d in (getattr(v, 'serial', None), getattr(v, 'parallel', None), v):\n"
        "                if isinstance(d, numba.core.dispatcher.Dispatcher):\n"
        "                    n += len(d.signatures)\n"
        "    return n\n"
        "def req(x):\n"
        "    return _as_body(x) if frozen else np.array(x, order='C')  # as JSON decodes: C order, writable\n"
        "before = count()\n"
        "rng = np.random.default_rng(1)\n"
        "for dt in (np.float32, np.float64, np.complex64, np.complex128):\n"
        "    for batch, n in ((10, 4), (1, 8), (3, 8), (500, 8), (2, 24), (2, 40), (None, 8), (None, 40)):\n"
        "        shape = (n, n) if batch is None else (batch, n, n)\n"
        "        A = req((rng.standard_normal(shape) + n * np.eye(n)).astype(dt))\n"
        "        B = req(rng.standard_normal((*shape[:-1], 2)).astype(dt))\n"
        "        f = device.run(OPERATIONS['lu_factor'].compute, {'A': A}, {'pivot': True})\n"
        "        lu = req(f['LU'])\n"
        "        # a JSON list of pivots decodes to int64 (service.codec); a binary body carries int32\n"
        "        piv = req(f['pivots']) if frozen else np.array(f['pivots'], dtype=np.int64)\n"
        "        for name, ins in (('lu_unpack', {'LU': lu, 'pivots': piv}), ('lu_solve', {'LU': lu, 'pivots': piv, 'B': B}),\n"
        "                          ('solve', {'A': A, 'B': B}), ('solve_refined', {'A': A, 'B': B}), ('lu', {'A': A}),\n"
        "                          ('slogdet', {'A': A}), ('det', {'A': A})):\n"
        "            device.run(OPERATIONS[name].compute, ins, OPERATIONS[name].defaults())\n"
        "        anorm = req(np.abs(A).sum(axis=-2).max(axis=-1))\n"
        "        for norm in ('1', 'inf'):\n"
        "            device.run(OPERATIONS['lu_rcond'].compute, {'LU': lu, 'pivots': piv, 'anorm': anorm}, {'norm': norm})\n"
        "print('new signatures', count() - before)\n"
    )
    assert stdout.strip().endswith("new signatures 0"), stdout


@pytest.mark.parametrize("dtype", app_module.WARMUP_DTYPES)
def test_the_warm_up_reaches_every_gpu_routine(dtype):
    """Each library the GPU backend calls loads on first use (seconds on a fresh machine): the warm-up's
    shapes (with one right-hand side each) must reach every factor and solve routine of its dispatch."""
    from lu_core._gpu import _tuning

    dt = np.dtype(dtype)
    factor = {_tuning.factor_path(n, n, batch or 1, dt) for batch, n in app_module.WARMUP_SHAPES}
    solve = {_tuning.solve_path(n, batch or 1, 1) for batch, n in app_module.WARMUP_SHAPES}
    assert factor == {"own", "getrfBatched", "getrf"}
    # getrsBatched where the table lets the dispatch choose it (not since the H100's calibration)
    chosen = _tuning.GETRS_BATCHED_MAX_N > _tuning.SMALL_SOLVE_MAX_N and _tuning.GETRS_BATCHED_MAX_NRHS >= 1
    assert solve == {"own", "getrs", "trsmBatched"} | ({"getrsBatched"} if chosen else set())


def test_on_a_gpu_the_warm_up_runs_small_shapes_on_the_host_and_on_the_device():
    """A GPU service computes small matrices on the host (LU_GPU_HOST_MAX_N), but stored factorizations,
    rectangular and refined requests still reach our own kernels: the warm-up runs the small shapes both
    ways, and leaves the setting as it was."""
    from service.device import host_sized, operation_name

    class Recording:
        kind = "gpu"
        host_max_n = 32

        def __init__(self) -> None:
            self.seen: list[tuple[str, int, bool]] = []
            self.unbatched: set[tuple[str, bool]] = set()  # (operation, on the host) of 2-D requests

        def run(self, compute, tensors, options):
            name, matrix = operation_name(compute), tensors.get("A", tensors.get("LU"))
            on_host = host_sized(name, tensors, self.host_max_n)
            self.seen.append((name, matrix.shape[-1], on_host))
            if matrix.ndim == 2:
                self.unbatched.add((name, on_host))
            return app_module.OPERATIONS[name].compute(tensors, options)

    device = Recording()
    app_module.warm_up(device)
    small = {n for _, n in app_module.WARMUP_SHAPES if n <= 32}
    assert {n for _, n, on_host in device.seen if on_host} == small
    assert {n for _, n, on_host in device.seen if not on_host} == {n for _, n in app_module.WARMUP_SHAPES}
    assert device.host_max_n == 32
    # Every operation with kernels of its own; not solve_refined, which a GPU service never computes on
    # the host (a CPU service's warm-up runs it: test_a_request_after_the_warm_up_compiles_nothing).
    assert {name for name, _, _ in device.seen} == {"lu_factor", "lu_unpack", "lu_solve", "solve", "lu"}
    # Unbatched (2-D) requests of every operation reach the device too: CuPy compiles its kernels per
    # number of dimensions (the first unbatched 5792² solve after a batched-only warm-up: 5.8 s).
    assert {name for name, on_host in device.unbatched if not on_host} == {name for name, _, _ in device.seen}
    # max_n: only the shapes up to it (what the GPU proof's kernels part compiles, the host's share).
    device.seen.clear()
    app_module.warm_up(device, max_n=4)
    assert {n for _, n, _ in device.seen} == {4} and device.host_max_n == 32


def test_the_open_file_limit_is_raised_to_what_the_connection_bound_needs(monkeypatch, caplog):
    """LU_MAX_CONNECTIONS = 1024 may need 3 x 1024 + slack files; a soft limit of 1024 (common) is raised as far
    as the hard limit allows, and a hard limit below the need is logged."""
    import resource

    from service.__main__ import FILE_SLACK, raise_file_limit

    limits = {"soft": 1024, "hard": 1 << 20}
    monkeypatch.setattr(resource, "getrlimit", lambda _: (limits["soft"], limits["hard"]))
    monkeypatch.setattr(resource, "setrlimit", lambda _, pair: limits.update(soft=pair[0], hard=pair[1]))
    assert raise_file_limit(1024) == 3 * 1024 + FILE_SLACK == limits["soft"]
    assert raise_file_limit(10) == limits["soft"]  # never lowered
    limits.update(soft=1024, hard=2048)
    with caplog.at_level("WARNING", logger="service"):
        assert raise_file_limit(1024) == 2048
    assert "below the 3328 that LU_MAX_CONNECTIONS = 1024 may need" in caplog.text
