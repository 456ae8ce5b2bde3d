"""The benchmark command runs end to end (quick grids): reports and plots are written, GPU skips cleanly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import __main__ as bench_main
from bench import core_gpu


@pytest.mark.slow
def test_quick_cpu_and_service_suites_write_reports_and_plots(tmp_path, capsys):
    assert bench_main.main(["--suite", "core-cpu", "core-gpu", "service", "--quick", "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.endswith("-cpu-quick.md") for n in names)
    assert any(n.endswith("-cpu-quick-time.png") for n in names) and any(
        n.endswith("-cpu-quick-ratio.png") for n in names
    )
    assert any("-service-" in n for n in names)
    # The service report (…-service-cpu-quick.md) ends the same way: pick the core-cpu one.
    report = next(
        p for p in tmp_path.iterdir() if p.name.endswith("-cpu-quick.md") and "-service-" not in p.name
    ).read_text()
    service = next(p for p in tmp_path.iterdir() if "-service-" in p.name).read_text()
    assert "## Stored factorizations" in service and "| 128 | 10 |" in service
    assert "## Receiving a 128 MiB binary request" in service and "| plain loopback copy |" in service
    assert "| service, no buffer pool (LU_BODY_POOL_BYTES=0) |" in service
    assert "| bare ASGI app | 16 |" in service and "| service | 16 |" in service
    inline = next(line for line in service.splitlines() if line.startswith("| bare app computing inline | 16 |"))
    assert inline.endswith("| 0 |")  # every answer a 200: the inline app really solved the requests
    for op in ("lu_factor", "lu_unpack", "lu_solve", "solve"):
        assert f"| {op} | float32 |" in report and f"| {op} | float64 |" in report
    assert "vs scipy" in report and "## Machine" in report
    err = capsys.readouterr().err
    assert "[core-cpu" in err and "1/" in err  # progress
    if core_gpu.available() is not None:
        assert "[core-gpu" in err and "skipped" in err


@pytest.mark.slow
def test_quick_batching_and_hostile_suites_write_reports(tmp_path):
    assert bench_main.main(["--suite", "batching", "hostile", "--quick", "--out", str(tmp_path)]) == 0
    batching = next(tmp_path.glob("*-batching-cpu-quick.md")).read_text()
    assert "| 8 | 8 | on |" in batching and "| 8 | 8 | off |" in batching
    hostile = next(tmp_path.glob("*-hostile-cpu-quick.md")).read_text()
    assert "peak RSS MiB" in hostile and "| 20 | 50 |" in hostile


def test_autodiff_bench_quick_runs(capsys):
    from bench import autodiff_cpu

    assert autodiff_cpu.main(["--quick"]) == 0
    out = capsys.readouterr()
    assert "| lu_solve | 1000 x 8 |" in out.out or "PyTorch is not installed" in out.err


def test_combine_writes_one_report_with_every_runs_ratio(tmp_path):
    from bench import core_cpu

    def row(op, ours, torch, jax):
        return {
            "op": op,
            "dtype": "float64",
            "batch": 1,
            "n": 8,
            "ours": ours,
            "spread": 0.1,
            "torch": torch,
            "jax": jax,
        }

    for name, ratio in (("a", 1.0), ("b", 2.0)):
        runs = [[row("lu_factor", ratio * 1e-5, 1e-5, 2e-5), row("solve", 3e-5, 4e-5, 1e-5)]]
        (tmp_path / f"{name}.json").write_text(json.dumps({"facts": {"cpu": "test"}, "command": "c", "runs": runs}))
    out = tmp_path / "out"
    core_cpu.combine([tmp_path / "a.json", tmp_path / "b.json"], out, lambda m: None)
    (report,) = out.glob("*-cpu.md")
    text = report.read_text()
    assert "ours/best run 2" in text
    assert "| lu_factor | float64 | 1 | 8 | 0.010 ms | ±5% | torch | **1.00×** | 2.00× (torch) |" in text
    assert "| solve | float64 | 1 | 8 | 0.030 ms | ±5% | jax | **3.00×** | 3.00× (jax) |" in text
    assert "| 2 | 2 | 2.50× | 3.00× (solve float64 1×8) | 0 | 0 |" in text  # run 2: median and worst


def test_the_report_summarises_the_first_calls_after_each_pause_where_the_runs_recorded_them():
    from bench import core_cpu

    def row(op, ours, torch, cold_ours=None):
        r = {"op": op, "dtype": "float64", "batch": 1, "n": 8, "ours": ours, "spread": 0.1, "torch": torch}
        if cold_ours is not None:
            r["cold"] = {"ours": cold_ours, "torch": 2 * torch}
        return r

    cold = core_cpu.render([[row("lu_factor", 1e-5, 1e-5, 6e-5), row("solve", 1e-5, 2e-5, 2e-5)]], {}, "c")
    assert "each block's first 3 calls" in cold
    assert "| 1 | 2 | 1.75× | 3.00× (lu_factor float64 1×8) | 1 | 1 |" in cold  # 60/20 and 20/40 us
    assert "| 1 | 2 | 0.75× | 1.00× (lu_factor float64 1×8) | 2 | 2 |" in cold  # the steady medians' summary
    older = core_cpu.render([[row("lu_factor", 1e-5, 1e-5), row("solve", 1e-5, 2e-5)]], {}, "c")
    assert "first 3 calls" not in older  # reports from before the runs recorded them


def test_the_batching_command_line_refuses_unknown_arguments(capsys):
    from bench import batching

    with pytest.raises(SystemExit) as exc:
        batching.main(["--proof", "--clients", "64"])
    assert exc.value.code == 2 and "unrecognized arguments: --clients 64" in capsys.readouterr().err


def test_a_streamed_body_goes_in_views_of_at_most_a_mebibyte_with_its_length():
    """httpx re-slices one big ``bytes`` body after every partial send (quadratic: 4.7 s for 256 MiB);
    the benchmarks send views instead, with the Content-Length the service's receive path needs."""
    from bench.service import streamed

    body = bytes(range(256)) * 10_000  # 2.56 MB
    kwargs = streamed(body, {"content-type": "application/octet-stream"})
    chunks = list(kwargs["content"])
    assert b"".join(chunks) == body and max(len(c) for c in chunks) == 1 << 20 and len(chunks) == 3
    assert kwargs["headers"] == {"content-type": "application/octet-stream", "content-length": str(len(body))}
    empty = streamed(b"", {})
    assert list(empty["content"]) == [] and empty["headers"] == {"content-length": "0"}


