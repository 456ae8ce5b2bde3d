"""The GPU proof's own plumbing (its CPU rehearsal, end to end, runs in .ci/run)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from bench import gpu_proof, gpu_wheels


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("Tesla V100-PCIE-16GB", "v100"),
        ("NVIDIA GeForce RTX 4090", "gpu"),
        (None, "gpu"),
    ],
)
def test_results_are_named_after_the_device(monkeypatch, name, slug):
    monkeypatch.setattr(gpu_proof, "gpu_name", lambda: name)
    assert gpu_proof.gpu_slug() == slug


def test_never_more_than_eight_result_files(tmp_path):
    proof = gpu_proof.Proof(tmp_path, "cpu", True, lambda _: None)
    paths = [proof.path(f"f{i}.log") for i in range(gpu_proof.MAX_FILES)]
    assert len(set(paths)) == 8 and all(p.name.startswith("gpu-proof-cpu-") for p in paths)
    assert proof.path("f0.log") == paths[0]  # the same file again is no new file
    with pytest.raises(RuntimeError, match="more than 8"):
        proof.path("one-too-many.log")


def test_rehearsal_limits_are_longer_than_the_device_budget(tmp_path):
    cpu = gpu_proof.Proof(tmp_path, "cpu", True, lambda _: None)
    gpu = gpu_proof.Proof(tmp_path, "gpu", False, lambda _: None)
    assert cpu.limit("tests") == 4 * gpu.limit("tests")
    # Two device commands of at most 10 minutes each (the checks, then the measurements), each in the
    # parts' fixed order, every part in one of them, and the whole proof within a session's 15 minutes
    # of device time with a minute to start. The background part opens both commands: in the first it
    # runs beside the tests' GPU tests (which wait for it before the tests that start services) and
    # no longer; in the second the first measurement waits for it at once (nothing measures beside a
    # compile), so its limit counts there.
    commands, background = gpu_proof.COMMANDS, set(gpu_proof.BACKGROUND)
    assert {p for c in commands for p in c} == set(gpu_proof.PARTS) == set(gpu_proof.LIMITS)
    assert all(list(c) == [p for p in gpu_proof.PARTS if p in c] for c in commands)
    assert set(gpu_proof.PARTS) - background == {p for c in commands for p in c} - background
    assert sum(len(c) for c in commands) == len(gpu_proof.PARTS) + len(background) * (len(commands) - 1)
    (kernels,) = background
    assert [c[:2] for c in commands] == [("env", kernels), (kernels, "calibrate")]
    assert set(gpu_proof.WAITS) == set(gpu_proof.PARTS[gpu_proof.PARTS.index(kernels) + 1 :]) - {"tests"}
    assert gpu_proof.LIMITS[kernels] <= gpu_proof.LIMITS["tests"] - gpu_proof.TESTS_ELSEWHERE_S
    checks, measurements = (sum(gpu_proof.LIMITS[p] for p in c if p not in background) for c in commands)
    measurements += gpu_proof.LIMITS[kernels]
    # On one machine (kernels from its cache in the second command): the limits and a minute's start hold
    # in 15 minutes; on a fresh one for the second command, its compile comes on top (and a second start).
    assert checks < 540 and measurements < 540 and checks + measurements <= 15 * 60
    assert sum(v for p, v in gpu_proof.LIMITS.items() if p not in background) + 60 <= 13 * 60
    # The budgeted benchmarks stop early enough to write their reports.
    assert all(gpu_proof.LIMITS[p] > 2 * gpu_proof.REPORT_S for p in ("calibrate", "core-bench"))


def test_the_core_gpu_grid_runs_cheapest_first_so_a_budget_cuts_the_costliest():
    from bench import core_gpu

    todo = [(b, n, d) for d in core_gpu.DTYPES for (b, n) in core_gpu.cases(False)]
    ordered = core_gpu.in_order(todo)
    assert sorted(ordered) == sorted(todo)
    work = [b * n**3 for b, n, _ in ordered]
    assert work == sorted(work)
    assert ordered[-1][1] == 8192  # the one 8192 x 8192 matrix (of either dtype) comes last


def test_summary_cells_stay_on_one_line():
    assert gpu_proof._cell("a\n| b  c") == "a / b c"
    assert len(gpu_proof._cell("x" * 1000)) == 300


def test_wheels_for_another_python_are_not_installed(tmp_path):
    other = "cp399" if sys.version_info[:2] != (3, 99) else "cp398"
    (tmp_path / f"orjson-3.13.0-{other}-{other}-manylinux_2_17_x86_64.whl").write_bytes(b"")
    messages: list[str] = []
    assert gpu_proof.install_wheels(tmp_path, messages.append) is None
    assert "another Python" in messages[0]
    assert gpu_proof.install_wheels(tmp_path / "absent", messages.append) is None


def test_wheel_selection_keeps_only_what_the_device_lacks():
    has = {gpu_wheels.normalize(n) for n in gpu_wheels.DEVICE_HAS}
    assert {"numpy", "httpx", "prometheus-client", "uvloop", "cupy-cuda13x"} <= has
    assert not {"fastapi", "uvicorn", "pydantic-settings", "orjson", "tritonclient"} & has
    assert gpu_wheels.wheel_project(gpu_wheels.Path("pydantic_settings-2.16.3-py3-none-any.whl")) == "pydantic-settings"


def test_a_cpu_rehearsal_of_the_quick_parts(tmp_path, monkeypatch):
    monkeypatch.delenv("LU_DEVICE", raising=False)
    rc = gpu_proof.main(
        ["--out", str(tmp_path), "--device", "cpu", "--parts", "env", "calibrate", "oom", "--wheels", str(tmp_path)]
    )
    assert rc == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    # The calibration writes its report where it runs (bench.calibrate_gpu exists now); at most 8 files in all.
    assert {"gpu-proof-cpu-proof.json", "gpu-proof-cpu-summary.md"} <= set(files) and len(files) <= 8
    assert set(files) <= {"gpu-proof-cpu-proof.json", "gpu-proof-cpu-summary.md", "gpu-proof-cpu-calibration.md"}
    outcomes = json.loads((tmp_path / "gpu-proof-cpu-proof.json").read_text())
    assert outcomes["env"]["status"] == "ok"
    assert outcomes["oom"]["status"] == "skipped" and "needs the device" in outcomes["oom"]["note"]
    assert outcomes["calibrate"]["status"] in ("missing", "skipped", "ok")
    summary = (tmp_path / "gpu-proof-cpu-summary.md").read_text()
    assert "| oom | skipped |" in summary and "LU_DEVICE=cpu make gpu-proof" in summary


def test_asking_for_the_gpu_without_one_fails_after_running_every_part(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_proof, "gpu_problem", lambda: "no device here")
    rc = gpu_proof.main(["--out", str(tmp_path), "--device", "gpu", "--parts", "env", "oom", "--wheels", str(tmp_path)])
    assert rc == 1
    outcomes = json.loads((tmp_path / "gpu-proof-gpu-proof.json").read_text())
    assert outcomes["env"]["status"] == "failed" and "no device here" in outcomes["env"]["note"]
    assert outcomes["oom"]["status"] == "skipped"  # it still ran (and said why it could not)


@pytest.mark.parametrize(
    "argv", [["--parts", "env"], ["--out", "x", "--parts", "nope"], ["--out", "x", "--device", "tpu"]]
)
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as exc:
        gpu_proof.main(argv)
    assert exc.value.code == 2


def test_a_part_that_times_out_takes_the_processes_it_started_with_it(tmp_path):
    """A benchmark's servers must not outlive its timeout (they would hold the device and its ports)."""
    import os
    import time

    proof = gpu_proof.Proof(tmp_path, "cpu", True, lambda _: None)
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)"
    )
    rc, text = proof.sh("t.log", [sys.executable, "-c", script], timeout=3)
    assert rc == 124 and "timed out" in text
    child = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        pytest.fail("the part's child process outlived its timeout")


