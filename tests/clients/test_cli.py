"""``lu-client`` end to end against a real server on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lu_core
from lu_client._cli import main
from tests.helpers import well_conditioned

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(live_server, monkeypatch):
    monkeypatch.setenv("LU_URL", live_server)
    monkeypatch.setenv("LU_API_KEY", "live-key")
    return main


def test_solve_with_npy_files(cli, tmp_path, rng):
    A = well_conditioned(rng, (3, 5, 5), np.float64)
    B = rng.standard_normal((3, 5, 2))
    np.save(tmp_path / "A.npy", A)
    np.save(tmp_path / "B.npy", B)
    assert cli(["solve", str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), "-o", str(tmp_path / "X.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "X.npy"), lu_core.solve(A, B))
    # Written where -o says, whatever its suffix (NumPy's np.save would have added .npy).
    assert cli(["solve", str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), "-o", str(tmp_path / "X.out")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "X.out"), lu_core.solve(A, B))
    assert not (tmp_path / "X.out.npy").exists()


def test_factor_then_solve_through_an_npz(cli, tmp_path, rng):
    A = well_conditioned(rng, (4, 4), np.complex128)
    np.save(tmp_path / "A.npy", A)
    assert cli(["lu-factor", str(tmp_path / "A.npy"), "-o", str(tmp_path / "f.npz")]) == 0
    with np.load(tmp_path / "f.npz") as f:
        assert set(f.files) == {"LU", "pivots", "info"}
    B = rng.standard_normal((4, 1))
    np.save(tmp_path / "B.npy", B)
    out = tmp_path / "X.npy"
    assert (
        cli(["--json", "lu_solve", str(tmp_path / "f.npz"), str(tmp_path / "B.npy"), "-o", str(out), "--adjoint"]) == 0
    )
    np.testing.assert_allclose(A.conj().T @ np.load(out), B, atol=1e-12)
    assert cli(["lu_unpack", str(tmp_path / "f.npz"), "-o", str(tmp_path / "plu.npz"), "--no-pivots"]) == 0
    with np.load(tmp_path / "plu.npz") as plu:
        assert set(plu.files) == {"L", "U"}


def test_errors_exit_non_zero_with_the_server_message(cli, tmp_path, capsys):
    np.save(tmp_path / "A.npy", np.zeros((2, 2)))
    np.save(tmp_path / "B.npy", np.ones(2))
    assert cli(["solve", str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), "-o", str(tmp_path / "X.npy")]) == 1
    err = capsys.readouterr().err
    assert "422 singular_matrix" in err and "request" in err
    assert not (tmp_path / "X.npy").exists()
    assert cli(["lu", str(tmp_path / "A.npy"), "-o", str(tmp_path / "plu.npy")]) != 0  # three outputs need .npz
    assert cli(["solve", str(tmp_path / "A.npy"), "-o", str(tmp_path / "X.npy")]) == 2
    assert "missing input B" in capsys.readouterr().err
    assert cli(["--api-key", "nope", "lu", str(tmp_path / "A.npy"), "-o", str(tmp_path / "p.npz")]) == 1
    assert "401 unauthorized" in capsys.readouterr().err


def test_big_jobs_are_split_with_a_progress_bar(cli, tmp_path, rng, capsys):
    A = well_conditioned(rng, (3000, 8, 8), np.float64)  # over the test server's 1 MiB and 2^17 elements
    np.save(tmp_path / "A.npy", A)
    np.save(tmp_path / "B.npy", np.ones((3000, 8)))
    args = ["--progress", "solve", str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), "-o", str(tmp_path / "X.npy")]
    assert cli(args) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "X.npy"), lu_core.solve(A, np.ones((3000, 8))))
    err = capsys.readouterr().err
    assert "requests" in err and "[" in err


def test_the_installed_command_runs(live_server, tmp_path):
    exe = Path(sys.executable).with_name("lu-client")
    if not exe.exists():
        pytest.skip("lu-client is not installed in this environment")
    np.save(tmp_path / "A.npy", np.eye(3) * 2)
    env = {**os.environ, "LU_API_KEY": "live-key"}
    done = subprocess.run(
        [str(exe), "--url", live_server, "lu", str(tmp_path / "A.npy"), "-o", str(tmp_path / "plu.npz")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_client_installs_alone():
    """No lu_core, FastAPI, service or CuPy on the import path of lu_client."""
    code = (
        "import sys\n"
        "for m in ('lu_core', 'fastapi', 'service', 'cupy', 'starlette', 'pydantic', 'scipy', 'numba'):\n"
        "    sys.modules[m] = None\n"
        "import lu_client, lu_client._cli\n"
        "print(lu_client.__version__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "clients", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    import tomllib

    deps = tomllib.loads((ROOT / "clients" / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(d.split(">")[0] for d in deps) == ["httpx", "numpy"]


def test_unreadable_input_files_exit_2_without_a_request(cli, tmp_path, capsys):
    (tmp_path / "bad.npy").write_bytes(b"not a numpy file")
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)  # never unpickled
    np.save(tmp_path / "B.npy", np.ones(2))
    for bad in ("bad.npy", "obj.npy", "missing.npy"):
        args = ["solve", str(tmp_path / bad), str(tmp_path / "B.npy"), "-o", str(tmp_path / "X.npy")]
        assert cli(args) == 2, bad
        assert "cannot read input" in capsys.readouterr().err
    assert not (tmp_path / "X.npy").exists()


def test_usage_errors_exit_2_without_a_request(cli, tmp_path, capsys):
    np.save(tmp_path / "A.npy", np.eye(2))
    np.save(tmp_path / "B.npy", np.ones(2))
    a, b, x = (str(tmp_path / n) for n in ("A.npy", "B.npy", "X.npy"))
    assert cli(["solve", a, "-o", x]) == 2  # missing input
    assert "missing input B" in capsys.readouterr().err
    assert cli(["solve", a, b, a, "-o", x]) == 2  # one input too many
    assert "too many input files" in capsys.readouterr().err
    for args in (
        ["solve", a, b],
        ["solve", a, b, "-o", x, "--no-pivot"],
        ["nope", a, "-o", x],
        ["solve", a, b, "-o", x, "--timeout", "soon"],
    ):
        with pytest.raises(SystemExit) as exc:
            cli(args)
        assert exc.value.code == 2, args
    assert not (tmp_path / "X.npy").exists()


def test_bad_options_arrays_names_and_outputs_exit_2_before_any_request(monkeypatch, tmp_path, capsys):
    """A one-line message, exit status 2 and no request (nothing listens at the URL: a request sent would be
    a connection error, exit 1), for what the client refuses before sending; was a traceback, exit 1."""
    monkeypatch.setenv("LU_URL", "http://127.0.0.1:9")
    np.save(tmp_path / "A.npy", np.eye(2))
    np.save(tmp_path / "B.npy", np.ones(2))
    np.save(tmp_path / "S.npy", np.array([["a"]]))
    a, b, s, x = (str(tmp_path / n) for n in ("A.npy", "B.npy", "S.npy", "X.npy"))
    for args, message in (
        (["solve", a, b, "-o", x, "--timeout", "-5"], "timeout must be a positive number of seconds"),
        (["solve", a, b, "-o", x, "--timeout", "nan"], "timeout must be a positive number of seconds"),
        (["solve", a, b, "-o", x, "--retries", "-1"], "max_retries must be an integer >= 0"),
        (["det", s, "-o", x], "cannot send an array of dtype <U1"),
        (["solve", a, b, "-o", str(tmp_path / "missing" / "X.npy")], "cannot write the output"),
        (["solve", a, b, "-o", str(tmp_path)], "cannot write the output"),
        (["factorization", "store", s], "cannot send an array of dtype <U1"),
        (["factorization", "store", a, "--name", ".."], "factorization name '..' is invalid"),
        (["factorization", "show", "."], "factorization name '.' is invalid"),
        (["factorization", "solve", "a/b", b, "-o", x], "factorization name 'a/b' is invalid"),
        (["factorization", "solve", "ok", b, "-o", str(tmp_path / "missing" / "X.npy")], "cannot write the output"),
    ):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1, (args, err)
    assert not (tmp_path / "X.npy").exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_connection_options_go_before_or_after_the_operation(live_server, monkeypatch, tmp_path, rng, where):
    monkeypatch.delenv("LU_URL", raising=False)
    monkeypatch.delenv("LU_API_KEY", raising=False)
    A = well_conditioned(rng, (2, 3, 3), np.float64)
    B = rng.standard_normal((2, 3))
    np.save(tmp_path / "A.npy", A)
    np.save(tmp_path / "B.npy", B)
    common = [
        "--url",
        live_server,
        "--api-key",
        "live-key",
        "--json",
        "--timeout",
        "30",
        "--retries",
        "0",
        "--no-progress",
    ]
    op = ["solve", str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), "-o", str(tmp_path / "X.npy")]
    assert main(common + op if where == "before" else op + common) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "X.npy"), lu_core.solve(A, B))


def test_an_option_given_before_the_operation_is_not_reset_by_it():
    from lu_client._cli import _parser

    args = _parser().parse_args(["--url", "http://a:1", "--retries", "5", "lu", "A.npy", "-o", "o.npz"])
    assert (args.url, args.retries, args.timeout, args.json) == ("http://a:1", 5, 600.0, False)
    args = _parser().parse_args(["--url", "http://a:1", "lu", "A.npy", "-o", "o.npz", "--url", "http://b:2"])
    assert args.url == "http://b:2"  # the later one wins, as usual on a command line
