"""solve_refined, lu_rcond, slogdet and det from both client twins (in-process and on loopback) and the CLI."""

from __future__ import annotations

import numpy as np
import pytest

import lu_client
import lu_core
from lu_client._cli import main
from tests.helpers import DTYPES, well_conditioned

pytestmark = pytest.mark.anyio


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


async def run_all(client, call, rng, dtype):
    A = well_conditioned(rng, (3, 6, 6), dtype)
    B = rng.standard_normal((3, 6, 2)).astype(dtype)
    X, it, berr = await call(client.solve_refined(A, B, max_iter=12))
    for got, want in zip((X, it, berr), lu_core.solve_refined(A, B, max_iter=12), strict=True):
        same(got, want)
    v = rng.standard_normal(6).astype(dtype)
    same((await call(client.solve_refined(A[0], v)))[0], lu_core.solve_refined(A[0], v).X)
    row = v[None]  # with left=False a vector is refused (as by torch.linalg.solve): a (1, n) matrix instead
    same((await call(client.solve_refined(A, row, left=False)))[0], lu_core.solve_refined(A, row, left=False).X)
    with pytest.raises(ValueError, match="^B: .* batch of vectors .* left=False"):  # refused before any request
        await call(client.solve_refined(A, v, left=False))
    LU, piv = lu_core.lu_factor(A)
    anorm = np.abs(A).sum(axis=-2).max(axis=-1).real
    same(await call(client.lu_rcond(LU, piv, anorm)), lu_core.lu_rcond(LU, piv, anorm))
    same(await call(client.lu_rcond(LU[0], piv[0], 2.0, norm="inf")), lu_core.lu_rcond(LU[0], piv[0], 2.0, norm="inf"))
    sign, logabsdet = await call(client.slogdet(A))
    same(sign, lu_core.slogdet(A).sign)
    same(logabsdet, lu_core.slogdet(A).logabsdet)
    same(await call(client.det(A)), lu_core.det(A))


async def _await(x):
    return await x


async def _value(x):
    return x


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("dtype", DTYPES)
async def test_sync_client(make_sync_client, rng, binary, dtype):
    await run_all(make_sync_client({"binary": binary}), _value, rng, dtype)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("dtype", DTYPES)
async def test_async_client(make_async_client, rng, binary, dtype):
    await run_all(await make_async_client({"binary": binary}), _await, rng, dtype)


async def test_typed_errors(make_async_client):
    client = await make_async_client()
    with pytest.raises(lu_client.UnprocessableEntityError) as excinfo:
        await client.solve_refined(np.eye(2), np.ones(2), factor_dtype="float16")
    assert excinfo.value.code == "unsupported_factor_dtype" and excinfo.value.request_id
    with pytest.raises(lu_client.UnprocessableEntityError) as excinfo:
        await client.solve_refined(np.eye(2), np.ones(2), max_iter=-3)
    assert excinfo.value.code == "invalid_option"
    with pytest.raises(lu_client.SingularMatrixError) as excinfo:
        await client.solve_refined(np.stack([np.eye(2), np.zeros((2, 2))]), np.ones((2, 2)))
    assert excinfo.value.indices == [(1,)]
    with pytest.raises(lu_client.UnprocessableEntityError) as excinfo:
        await client.lu_rcond(np.eye(2), np.array([1, 3]), 1.0)
    assert excinfo.value.code == "invalid_pivots"
    with pytest.raises(lu_client.UnprocessableEntityError) as excinfo:
        await client.lu_rcond(np.eye(2), np.array([1, 2]), 1.0, norm="fro")
    assert excinfo.value.code == "invalid_option"
    with pytest.raises(lu_client.UnprocessableEntityError) as excinfo:
        await client.det(np.ones((2, 3)))
    assert excinfo.value.code == "invalid_shape"


def test_real_server_on_loopback_splits_big_batches(live_server, rng):
    # 1600 matrices of 8x8 are over the live server's 2^17 elements: the client splits and stitches.
    A = well_conditioned(rng, (1600, 8, 8), np.float64)
    B = rng.standard_normal((1600, 8, 1))
    with lu_client.LUClient(live_server, api_key="live-key") as client:
        X, it, berr = client.solve_refined(A, B)
        sign, logabsdet = client.slogdet(A)
        det = client.det(A)
        LU, piv = lu_core.lu_factor(A)
        rcond = client.lu_rcond(LU, piv, np.abs(A).sum(axis=-2).max(axis=-1))
    for got, want in zip((X, it, berr), lu_core.solve_refined(A, B), strict=True):
        same(got, want)
    same(sign, lu_core.slogdet(A).sign)
    same(logabsdet, lu_core.slogdet(A).logabsdet)
    same(det, lu_core.det(A))
    same(rcond, lu_core.lu_rcond(LU, piv, np.abs(A).sum(axis=-2).max(axis=-1)))


async def test_async_real_server_on_loopback(live_server, rng):
    A = well_conditioned(rng, (4, 5, 5), np.complex128)
    async with lu_client.AsyncLUClient(live_server, api_key="live-key", binary=False) as client:
        X, _, _ = await client.solve_refined(A, np.ones((4, 5)), factor_dtype="complex64")
        d = await client.det(A)
    same(X, lu_core.solve_refined(A, np.ones((4, 5)), factor_dtype="complex64").X)
    same(d, lu_core.det(A))


@pytest.fixture
def cli(live_server, monkeypatch):
    monkeypatch.setenv("LU_URL", live_server)
    monkeypatch.setenv("LU_API_KEY", "live-key")
    return main


def test_cli_subcommands(cli, tmp_path, rng):
    A = well_conditioned(rng, (3, 5, 5), np.float64)
    B = rng.standard_normal((3, 5, 1))
    np.save(tmp_path / "A.npy", A)
    np.save(tmp_path / "B.npy", B)
    out = tmp_path / "r.npz"
    assert (
        cli(["solve_refined", str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), "-o", str(out), "--max-iter", "7"]) == 0
    )
    with np.load(out) as f:
        assert set(f.files) == {"X", "iterations", "backward_error"}
        same(f["X"], lu_core.solve_refined(A, B, max_iter=7).X)
    assert cli(["lu_factor", str(tmp_path / "A.npy"), "-o", str(tmp_path / "f.npz")]) == 0
    anorm = np.abs(A).sum(axis=-1).max(axis=-1)
    np.save(tmp_path / "anorm.npy", anorm)
    rc = tmp_path / "rc.npy"
    assert cli(["lu-rcond", str(tmp_path / "f.npz"), str(tmp_path / "anorm.npy"), "-o", str(rc), "--norm", "inf"]) == 0
    LU, piv = lu_core.lu_factor(A)
    same(np.load(rc), lu_core.lu_rcond(LU, piv, anorm, norm="inf"))
    assert cli(["slogdet", str(tmp_path / "A.npy"), "-o", str(tmp_path / "s.npz")]) == 0
    with np.load(tmp_path / "s.npz") as f:
        same(f["sign"], lu_core.slogdet(A).sign)
    assert cli(["det", str(tmp_path / "A.npy"), "-o", str(tmp_path / "d.npy")]) == 0
    same(np.load(tmp_path / "d.npy"), lu_core.det(A))
    # One output file for three outputs is a usage error; a bad factor_dtype is the server's 422.
    assert cli(["solve_refined", str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), "-o", str(tmp_path / "x.npy")]) == 2
    bad = ["solve_refined", str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), "-o", str(out), "--factor-dtype", "tf32"]
    assert cli(bad) == 1