@pytest.mark.parametrize("bad", ["0", "-5", "nan", "inf", "ten", ""])
@pytest.mark.parametrize("module", ["bench.core_gpu", "bench.calibrate_gpu", "bench.profile_gpu", "bench.trace_gpu"])
def test_a_time_budget_that_is_not_a_positive_number_of_seconds_is_refused(module, bad, capsys):
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        main(["--out", "", "--seconds", bad])
    assert exc.value.code == 2
    assert "--seconds" in capsys.readouterr().err


def test_the_profile_needs_its_out_folder(capsys):
    from bench import profile_gpu

    with pytest.raises(SystemExit) as exc:
        profile_gpu.main([])
    assert exc.value.code == 2 and "--out" in capsys.readouterr().err


def test_a_positive_time_budget_is_taken():
    from bench import core_gpu

    assert core_gpu.seconds_budget("150") == 150.0 and core_gpu.seconds_budget("0.5") == 0.5


def test_the_device_collects_the_gpu_tests_elsewhere_without_dev_only_packages():
    """The device image lacks schemathesis, jsonschema and the client (an H200 run stopped on them when
    it collected all of tests/): the files chosen collect there, and include the service's gpu tests."""
    files = gpu_proof.gpu_marked_elsewhere()
    assert "tests/service/test_device_memory.py" in files and not any("lu_core/_gpu" in f for f in files)
    blocker = textwrap.dedent(
        """
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"schemathesis", "jsonschema", "lu_client"}:
                    raise ImportError(f"{name} is not on the device")
        sys.meta_path.insert(0, Block())
        import pytest
        sys.exit(pytest.main(["-q", "--collect-only", "-p", "no:cacheprovider", "-m", "gpu", *sys.argv[1:]]))
        """
    )
    done = subprocess.run([sys.executable, "-c", blocker, *files], cwd=gpu_proof.ROOT, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"\d+ tests? collected|\d+/\d+ tests collected", done.stdout), done.stdout[-2000:]