@pytest.mark.slow
def test_a_gpu_service_is_measured_beside_the_same_service_on_the_cpu():
    """Issue 20's goal (8x8 /solve at 16 clients: the GPU service at least the CPU service's rate on the same
    host) needs both in one run: where the service's device is not the CPU, the bare-app comparison adds the
    service started with LU_DEVICE=cpu. Driven here with a CPU service standing in for the GPU one."""
    from bench import service as bench_service

    proc, url = bench_service.start_server(LU_DEVICE="cpu")
    try:
        rows = bench_service._bare_part(url, "gpu", True, lambda m: None)
        alone = bench_service._bare_part(url, "cpu", True, lambda m: None)
    finally:
        bench_service.stop_servers([(proc, url)])
    servers = {r["server"]: r for r in rows}
    assert set(servers) == {"service", bench_service.BARE, bench_service.INLINE, bench_service.ON_CPU}
    assert servers[bench_service.ON_CPU]["non-200"] == 0 and servers[bench_service.ON_CPU]["req/s"] > 0
    assert bench_service.ON_CPU not in {r["server"] for r in alone}
    text = bench_service.report([], [], [], [], "gpu", [], rows)
    assert f"| {bench_service.ON_CPU} | 16 |" in text and "the same service on the CPU of the same host" in text


def test_a_server_asked_for_the_cpu_gets_it_whatever_the_environment_says(monkeypatch):
    """On the device the proof runs with LU_DEVICE=gpu in its environment: the comparison's CPU service must
    still start on the CPU (``_bare_part`` also checks its /readyz), and the others inherit the device."""
    from bench.service import server_env

    monkeypatch.setenv("LU_DEVICE", "gpu")
    assert server_env(1, False, {"LU_DEVICE": "cpu"})["LU_DEVICE"] == "cpu"
    assert server_env(1, False, {})["LU_DEVICE"] == "gpu"
    monkeypatch.delenv("LU_DEVICE")
    monkeypatch.delenv("LU_MAX_REQUEST_BYTES", raising=False)
    env = server_env(8000, True, {})
    assert env["LU_DEVICE"] == "auto" and env["LU_PORT"] == "8000" and "LU_MAX_REQUEST_BYTES" not in env


def test_the_big_grpc_case_fits_the_largest_message_the_server_takes():
    # On a 24 GiB machine the default LU_MAX_INFLIGHT_BYTES lets grpcio take ~126 MiB: the full service suite's
    # 256 MiB lu_unpack was refused RESOURCE_EXHAUSTED and the suite stopped before writing its report.
    from bench.service import GRPC_MATRIX_BYTES, _grpc_request, grpc_payload_bytes, server_env, server_settings
    from service.grpc_server import max_message_bytes

    for extra in ({}, {"LU_MAX_INFLIGHT_BYTES": str(256 << 20)}, {"LU_MAX_INFLIGHT_BYTES": str(64 << 30)}):
        env = server_env(1, False, extra)
        nbytes = grpc_payload_bytes(256 << 20, env)
        largest = max_message_bytes(server_settings(env))
        assert 0 < nbytes <= 256 << 20
        n = 64
        batch = nbytes // GRPC_MATRIX_BYTES  # as grpc_vs_http builds it
        LU = np.zeros((batch, n, n))
        piv = np.ones((batch, n), dtype=np.int32)
        assert _grpc_request("lu_unpack", {"LU": LU, "pivots": piv}).ByteSize() <= largest
    assert grpc_payload_bytes(256 << 20, server_env(1, False, {"LU_MAX_INFLIGHT_BYTES": str(64 << 30)})) == 256 << 20


def test_the_big_grpc_case_refuses_budgets_it_cannot_use():
    import pydantic

    from bench.service import grpc_payload_bytes, server_env

    # Too small for one matrix: a clear error, not an empty case whose checks pass on nothing.
    tiny = server_env(1, False, {"LU_MAX_INFLIGHT_BYTES": str(1 << 20), "LU_MAX_REQUEST_BYTES": "1000"})
    with pytest.raises(ValueError, match="LU_MAX_INFLIGHT_BYTES"):
        grpc_payload_bytes(256 << 20, tiny)
    for bad in ("lots", "-1", "1e400"):  # malformed or out of range: the service's own settings refuse it
        with pytest.raises(pydantic.ValidationError):
            grpc_payload_bytes(256 << 20, server_env(1, False, {"LU_MAX_INFLIGHT_BYTES": bad}))
