"""/solve_refined, /lu_rcond, /slogdet, /det (native and /v2, JSON and binary) against lu_core called directly,
and every error path with malformed, mismatched, out-of-range, oversized and non-finite input."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from tests.helpers import DTYPES, well_conditioned
from tests.service.test_endpoints import FORMATS, call, expect_equal

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
async def test_solve_refined(client, rng, fmt, dtype):
    A = well_conditioned(rng, (2, 1, 6, 6), dtype)
    B = rng.standard_normal((3, 6, 2)).astype(dtype)
    out = await call(client, "solve_refined", fmt, {"A": A, "B": B}, {"max_iter": 10})
    X, it, berr = lu_core.solve_refined(A, B, max_iter=10)
    expect_equal(out["X"], X)
    expect_equal(out["iterations"], it)
    expect_equal(out["backward_error"], berr)
    out = await call(client, "solve_refined", fmt, {"A": A, "B": B.swapaxes(-1, -2)}, {"left": False})
    expect_equal(out["X"], lu_core.solve_refined(A, B.swapaxes(-1, -2), left=False).X)


@pytest.mark.parametrize("fmt", FORMATS)
async def test_solve_refined_falls_back_for_ill_conditioned_systems(client, rng, fmt):
    from tests.lu_core.test_refine import conditioned

    A = np.stack([conditioned(rng, 24, 1e3), conditioned(rng, 24, 1e13)])
    B = rng.standard_normal((2, 24, 1))
    out = await call(client, "solve_refined", fmt, {"A": A, "B": B}, {"factor_dtype": "float32"})
    assert out["iterations"][0] > 0 and out["iterations"][1] == -1
    expect_equal(out["X"], lu_core.solve_refined(A, B).X)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", ["1", "inf"])
async def test_lu_rcond(client, rng, fmt, dtype, norm):
    A = well_conditioned(rng, (3, 5, 5), dtype)
    LU, piv = lu_core.lu_factor(A)
    anorm = np.abs(A).sum(axis=-2 if norm == "1" else -1).max(axis=-1).real.astype(np.float64)
    out = await call(client, "lu_rcond", fmt, {"LU": LU, "pivots": piv, "anorm": anorm}, {"norm": norm})
    expect_equal(out["rcond"], lu_core.lu_rcond(LU, piv, anorm, norm=norm))
    one = await call(client, "lu_rcond", fmt, {"LU": LU, "pivots": piv, "anorm": anorm[:1]})  # broadcast
    expect_equal(one["rcond"], lu_core.lu_rcond(LU, piv, anorm[0]))


async def test_lu_rcond_scalar_anorm_as_a_json_number(client, rng):
    A = well_conditioned(rng, (2, 4, 4), np.float64)
    LU, piv = lu_core.lu_factor(A)
    r = await client.post("/lu_rcond", json={"LU": LU.tolist(), "pivots": piv.tolist(), "anorm": 3.5})
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(r.json()["rcond"]["data"], lu_core.lu_rcond(LU, piv, 3.5))
    for spelled, value in (("Infinity", np.inf), ("NaN", np.nan)):  # a scalar in the non-finite spellings
        r = await client.post("/lu_rcond", json={"LU": LU.tolist(), "pivots": piv.tolist(), "anorm": spelled})
        assert r.status_code == 200, r.text
        got = np.array([np.nan if v == "NaN" else v for v in r.json()["rcond"]["data"]], dtype=np.float64)
        np.testing.assert_array_equal(got, lu_core.lu_rcond(LU, piv, value))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
async def test_slogdet_and_det(client, rng, fmt, dtype):
    A = well_conditioned(rng, (2, 3, 4, 4), dtype)
    A[1, 1] = 0  # singular: sign 0, logabsdet -inf, never an error
    out = await call(client, "slogdet", fmt, {"A": A})
    sign, logabsdet = lu_core.slogdet(A)
    expect_equal(out["sign"], sign)
    expect_equal(out["logabsdet"], logabsdet)
    assert np.isneginf(out["logabsdet"][1, 1])
    out = await call(client, "det", fmt, {"A": A})
    expect_equal(out["det"], lu_core.det(A))
    out = await call(client, "det", fmt, {"A": np.ones((0, 0), dtype)})
    expect_equal(out["det"], lu_core.det(np.ones((0, 0), dtype)))


async def test_v2_metadata_lists_the_new_models(client):
    for op, params in [("solve_refined", {"left", "factor_dtype", "max_iter"}), ("lu_rcond", {"norm"})]:
        r = await client.get(f"/v2/models/{op}")
        assert r.status_code == 200 and params <= set(r.json()["parameters"])
        assert r.json()["parameters"]["batch_dimensions"]
    for op in ("slogdet", "det"):
        assert (await client.get(f"/v2/models/{op}")).status_code == 200
    doc = (await client.get("/openapi.json")).json()
    assert {"/solve_refined", "/lu_rcond", "/slogdet", "/det"} <= set(doc["paths"])


A2 = [[4.0, 1.0], [2.0, 3.0]]
DEEP: list = [1.0]
for _ in range(80):  # deeper than any array NumPy can make
    DEEP = [DEEP]
LU2 = {"LU": [[4.0, 1.0], [0.5, 2.5]], "pivots": [1, 2]}


@pytest.mark.parametrize(
    ("op", "body", "status", "code"),
    [
        ("solve_refined", {"A": A2, "B": [1, 2], "factor_dtype": "float16"}, 422, "unsupported_factor_dtype"),
        ("solve_refined", {"A": A2, "B": [1, 2], "factor_dtype": "tf32"}, 422, "unsupported_factor_dtype"),
        ("solve_refined", {"A": A2, "B": [1, 2], "factor_dtype": "int8"}, 422, "unsupported_factor_dtype"),
        ("solve_refined", {"A": A2, "B": [1, 2], "factor_dtype": "complex64"}, 422, "unsupported_factor_dtype"),
        ("solve_refined", {"A": A2, "B": [1, 2], "factor_dtype": 32}, 422, "invalid_option"),
        ("solve_refined", {"A": A2, "B": [1, 2], "factor_dtype": ["float32"]}, 422, "invalid_option"),
        ("solve_refined", {"A": A2, "B": [1, 2], "max_iter": -1}, 422, "invalid_option"),
        ("solve_refined", {"A": A2, "B": [1, 2], "max_iter": 1001}, 422, "invalid_option"),
        ("solve_refined", {"A": A2, "B": [1, 2], "max_iter": 2.5}, 422, "invalid_option"),
        ("solve_refined", {"A": A2, "B": [1, 2], "max_iter": True}, 422, "invalid_option"),
        ("solve_refined", {"A": A2, "B": [1, 2], "max_iter": "3"}, 422, "invalid_option"),
        ("solve_refined", {"A": A2, "B": [1, 2], "left": "yes"}, 422, "invalid_option"),
        ("solve_refined", {"A": A2, "B": [1, 2], "check_errors": True}, 422, "unknown_option"),
        ("solve_refined", {"A": A2, "B": [1, 2, 3]}, 422, "invalid_shape"),
        ("solve_refined", {"A": [[1, 2, 3], [4, 5, 6]], "B": [1, 2]}, 422, "invalid_shape"),
        ("solve_refined", {"A": [[1, 2], [2, 4]], "B": [1, 2]}, 422, "singular_matrix"),
        ("solve_refined", {"A": A2}, 422, "missing_input"),
        ("solve_refined", {"A": [[1, 2], [3]], "B": [1, 2]}, 400, "malformed_tensor"),
        ("solve_refined", {"A": [["x", 2], [3, 4]], "B": [1, 2]}, 400, "malformed_tensor"),
        ("lu_rcond", {**LU2, "anorm": 1.0, "norm": "2"}, 422, "invalid_option"),
        ("lu_rcond", {**LU2, "anorm": 1.0, "norm": 1}, 422, "invalid_option"),
        ("lu_rcond", {**LU2, "anorm": -1.0}, 422, "invalid_input"),
        ("lu_rcond", {**LU2, "anorm": [1.0, 2.0, 3.0]}, 422, "invalid_shape"),
        ("lu_rcond", {**LU2, "anorm": {"dtype": "complex128", "data": [1, 0]}}, 422, "invalid_dtype"),
        ("lu_rcond", {"LU": LU2["LU"], "pivots": [1, 3], "anorm": 1.0}, 422, "invalid_pivots"),
        ("lu_rcond", {"LU": LU2["LU"], "pivots": [1], "anorm": 1.0}, 422, "invalid_shape"),
        ("lu_rcond", {**LU2}, 422, "missing_input"),
        ("lu_rcond", {**LU2, "anorm": "big"}, 400, "malformed_tensor"),
        ("slogdet", {"A": [[1, 2, 3]]}, 422, "invalid_shape"),
        ("slogdet", {"A": [1, 2]}, 422, "invalid_shape"),
        ("slogdet", {"A": A2, "left": True}, 422, "unknown_option"),
        ("det", {"A": {"dtype": "int64", "shape": [2, 2], "data": [1, 2, 3]}}, 400, "shape_mismatch"),
        ("det", {"A": DEEP}, 400, "malformed_tensor"),
        ("det", {"B": A2}, 422, "missing_input"),
        ("det", {"A": A2, "B": A2}, 422, "unknown_option"),
    ],
)
async def test_errors(client, op, body, status, code):
    r = await client.post(f"/{op}", json=body)
    assert r.status_code == status, r.text
    assert r.json()["code"] == code and r.json()["request_id"]
    assert r.json()["error"]


async def test_unsupported_factor_dtype_on_v2(client):
    body = {
        "inputs": [
            {"name": "A", "shape": [2, 2], "datatype": "FP64", "data": [4, 1, 2, 3]},
            {"name": "B", "shape": [2], "datatype": "FP64", "data": [1, 2]},
        ],
        "parameters": {"factor_dtype": "bfloat16"},
    }
    r = await client.post("/v2/models/solve_refined/infer", json=body)
    assert r.status_code == 422 and r.json()["code"] == "unsupported_factor_dtype"
    assert "factor_dtype" in r.json()["error"]


async def test_oversized_requests_and_answers(make_client):
    small = await make_client(max_elements=64)
    A = np.eye(6)
    r = await small.post("/det", json={"A": np.stack([A, A]).tolist()})
    assert r.status_code == 413 and r.json()["code"] == "too_many_elements"
    # 7 elements in, but a broadcast solve answers 4 * 6 * 3 + 8 elements: refused before computing.
    r = await small.post("/solve_refined", json={"A": [[[[2.0]]]] * 4, "B": [[1.0, 1.0, 1.0]]})
    assert r.status_code in (200, 422)
    big_b = {"dtype": "float64", "shape": [4, 1, 4], "data": [1.0] * 16}
    r = await small.post("/solve_refined", json={"A": {"dtype": "float64", "shape": [1, 1], "data": [2]}, "B": big_b})
    assert r.status_code == 200


async def test_output_too_large_is_refused_before_computing(make_client):
    small = await make_client(max_elements=40)
    A = {"dtype": "float64", "shape": [10, 1, 1, 1], "data": [2.0] * 10}
    B = {"dtype": "float64", "shape": [3, 1, 1], "data": [1.0] * 3}
    r = await small.post("/solve_refined", json={"A": A, "B": B})
    assert r.status_code == 422 and r.json()["code"] == "output_too_large"


@pytest.mark.parametrize("op", ["solve_refined", "lu_rcond", "slogdet", "det"])
async def test_non_finite_input_is_answered_not_failed(client, op):
    nan = "NaN"
    bodies = {
        "solve_refined": {"A": [[nan, 1], [1, 1]], "B": [1, 2]},
        "lu_rcond": {"LU": [[[nan, 1], [0.5, 1]]], "pivots": [[1, 2]], "anorm": ["Infinity"]},
        "slogdet": {"A": [[nan, 1], [1, "Infinity"]]},
        "det": {"A": [["-Infinity", 1], [1, 1]]},
    }
    r = await client.post(f"/{op}", json=bodies[op])
    assert r.status_code == 200, r.text
