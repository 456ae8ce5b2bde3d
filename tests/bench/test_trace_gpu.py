"""bench/trace_gpu.py without a GPU: its reading of a profiler trace, its report, its exit without a device."""

from __future__ import annotations

import json

import pytest

from bench import trace_gpu


def _x(cat: str, name: str, ts: float, dur: float, corr: int | None = None) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
    if corr is not None:
        event["args"] = {"correlation": corr}
    return event


# Two calls of lu_core and one of torch: each call's API calls inside its window, the device work they
# launched (matched by correlation id), started after its launch; one kernel of the second call ends late.
EVENTS = [
    _x("user_annotation", "lu_core#1", 1000.0, 100.0),
    _x("user_annotation", "lu_core#0", 0.0, 300.0),
    _x("user_annotation", "torch#0", 500.0, 50.0),
    _x("cuda_driver", "cuLaunchKernel", 10.0, 5.0, corr=1),
    _x("cuda_runtime", "cudaMemcpyAsync", 40.0, 200.0, corr=2),
    _x("cuda_runtime", "cudaLaunchKernel", 250.0, 4.0, corr=3),
    _x("kernel", "check_pivots", 20.0, 3.0, corr=1),
    _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 230.0, 2.0, corr=2),
    _x("kernel", "getrs_kernel", 260.0, 30.0, corr=3),
    _x("cpu_op", "aten::empty", 60.0, 1.0),  # not an API call: left out
    _x("cuda_runtime", "cudaLaunchKernel", 1010.0, 4.0, corr=4),
    _x("kernel", "getrs_kernel", 1020.0, 200.0, corr=4),
    _x("cuda_runtime", "cudaLaunchKernel", 510.0, 3.0, corr=5),
    _x("kernel", "torch_kernel", 515.0, 10.0, corr=5),
]


def test_windows_are_the_contenders_calls_in_call_order():
    assert [w["name"] for w in trace_gpu.windows(EVENTS, "lu_core")] == ["lu_core#0", "lu_core#1"]
    assert [w["name"] for w in trace_gpu.windows(EVENTS, "torch")] == ["torch#0"]
    assert trace_gpu.windows(EVENTS, "lu") == []  # a prefix of a name is not the name


def test_a_call_is_its_window_s_api_calls_and_the_device_work_they_launched():
    first, second = (trace_gpu.summarize(EVENTS, w) for w in trace_gpu.windows(EVENTS, "lu_core"))
    assert first["host us"] == 300.0
    assert first["device busy us"] == 35.0  # 3 + 2 + 30: not the other calls' kernels
    assert first["device end us"] == 290.0
    assert first["api"] == {"cuLaunchKernel": (1, 5.0), "cudaMemcpyAsync": (1, 200.0), "cudaLaunchKernel": (1, 4.0)}
    sides = [(side, start) for side, start, _, _ in first["timeline"]]
    assert sides == [
        ("host", 10.0),
        ("device", 20.0),
        ("host", 40.0),
        ("device", 230.0),
        ("host", 250.0),
        ("device", 260.0),
    ]
    assert second["device end us"] == 220.0  # device work past its window is the call's


def test_the_report_names_each_contender_and_shows_the_median_call():
    traced = {
        "lu_core": [trace_gpu.summarize(EVENTS, w) for w in trace_gpu.windows(EVENTS, "lu_core")],
        "torch": [trace_gpu.summarize(EVENTS, w) for w in trace_gpu.windows(EVENTS, "torch")],
        "cupyx": [],
    }
    text = "\n".join(trace_gpu.case_report("lu_solve 1x128 float64", traced))
    assert "## lu_solve 1x128 float64" in text
    assert (
        "| lu_core | 2 | 200.0 | 117.5 | 255.0 | cudaMemcpyAsync 1, 200.0; cuLaunchKernel 1, 5.0; cudaLaunchKernel 1, 4.0 |"
        in text
    )
    assert "| torch | 1 | 50.0 | 10.0 | 25.0 | cudaLaunchKernel 1, 3.0 |" in text
    assert "| cupyx | 0 |" in text
    assert "getrs_kernel" in text and "torch_kernel" in text


def test_annotations_are_read_from_a_real_profiler_trace(tmp_path):
    """The window's category and name as torch.profiler writes them (on the CPU here)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(2):
            with record_function(f"lu_core#{i}"):
                torch.ones(4).sum()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    found = trace_gpu.windows(events, "lu_core")
    assert [w["name"] for w in found] == ["lu_core#0", "lu_core#1"]
    assert all(trace_gpu.summarize(events, w)["host us"] > 0 for w in found)


@pytest.mark.parametrize("argv", [[], ["--out"], ["--seconds", "10"], ["--out", "x", "--cases", "1"]])
def test_a_malformed_command_line_is_refused_with_usage(argv, capsys):
    """A missing or valueless ``--out`` and an unknown option: exit 2 and argparse's message, nothing traced
    (bad ``--seconds`` values: ``test_gpu_proof.py``'s budget test)."""
    with pytest.raises(SystemExit) as exc:
        trace_gpu.main(argv)
    assert exc.value.code == 2
    assert "usage: python -m bench.trace_gpu" in capsys.readouterr().err


def test_without_a_device_it_says_so_and_exits_0(tmp_path, capsys):
    if trace_gpu.available() is None:
        pytest.skip("a GPU is visible")
    assert trace_gpu.main(["--out", str(tmp_path)]) == 0
    assert "nothing to trace" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
