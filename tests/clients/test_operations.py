"""Every client method, sync and async, binary and JSON, all dtypes, against lu_core called directly."""

from __future__ import annotations

import numpy as np
import pytest

import lu_client
import lu_core
from lu_client import LUClient, RetryPolicy
from tests.helpers import DTYPES, well_conditioned

pytestmark = pytest.mark.anyio


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


async def run_all(client, call, rng, dtype):
    """The same checks for both twins; ``call`` awaits when the client is async."""
    A = well_conditioned(rng, (3, 5, 5), dtype)
    LU, piv = await call(client.lu_factor(A))
    want_LU, want_piv = lu_core.lu_factor(A)
    same(LU, want_LU)
    same(piv, want_piv)
    assert LU.flags.writeable  # results are the caller's to modify
    _, _, info = await call(client.lu_factor_ex(np.zeros((2, 3, 3), dtype)))
    same(info, np.ones(2, np.int32))
    for unpack in ((True, True), (False, True), (True, False)):
        got = await call(client.lu_unpack(LU, piv, *unpack))
        for g, w in zip(got, lu_core.lu_unpack(want_LU, want_piv, *unpack), strict=True):
            assert (g is None) == (w is None)
            if w is not None:
                same(g, w)
    B = rng.standard_normal((2, 1, 5, 2)).astype(dtype)
    same(await call(client.lu_solve(LU, piv, B, adjoint=True)), lu_core.lu_solve(want_LU, want_piv, B, adjoint=True))
    Bt = B.swapaxes(-1, -2).copy()
    same(await call(client.lu_solve(LU, piv, Bt, left=False)), lu_core.lu_solve(want_LU, want_piv, Bt, left=False))
    for got, want in zip(await call(client.lu(A)), lu_core.lu(A), strict=True):
        same(got, want)
    same(await call(client.solve(A, B)), lu_core.solve(A, B))
    v = rng.standard_normal(5).astype(dtype)
    same(await call(client.solve(A, v)), lu_core.solve(A, v))
    same(await call(client.solve(A, v[None], left=False)), lu_core.solve(A, v[None], left=False))
    with pytest.raises(ValueError, match="^B: .* batch of vectors .* left=False"):  # as lu_core and torch refuse it
        await call(client.solve(A, v, left=False))
    same(await call(client.solve(A[0], v)), lu_core.solve(A[0], v))


async def _await(x):
    return await x


async def _value(x):
    return x


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("dtype", DTYPES)
async def test_sync_client(make_sync_client, rng, binary, dtype):
    client = make_sync_client({"binary": binary})
    await run_all(client, _value, rng, dtype)
    media = {r.headers["content-type"] for r in client.transport.requests}
    assert media == {"application/octet-stream" if binary else "application/json"}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("dtype", DTYPES)
async def test_async_client(make_async_client, rng, binary, dtype):
    client = await make_async_client({"binary": binary})
    await run_all(client, _await, rng, dtype)


async def test_singular_and_invalid_input_raise_typed_errors(make_async_client):
    client = await make_async_client()
    A = np.stack([np.eye(2), np.zeros((2, 2))])
    with pytest.raises(lu_client.SingularMatrixError) as excinfo:
        await client.solve(A, np.ones((2, 2, 1)))
    assert excinfo.value.indices == [(1,)] and excinfo.value.status_code == 422
    assert excinfo.value.request_id and excinfo.value.code == "singular_matrix"
    with pytest.raises(lu_client.SingularMatrixError) as excinfo:
        await client.lu_factor(A)  # like lu_core.lu_factor, raised from info
    assert excinfo.value.indices == [(1,)]
    with pytest.raises(lu_client.UnprocessableEntityError, match="invalid_pivots"):
        await client.lu_unpack(np.eye(2), np.array([0, 2]))
    with pytest.raises(lu_client.UnprocessableEntityError, match="invalid_shape"):
        await client.solve(np.ones((2, 3)), np.ones(2))
    with np.errstate(all="ignore"):
        X = await client.solve(A, np.ones((2, 2, 1)), check_errors=False)
    assert not np.isfinite(X[1]).all()


def test_real_server_on_loopback(live_server, rng):
    A = well_conditioned(rng, (4, 6, 6), np.float64)
    with lu_client.LUClient(live_server, api_key="live-key") as client:
        same(client.solve(A, np.ones((4, 6))), lu_core.solve(A, np.ones((4, 6))))
    with lu_client.LUClient(live_server, api_key="wrong") as client, pytest.raises(lu_client.AuthenticationError):
        client.solve(A, np.ones((4, 6)))


async def test_async_real_server_on_loopback(live_server, rng):
    A = well_conditioned(rng, (4, 6, 6), np.complex64)
    async with lu_client.AsyncLUClient(live_server, api_key="live-key", binary=False) as client:
        LU, _ = await client.lu_factor(A)
    same(LU, lu_core.lu_factor(A)[0])


def test_torch_tensors_are_accepted(make_sync_client, rng):
    torch = pytest.importorskip("torch")
    client = make_sync_client()
    A = torch.from_numpy(well_conditioned(rng, (2, 4, 4), np.complex128))
    B = torch.ones(2, 4, 1, dtype=torch.complex128)
    X = client.solve(A.conj(), B)  # a lazily conjugated view: resolved before sending
    same(X, lu_core.solve(A.conj().resolve_conj().numpy(), B.numpy()))
    LU, piv = client.lu_factor(torch.eye(3, requires_grad=True))
    assert isinstance(LU, np.ndarray) and piv.dtype == np.int32


def test_array_likes_and_bad_inputs(make_sync_client):
    client = make_sync_client()

    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return np.eye(2) * 2

    same(client.solve(ArrayLike(), [1.0, 1.0]), np.array([0.5, 0.5]))
    with pytest.raises(TypeError, match="cannot send"):
        client.solve(np.array([["a", "b"], ["c", "d"]]), [1.0, 1.0])
    with pytest.raises(ValueError, match=r"^A: not an array of numbers"):  # ragged: NumPy's message named nothing
        client.solve([[1.0, 2.0], [3.0]], [1.0, 1.0])
    for bad in (-1, 0, float("nan"), float("inf"), "10", True):
        with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
            LUClient("http://lu.test", timeout=bad)
        with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
            client.det(np.eye(2), timeout=bad)
    for bad in (-1, 1.5, None, True):
        with pytest.raises(ValueError, match="max_retries must be an integer >= 0"):
            LUClient("http://lu.test", max_retries=bad)
    with pytest.raises(ValueError, match="max_delay must be a finite number of seconds"):
        RetryPolicy(max_delay=float("nan"))
