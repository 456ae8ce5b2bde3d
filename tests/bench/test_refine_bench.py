"""The refine suites run end to end in quick mode: the CPU report has every case, the GPU suite skips cleanly."""

from __future__ import annotations

from bench import __main__ as bench_main
from bench import core_gpu


def test_refine_suites_quick(tmp_path, capsys):
    assert bench_main.main(["--suite", "refine-cpu", "refine-gpu", "--quick", "--out", str(tmp_path)]) == 0
    (report,) = [p for p in tmp_path.iterdir() if p.name.endswith("-refine-cpu-quick.md")]
    text = report.read_text()
    for needle in ("solve_refined | scipy.linalg.solve", "solve_refined | lu_core.solve", "lu_rcond | lu_factor"):
        assert needle in text
    assert "## Machine" in text
    err = capsys.readouterr().err
    if core_gpu.available() is not None:
        assert "[refine-gpu" in err and "skipped" in err
