"""Start the built images and check them, without a GPU (``deploy/image_check.sh`` runs this in CI).

    python deploy/image_check.py --cpu-image localhost/lu-service:cpu --gpu-image localhost/lu-service:gpu

``cpu`` image: ready within 10 s of the start command (kernels compiled into the image),
a JSON ``/solve`` and a binary ``/v2`` (``tritonclient.http``) answer correct, the server
process runs as uid 10001, and SIGTERM ends it within the grace period after delivering
the answer that was in flight.

``gpu`` image, on a machine without a GPU: CuPy imports; nvmath-python imports and finds
cuSOLVER (``solve_refined``'s IRS path); every ``.cu`` file compiles
through NVRTC as the backend compiles it (the NVRTC test of ``tests/lu_core/_gpu`` run
inside the image with the image's CuPy); ``LU_DEVICE=auto`` starts on the CPU and logs it;
``LU_DEVICE=gpu`` (the image's default) exits non-zero naming the missing device.

Containers run with docker where an engine works, else with ``buildah run --isolation
chroot`` (host network, no daemon). Exits 1 if any check failed, after running all.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
READY_LIMIT_S = float(os.environ.get("LU_IMAGE_READY_S", "10"))
GRACE_S = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engine:
    """docker or buildah, behind the three things the checks need."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.env = {**os.environ, "STORAGE_DRIVER": os.environ.get("STORAGE_DRIVER", "vfs")}

    def command(self, image: str, env: dict[str, str], argv: list[str], volumes: list[str] = ()) -> tuple[list, str]:
        """(argv to run ``argv`` in a fresh container of ``image``, container id to remove afterwards)."""
        if self.name == "docker":
            cid = f"lu-check-{os.getpid()}-{time.monotonic_ns()}"
            flags = [f"--env={k}={v}" for k, v in env.items()] + [f"--volume={v}" for v in volumes]
            return ["docker", "run", "--rm", "--name", cid, "--network", "host", *flags, image, *argv], cid
        cid = subprocess.run(
            ["buildah", "from", "--quiet", image], capture_output=True, text=True, check=True, env=self.env
        ).stdout.strip()
        flags = [f"--env={k}={v}" for k, v in env.items()] + [f"--volume={v}" for v in volumes]
        return ["buildah", "run", "--isolation", "chroot", *flags, cid, "--", *argv], cid

    def remove(self, cid: str) -> None:
        tool = ["docker", "rm", "-f"] if self.name == "docker" else ["buildah", "rm"]
        subprocess.run([*tool, cid], capture_output=True, check=False, env=self.env)

    def size(self, image: str) -> str:
        if self.name == "docker":
            out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", image], capture_output=True,
                                 text=True, check=True).stdout  # fmt: skip
            return f"{int(out.strip()) / 1e6:.0f} MB"
        out = subprocess.run(["buildah", "images", "--noheading", "--format", "{{.Size}}", image],
                             capture_output=True, text=True, check=True, env=self.env).stdout  # fmt: skip
        return out.strip().splitlines()[0]


def server_pid(port: int, timeout: float = 30) -> int:
    """The host pid of the ``python -m service`` that was given LU_PORT=port (what SIGTERM reaches)."""
    deadline = time.monotonic() + timeout
    needle = f"LU_PORT={port}".encode()
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
                if b"-m" in cmd and b"service" in cmd and needle in (proc / "environ").read_bytes().split(b"\0"):
                    return int(proc.name)
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no server process with LU_PORT={port}")


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