def test_the_transfer_check_reads_unlabelled_gauges_from_metrics():
    """_proof_service._metric, which the 256 MiB transfer checks poll (they run on a device only)."""
    from types import SimpleNamespace

    from bench import _proof_service

    text = (
        "# HELP lu_body_pool_pinned_bytes x\n# TYPE lu_body_pool_pinned_bytes gauge\n"
        "lu_body_pool_pinned_bytes 3.3554432e+08\nlu_body_pool_pinned_bytes_other 1\n"
    )
    http = SimpleNamespace(get=lambda path: SimpleNamespace(text=text if path == "/metrics" else ""))
    assert _proof_service._metric(http, "lu_body_pool_pinned_bytes") == 335544320.0
    assert _proof_service._metric(http, "lu_absent") == 0.0


def test_the_transfer_check_reads_device_seconds_per_stage():
    """_proof_service._device_seconds: each stage's sum for one operation, the other operations left out."""
    from types import SimpleNamespace

    from bench import _proof_service

    text = (
        'lu_device_seconds_sum{operation="lu_solve",stage="upload",device="gpu"} 0.5\n'
        'lu_device_seconds_sum{operation="lu_solve",stage="compute",device="gpu"} 1.25\n'
        'lu_device_seconds_sum{operation="lu_unpack",stage="upload",device="gpu"} 9.0\n'
        'lu_device_seconds_count{operation="lu_solve",stage="upload",device="gpu"} 3.0\n'
    )
    http = SimpleNamespace(get=lambda path: SimpleNamespace(text=text))
    assert _proof_service._device_seconds(http, "lu_solve") == {"upload": 0.5, "compute": 1.25}


def test_a_slow_request_gets_the_servers_stacks_dumped_and_the_service_goes_on():
    """The transfer check's watcher against the real ``python -m service``: SIGUSR1 at each mark past
    which the request is still running writes every thread's stack to the server's log (faulthandler),
    and the service keeps serving; a request answered before the first mark sends nothing."""
    import os
    import time

    import httpx

    from bench import _proof_service

    env = {**os.environ, "LU_DEVICE": "cpu", "PYTHONPATH": str(_proof_service.ROOT)}
    server = _proof_service.Server(env, LU_WARMUP="false")
    try:
        server.wait_ready(120)
        with _proof_service.StacksWhileSlow(server, (0.05, 0.3)) as watch:
            time.sleep(1.0)  # the "request" outlasts both marks
        assert watch.sent == [0.05, 0.3] and "stacks dumped at 0.05 s, 0.3 s" in watch.said()
        deadline = time.monotonic() + 30  # the log is read by a thread
        while "".join(server.lines).count("most recent call first") < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        log = "".join(server.lines)
        assert log.count("Current thread") == 2 and "service/__main__.py" in log, log[-3000:]
        assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200
        with _proof_service.StacksWhileSlow(server, (5.0,)) as quick:
            pass
        assert quick.sent == [] and quick.said() == ""
    finally:
        server.stop()


