"""Every operation, in every format and dtype, against lu_core called directly."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from tests.helpers import DTYPES, well_conditioned
from tests.service.wire import FROM_OIP, binary_request, from_json_tensor, parse_binary, to_json_tensor

pytestmark = pytest.mark.anyio

FORMATS = ["json", "binary", "v2-json", "v2-binary"]


async def call(client, op: str, fmt: str, tensors: dict, options: dict | None = None, **v2) -> dict:
    """POST in the given format; return the outputs as arrays (None for null outputs)."""
    options = options or {}
    if fmt == "json":
        r = await client.post(f"/{op}", json={**{k: to_json_tensor(v) for k, v in tensors.items()}, **options})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/json"
        return {k: None if v is None else from_json_tensor(v) for k, v in r.json().items()}
    path = f"/{op}" if fmt == "binary" else f"/v2/models/{op}/infer"
    if fmt.endswith("binary"):
        body, headers = binary_request(tensors, options, **v2)
        r = await client.post(path, content=body, headers=headers)
    else:
        inputs = [
            {"name": k, "shape": list(v.shape), "datatype": to_json_tensor(v)["dtype"].upper().replace("FLOAT", "FP")}
            | {"data": to_json_tensor(v.reshape(-1))["data"]}
            for k, v in tensors.items()
        ]
        r = await client.post(path, json={"inputs": inputs, "parameters": options, **v2})
    assert r.status_code == 200, r.text
    if "inference-header-content-length" in r.headers:
        assert r.headers["content-type"] == "application/octet-stream"
        header, out = parse_binary(r.content, int(r.headers["inference-header-content-length"]))
    else:
        header = r.json()
        out = {o["name"]: from_json_tensor({"dtype": _np_name(o["datatype"]), **o}) for o in header["outputs"]}
    if fmt.startswith("v2"):
        assert header["model_name"] == op
    return out


def _np_name(datatype: str) -> str:
    return {"FP32": "float32", "FP64": "float64", "INT32": "int32", "INT64": "int64"}.get(datatype, datatype.lower())


def expect_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
async def test_lu_factor(client, rng, fmt, dtype):
    A = well_conditioned(rng, (2, 3, 5, 5), dtype)
    A[1, 2] = 0  # singular: reported in info, never an error
    out = await call(client, "lu_factor", fmt, {"A": A})
    LU, piv, info = lu_core.lu_factor_ex(A)
    expect_equal(out["LU"], LU)
    expect_equal(out["pivots"], piv)
    expect_equal(out["info"], info)
    assert out["info"][1, 2] == 1


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(4, 6), (6, 4), (3, 0, 0), (0, 3, 3)])
async def test_lu_factor_rectangular_and_empty(client, rng, fmt, shape):
    A = rng.standard_normal(shape)
    out = await call(client, "lu_factor", fmt, {"A": A})
    LU, piv, info = lu_core.lu_factor_ex(A)
    expect_equal(out["LU"], LU)
    expect_equal(out["pivots"], piv)
    expect_equal(out["info"], info)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("unpack_data", "unpack_pivots"), [(True, True), (False, True), (True, False)])
async def test_lu_unpack(client, rng, fmt, dtype, unpack_data, unpack_pivots):
    LU, piv = lu_core.lu_factor(well_conditioned(rng, (3, 4, 4), dtype))
    opts = {"unpack_data": unpack_data, "unpack_pivots": unpack_pivots}
    out = await call(client, "lu_unpack", fmt, {"LU": LU, "pivots": piv}, opts)
    want = dict(zip("PLU", lu_core.lu_unpack(LU, piv, **opts), strict=True))
    for name, value in want.items():
        if value is None:
            assert out.get(name) is None
        else:
            expect_equal(out[name], value)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("left", "adjoint"), [(True, False), (False, True), (True, True)])
async def test_lu_solve_broadcasts(client, rng, fmt, dtype, left, adjoint):
    A = well_conditioned(rng, (1, 3, 4, 4), dtype)
    LU, piv = lu_core.lu_factor(A)
    B = rng.standard_normal((2, 1, 4, 2) if left else (2, 1, 2, 4)).astype(dtype)
    out = await call(client, "lu_solve", fmt, {"LU": LU, "pivots": piv, "B": B}, {"left": left, "adjoint": adjoint})
    want = lu_core.lu_solve(LU, piv, B, left=left, adjoint=adjoint)
    expect_equal(out["X"], want)  # the same bytes reach the same kernels: bit-identical
    assert out["X"].shape == ((2, 3, 4, 2) if left else (2, 3, 2, 4))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
async def test_lu_and_solve(client, rng, fmt, dtype):
    A = well_conditioned(rng, (2, 6, 6), dtype)
    out = await call(client, "lu", fmt, {"A": A})
    for name, value in zip("PLU", lu_core.lu(A), strict=True):
        expect_equal(out[name], value)
    B = rng.standard_normal((2, 6, 3)).astype(dtype)
    X = (await call(client, "solve", fmt, {"A": A, "B": B}))["X"]
    expect_equal(X, lu_core.solve(A, B))
    Xr = (await call(client, "solve", fmt, {"A": A, "B": B.swapaxes(-1, -2).copy()}, {"left": False}))["X"]
    expect_equal(Xr, lu_core.solve(A, B.swapaxes(-1, -2), left=False))


@pytest.mark.parametrize("fmt", FORMATS)
async def test_singular_lu_solve_is_422_unless_unchecked(client, rng, fmt):
    LU = well_conditioned(rng, (3, 3, 3), np.float64)
    LU[2, 1, 1] = 0.0
    piv = np.tile(np.arange(1, 4, dtype=np.int32), (3, 1))
    B = rng.standard_normal((3, 3, 1))
    out = await call(client, "lu_solve", fmt, {"LU": LU, "pivots": piv, "B": B}, {"check_errors": False})
    assert not np.isfinite(out["X"][2]).all() and np.isfinite(out["X"][:2]).all()


async def test_non_finite_values_round_trip_in_json(client):
    A = np.array([[np.nan, 1.0], [np.inf, -np.inf]])
    out = await call(client, "lu_factor", "json", {"A": A})
    LU, _, _ = lu_core.lu_factor_ex(A)
    np.testing.assert_array_equal(out["LU"], LU)  # NaN compares equal position-wise here
    r = await client.post("/lu_factor", json={"A": [["NaN", 1], ["Infinity", "-Infinity"]]})
    assert r.status_code == 200
    assert '"NaN"' in r.text


async def test_nested_lists_and_int_inputs(client):
    r = await client.post("/solve", json={"A": [[2, 0], [0, 4]], "B": [2, 2]})
    assert r.status_code == 200, r.text
    assert r.json()["X"] == {"dtype": "float64", "shape": [2], "data": [1.0, 0.5]}
    r = await client.post("/lu_unpack", json={"LU": [[2.0, 1.0], [0.5, 3.0]], "pivots": [2, 2], "unpack_data": False})
    assert r.json()["L"] is None and r.json()["U"] is None
    assert r.json()["P"]["data"] == [[0.0, 1.0], [1.0, 0.0]]


async def test_object_form_accepts_flat_data(client):
    body = {"A": {"dtype": "float32", "shape": [2, 2, 2], "data": [4, 1, 1, 3, 2, 0, 0, 2]}}
    r = await client.post("/lu_factor", json=body)
    assert r.status_code == 200
    assert r.json()["LU"]["dtype"] == "float32" and r.json()["LU"]["shape"] == [2, 2, 2]


async def test_v2_echoes_id_and_honours_output_selection(client, rng):
    A = well_conditioned(rng, (4, 4), np.float64)
    body, headers = binary_request(
        {"A": A}, id="req-7", outputs=[{"name": "LU", "parameters": {"binary_data": False}}, {"name": "info"}]
    )
    r = await client.post("/v2/models/lu_factor/infer", content=body, headers=headers)
    header, out = parse_binary(r.content, int(r.headers["inference-header-content-length"]))
    assert header["id"] == "req-7" and [o["name"] for o in header["outputs"]] == ["LU", "info"]
    assert "data" in header["outputs"][0] and "binary_data_size" in header["outputs"][1]["parameters"]
    np.testing.assert_array_equal(out["LU"], lu_core.lu_factor(A)[0])


async def test_v2_json_request_with_binary_outputs(client, rng):
    A = well_conditioned(rng, (3, 3), np.float64)
    inputs = [{"name": "A", "shape": [3, 3], "datatype": "FP64", "data": A.ravel().tolist()}]
    r = await client.post(
        "/v2/models/lu/versions/1/infer", json={"inputs": inputs, "parameters": {"binary_data_output": True}}
    )
    _, out = parse_binary(r.content, int(r.headers["inference-header-content-length"]))
    for name, value in zip("PLU", lu_core.lu(A), strict=True):
        expect_equal(out[name], value)


async def test_v2_metadata_and_health(client):
    for path in ("/v2", "/v2/"):
        r = await client.get(path)
        assert r.status_code == 200 and r.json()["extensions"] == ["binary_tensor_data", "parameters"]
    r = await client.get("/v2/health/live")
    assert r.status_code == 200 and r.json() == {"live": True}
    r = await client.get("/v2/health/ready")
    assert r.status_code == 200 and r.json() == {"ready": True}
    meta = (await client.get("/v2/models/lu_solve")).json()
    assert [i["name"] for i in meta["inputs"]] == ["LU", "pivots", "B"]
    assert [o["name"] for o in meta["outputs"]] == ["X"]
    assert meta["parameters"]["check_errors"] == {"datatype": "BOOL", "default": True}
    for path in ("/v2/models/solve/ready", "/v2/models/solve/versions/1/ready"):
        r = await client.get(path)
        assert r.status_code == 200 and r.json() == {"name": "solve", "ready": True}
    for path in ("/v2/models/qr", "/v2/models/qr/ready", "/v2/models/solve/versions/2"):
        r = await client.get(path)
        assert r.status_code == 404 and r.json()["code"] == "unknown_model"


@pytest.mark.parametrize("datatype", ["FP32", "FP64", "COMPLEX64", "COMPLEX128", "INT32", "INT64"])
@pytest.mark.parametrize("op", ["lu_factor", "lu_unpack", "lu_solve", "lu", "solve"])
async def test_v2_metadata_tells_the_truth(client, op, datatype):
    """Each listed shape admits leading batch dimensions; each listed output datatype is what comes back."""
    meta = (await client.get(f"/v2/models/{op}")).json()
    assert "any number of leading batch dimensions" in meta["parameters"]["batch_dimensions"]
    matrix = np.eye(3) * 4 + 1  # exact in every datatype, nonsingular
    inputs = {}
    for t in meta["inputs"]:
        assert t["shape"] == [-1] * len(t["shape"])
        if t["name"] == "pivots":
            inputs["pivots"] = np.broadcast_to(np.arange(1, 4, dtype=np.int32), (2, 1, 3)).copy()
        else:
            assert len(t["shape"]) == 2
            inputs[t["name"]] = np.broadcast_to(matrix, (2, 1, 3, 3)).astype(FROM_OIP[datatype])
    body, headers = binary_request(inputs)
    r = await client.post(f"/v2/models/{op}/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    header, _ = parse_binary(r.content, int(r.headers["inference-header-content-length"]))
    expected = meta["parameters"]["datatypes"][datatype]
    for o in header["outputs"]:
        listed = next(t for t in meta["outputs"] if t["name"] == o["name"])
        assert o["datatype"] == expected[o["name"]], o
        assert o["shape"][:2] == [2, 1] and len(o["shape"]) == 2 + len(listed["shape"])
    assert {o["name"] for o in header["outputs"]} == set(expected)