class Container:
    """``python -m service`` in a container of ``image``; stderr kept."""

    def __init__(self, engine: Engine, image: str, **env: str) -> None:
        self.engine = engine
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {"LU_PORT": str(self.port), "LU_GRACEFUL_SHUTDOWN_S": str(GRACE_S), **env}
        argv, self.cid = engine.command(image, env, ["python", "-m", "service"])
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=engine.env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")))
        self._reader.start()

    def wait_ready(self, timeout: float = 120) -> float:
        while time.monotonic() - self.started < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}: {''.join(self.lines[-20:])}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"not ready after {timeout} s: {''.join(self.lines[-20:])}")

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(AssertionError, ProcessLookupError):
                os.kill(server_pid(self.port, 2), signal.SIGTERM)
            try:
                self.proc.wait(GRACE_S + 20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(5)
        self.engine.remove(self.cid)


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def check(self, name: str, fn: Callable[[], str | None]) -> None:
        t0 = time.monotonic()
        try:
            detail, status = fn() or "", "ok"
        except Exception as exc:
            detail, status = f"{type(exc).__name__}: {exc}"[:1500], "FAILED"
        self.rows.append((name, status, detail))
        print(f"[image-check] {name}: {status} ({time.monotonic() - t0:.1f} s) {detail}", flush=True)

    @property
    def failed(self) -> list[str]:
        return [n for n, s, _ in self.rows if s != "ok"]


# --------------------------------------------------------------------------- cpu image


def check_cpu(engine: Engine, image: str, report: Report) -> None:
    box = Container(engine, image)
    try:

        def ready() -> str:
            seconds = box.wait_ready()
            if seconds > READY_LIMIT_S:
                raise AssertionError(f"ready after {seconds:.1f} s, over {READY_LIMIT_S:.0f} s")
            return f"ready {seconds:.1f} s after the start command"

        report.check("cpu: ready within 10 s", ready)

        def solve() -> str:
            r = httpx.post(f"{box.url}/solve", json={"A": [[3, 1], [1, 2]], "B": [9, 8]}, timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["X"]["data"] == [2.0, 3.0], r.text
            return "X = [2, 3]"

        report.check("cpu: JSON /solve", solve)

        def mkl() -> str:
            from lu_core._cpu import _lapack

            lapack = httpx.get(f"{box.url}/readyz", timeout=5).json()["device"].get("lapack", "")
            # LU_CORE_LAPACK=auto's rule (MKL on Intel's CPUs), for this host's CPU, which the container shares
            if _lapack.auto_takes_mkl(_lapack.cpu_vendor()):
                assert lapack.startswith("MKL"), lapack
                assert lapack.endswith("; GNU threading layer)"), lapack  # libgomp1 is in the image
                summary = f"{lapack[:28]}...{lapack[-24:]}"
            else:  # OpenBLAS, MKL beside it for the threaded getrf of float64 and complex matrices (_lapack.MKL_BESIDE)
                assert lapack.startswith("SciPy ("), lapack
                assert f"; {_lapack.MKL_BESIDE} on MKL (" in lapack, lapack
                assert lapack.endswith("; GNU threading layer)"), lapack  # ... and MKL throughout where asked for
                probe = (
                    "import numpy as np, lu_core; from lu_core._cpu import _lapack; "
                    "A = np.random.default_rng(1).standard_normal((2, 300, 300)) + 40 * np.eye(300); "
                    "X = lu_core.solve(A, np.ones((2, 300, 1))); "
                    "assert np.allclose(A @ X, 1, atol=1e-9); print(_lapack.lapack().name)"
                )
                done = _run(engine, image, ["python", "-c", probe], {"LU_CORE_LAPACK": "mkl"}, timeout=120)
                assert done.returncode == 0, done.stdout + done.stderr
                said = done.stdout.strip()
                assert said.startswith("MKL"), said
                assert said.endswith("; GNU threading layer)"), said
                summary = f"{lapack[:40]}; with LU_CORE_LAPACK=mkl {said[:28]}...{said[-24:]}"
            rng = np.random.default_rng(1)
            # Past the kernels: LAPACK's getrf and getrs, one thread in the pool (130), threaded (300: MKL's getrf
            # under auto on any vendor's CPU).
            for n in (130, 300):
                A = rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)
                B = rng.standard_normal(n)
                r = httpx.post(f"{box.url}/solve", json={"A": A.tolist(), "B": B.tolist()}, timeout=60)
                assert r.status_code == 200, r.text
                np.testing.assert_allclose(A @ np.asarray(r.json()["X"]["data"]), B, rtol=1e-10, atol=1e-10)
            return f"{summary}; 130 x 130 and 300 x 300 /solve through the service's"

        report.check("cpu: large matrices on the CPU's LAPACK (MKL on Intel's, beside OpenBLAS on others')", mkl)

        def v2_binary() -> str:
            import tritonclient.http as httpclient

            rng = np.random.default_rng(0)
            A = rng.standard_normal((4, 8, 8)) + 8 * np.eye(8)
            B = rng.standard_normal((4, 8, 2))
            client = httpclient.InferenceServerClient(url=f"127.0.0.1:{box.port}")
            inputs = [
                httpclient.InferInput("A", list(A.shape), "FP64"),
                httpclient.InferInput("B", list(B.shape), "FP64"),
            ]
            inputs[0].set_data_from_numpy(A, binary_data=True)
            inputs[1].set_data_from_numpy(B, binary_data=True)
            X = client.infer(
                "solve", inputs, outputs=[httpclient.InferRequestedOutput("X", binary_data=True)]
            ).as_numpy("X")
            client.close()
            np.testing.assert_allclose(A @ X, B, rtol=1e-12, atol=1e-12)
            return "tritonclient.http, binary tensors, A X = B"

        report.check("cpu: binary /v2 through tritonclient", v2_binary)
        report.check("cpu: runs as uid 10001", lambda: f"uid {_expect(uid_of(server_pid(box.port)), 10001)}")
        report.check("cpu: SIGTERM delivers the answer in flight, then exits", lambda: _sigterm(box))
    finally:
        box.close()


def _expect(value: int, wanted: int) -> int:
    if value != wanted:
        raise AssertionError(f"{value}, not {wanted}")
    return value


def _sigterm(box: Container) -> str:
    """Half a request's body sent, SIGTERM, the rest sent: the answer must come, then the exit."""
    body = json.dumps({"A": [[3.0, 1.0], [1.0, 2.0]], "B": [9.0, 8.0]}).encode()
    pid = server_pid(box.port)
    with socket.create_connection(("127.0.0.1", box.port), timeout=30) as s:
        s.sendall(
            f"POST /solve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        time.sleep(0.3)
        os.kill(pid, signal.SIGTERM)
        t0 = time.monotonic()
        time.sleep(0.5)
        s.sendall(body[10:])
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    if not answer.startswith(b"HTTP/1.1 200") or b'"data":[2.0,3.0]' not in answer:
        raise AssertionError(f"in-flight answer: {answer[:300]!r}")
    code = box.proc.wait(GRACE_S + 5)
    took = time.monotonic() - t0
    if took > GRACE_S:
        raise AssertionError(f"exited after {took:.1f} s, over the {GRACE_S} s grace period")
    return f"answer 200 delivered; exit {code} {took:.1f} s after SIGTERM (grace {GRACE_S} s)"


# --------------------------------------------------------------------------- gpu image


def _run(engine: Engine, image: str, argv: list[str], env: dict[str, str] | None = None, volumes: list[str] = (),
         timeout: float = 600) -> subprocess.CompletedProcess:  # fmt: skip
    """One command in a fresh container of ``image``, removed after."""
    cmd, cid = engine.command(image, env or {}, argv, volumes)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=engine.env, check=False)
    finally:
        engine.remove(cid)


def check_gpu(engine: Engine, image: str, report: Report) -> None:
    run = functools.partial(_run, engine, image)

    def cupy_imports() -> str:
        done = run(["python", "-c", "import cupy, cupyx.scipy.linalg; print(cupy.__version__)"])
        assert done.returncode == 0, done.stdout + done.stderr
        return f"cupy {done.stdout.strip()}"

    def nvmath_finds_cusolver() -> str:
        # solve_refined's cuSOLVER IRS path: nvmath-python (installed without its CUDA extra) must
        # import and locate the cuSOLVER that CuPy's wheels brought.
        code = (
            "import nvmath, nvmath.bindings.cusolverDn; from cuda.pathfinder import load_nvidia_dynamic_lib as f; "
            "print(nvmath.__version__, f('cusolver').abs_path)"
        )
        done = run(["python", "-c", code])
        assert done.returncode == 0, done.stdout + done.stderr
        return f"nvmath {done.stdout.strip()}"

    report.check("gpu: CuPy imports", cupy_imports)
    report.check("gpu: nvmath-python imports and finds cuSOLVER", nvmath_finds_cusolver)
    report.check("gpu: every .cu compiles through NVRTC as the backend compiles it", lambda: _nvrtc(run))

    def auto_falls_back() -> str:
        box = Container(engine, image, LU_DEVICE="auto", LU_LOG_JSON="false")
        try:
            seconds = box.wait_ready()
            kind = httpx.get(f"{box.url}/readyz").json()["device"]
            assert kind["kind"] == "cpu", kind
            log = "".join(box.lines)
            assert "LU_DEVICE=auto: no GPU" in log, log[-2000:]
            assert "computing on the CPU" in log, log[-2000:]
            r = httpx.post(f"{box.url}/solve", json={"A": [[3, 1], [1, 2]], "B": [9, 8]}, timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["X"]["data"] == [2.0, 3.0], r.text
            return f"ready on the CPU after {seconds:.1f} s; logged: {kind.get('note')}"
        finally:
            box.close()

    report.check("gpu: LU_DEVICE=auto starts on the CPU and logs it", auto_falls_back)

    def gpu_refuses() -> str:
        done = run(["python", "-m", "service"], {"LU_PORT": str(free_port())}, timeout=120)
        out = done.stdout + done.stderr
        assert done.returncode != 0, out[-2000:]
        assert "LU_DEVICE=gpu" in out, out[-2000:]
        assert "no GPU" in out, out[-2000:]
        line = next(ln for ln in out.splitlines() if "LU_DEVICE=gpu" in ln)
        return f"exit {done.returncode}: {line[:300]}"

    report.check("gpu: LU_DEVICE=gpu exits non-zero naming the missing device", gpu_refuses)


def _nvrtc(run: Callable[..., subprocess.CompletedProcess]) -> str:
    """The GPU core's NVRTC compile test (tests/lu_core/_gpu/test_cuda_sources.py), inside the image, with
    the image's CuPy and CUDA wheels, and pytest installed into a scratch folder there."""
    test = ROOT / "tests" / "lu_core" / "_gpu" / "test_cuda_sources.py"
    assert test.exists(), f"{test} is missing: the compile check has nothing to run"
    volumes = [f"{ROOT}:/src:ro"]
    for f in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf"):
        if Path(f).exists():
            volumes.append(f"{f}:{f}:ro")
    script = (
        "set -e; python -m pip install --quiet --disable-pip-version-check --no-cache-dir --target /tmp/pt "
        "pytest hypothesis >/dev/null; cd /src; PYTHONPATH=/tmp/pt:/opt/app python -m pytest -q -rs "
        f"-p no:cacheprovider -o addopts= /src/tests/lu_core/_gpu/{test.name}"
    )
    done = run(["sh", "-c", script], {"PIP_CERT": "/etc/ssl/certs/ca-certificates.crt"}, volumes)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    summary = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|skipped)", ln)]
    if not summary or "passed" not in summary[-1] or "failed" in summary[-1]:
        raise AssertionError(f"the compile tests did not pass: {out[-2000:]}")
    return f"{test.name}: {summary[-1].strip('= ')}"


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-image")
    ap.add_argument("--gpu-image")
    ap.add_argument("--engine", choices=("docker", "buildah"), default=os.environ.get("LU_IMAGE_ENGINE") or None)
    args = ap.parse_args(argv)
    engine_name = args.engine
    if engine_name is None:
        works = subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=20).returncode == 0 \
            if _which("docker") else False  # fmt: skip
        engine_name = "docker" if works else "buildah"
    engine = Engine(engine_name)
    report = Report()
    if args.cpu_image:
        report.check("cpu: image size", lambda: engine.size(args.cpu_image))
        check_cpu(engine, args.cpu_image, report)
    if args.gpu_image:
        report.check("gpu: image size", lambda: engine.size(args.gpu_image))
        check_gpu(engine, args.gpu_image, report)
    print("\n| check | status | detail |\n|---|---|---|")
    for name, status, detail in report.rows:
        print(f"| {name} | {status} | {detail.splitlines()[0] if detail else ''} |")
    if report.failed:
        print(f"FAILED: {', '.join(report.failed)}", file=sys.stderr)
        return 1
    return 0


def _which(name: str) -> bool:
    import shutil

    return shutil.which(name) is not None


if __name__ == "__main__":
    sys.exit(main())