def test_a_background_part_runs_beside_the_next_parts_and_the_first_part_that_waits_takes_its_outcome(
    tmp_path, monkeypatch
):
    """kernels starts its process and returns at once; tests runs beside it; calibrate (a measurement)
    waits for it first; its output lands in service.log and its outcome (read from its report line,
    whatever follows it) in the summary, with its own time."""
    monkeypatch.delenv("LU_DEVICE", raising=False)
    said = {"seconds": 0.25, "compiled": 3, "loaded": 5, "cache": None, "wall": 1.5}
    code = f"import sys, time; time.sleep(1); print({json.dumps(said)!r}); print('a warning at exit', file=sys.stderr)"
    monkeypatch.setattr(gpu_proof, "KERNELS_CODE", code)
    seen: dict[str, tuple[set[str], set[str]]] = {}

    def recording(name):
        def part(p):
            seen[name] = (set(p.running), set(p.finished))
            return gpu_proof.Outcome("ok", name)

        return part

    for name in ("tests", "calibrate"):
        monkeypatch.setitem(gpu_proof.RUNNERS, name, recording(name))
    argv = ["--out", str(tmp_path), "--device", "cpu", "--parts", "kernels", "tests", "calibrate"]
    assert gpu_proof.main([*argv, "--wheels", str(tmp_path)]) == 0
    assert seen == {"tests": ({"kernels"}, set()), "calibrate": (set(), {"kernels"})}
    outcomes = json.loads((tmp_path / "gpu-proof-cpu-proof.json").read_text())
    assert list(outcomes)[:3] == ["kernels", "tests", "calibrate"]
    assert outcomes["kernels"]["status"] == "ok" and outcomes["kernels"]["seconds"] == 1.5  # its own time
    assert "3 kernel builds compiled, 5 loaded from Numba's cache (beside the sources)" in outcomes["kernels"]["note"]
    log = (tmp_path / "gpu-proof-cpu-service.log").read_text()
    assert "(in the background)" in log and "--- kernels (in the background), its output ---" in log


def test_the_gpu_tests_run_beside_the_kernels_in_a_numba_cache_of_their_own_then_wait(tmp_path, monkeypatch):
    """On a device: the GPU tests' process compiles its CPU oracles into a private Numba cache while
    ``kernels`` compiles into the shared one; the tests marked gpu elsewhere (they start services)
    run only after ``kernels`` ended."""
    proof = gpu_proof.Proof(tmp_path, "gpu", False, lambda _: None)
    proof.start("kernels", "service.log", [sys.executable, "-c", "import time; time.sleep(0.5)"],
                lambda rc, text: gpu_proof.Outcome("ok", "done"))  # fmt: skip
    calls = []

    def sh(what, argv, timeout, env=None):
        calls.append(((env or proof.env).get("NUMBA_CACHE_DIR"), set(proof.running), argv))
        return 0, "= 3 passed in 1.00s ="

    monkeypatch.setattr(proof, "sh", sh)
    monkeypatch.setattr(gpu_proof, "gpu_marked_elsewhere", lambda: ["tests/service/test_x.py"])
    assert gpu_proof.part_tests(proof).status == "ok"
    (own, running1, argv1), (shared, running2, argv2) = calls
    assert "tests/lu_core/_gpu" in argv1 and running1 == {"kernels"}
    assert own and own.startswith(str(proof.scratch)) and own != os.environ.get("NUMBA_CACHE_DIR")
    assert "tests/service/test_x.py" in argv2 and running2 == set() and shared == proof.env.get("NUMBA_CACHE_DIR")
    assert proof.finished["kernels"].status == "ok"
    shutil.rmtree(proof.scratch, ignore_errors=True)


def test_a_background_part_past_its_limit_is_killed_with_what_it_started(tmp_path, monkeypatch):
    from pathlib import Path

    proof = gpu_proof.Proof(tmp_path, "gpu", False, lambda _: None)
    monkeypatch.setitem(gpu_proof.LIMITS, "kernels", 2)
    child = (
        "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    )
    child += "print(c.pid, flush=True); time.sleep(60)"
    proof.start("kernels", "service.log", [sys.executable, "-c", child], gpu_proof._kernels_outcome)
    proof.wait()
    outcome = proof.finished["kernels"]
    assert outcome.status == "failed" and "exit 124" in outcome.note and outcome.seconds < 30
    log = (tmp_path / "gpu-proof-gpu-service.log").read_text()
    assert not proof.running and "[past its 2 s: killed after" in log
    grandchild = int(re.search(r"its output ---\n(\d+)", log).group(1))
    status = Path(f"/proc/{grandchild}/status")
    deadline = time.monotonic() + 10  # the process group went with it: gone, or a zombie not yet reaped
    while status.exists() and "State:\tZ" not in status.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not status.exists() or "State:\tZ" in status.read_text()
