"""Fuzzing the HTTP surface: schemathesis from the service's own OpenAPI document, and hypothesis bodies.

The property in both: no input produces a 5xx (other than a 503 the service
means), and every error body follows the error model.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from service.app import create_app
from tests.service.conftest import make_settings
from tests.service.wire import binary_request

LIMITS = {"max_elements": 4096, "max_request_bytes": 1 << 20}
# schemathesis runs the app's lifespan around its calls; its app is its own.
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(make_settings(**LIMITS)))


def check_error_model(response) -> None:
    if response.status_code >= 400:
        body = json.loads(response.content)
        assert set(body) >= {"error", "code", "request_id"}, body


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_openapi_fuzz_never_5xx(case):
    response = case.call()
    case.validate_response(response, checks=[not_a_server_error])
    check_error_model(response)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["NaN", "Infinity", "-Infinity"])
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


def _deep(value: object, depth: int) -> object:
    for _ in range(depth):
        value = [value]
    return value


# Nesting past NumPy's dimensions and near the JSON parser's limit (the standard library's encoder,
# used by httpx, gives up past ~1000 levels).
deep_values = st.builds(_deep, json_values, st.integers(30, 600))
# Dimensions that are zero, huge, beyond 64 bits or negative, in any combination.
dimensions = st.one_of(st.integers(0, 5), st.sampled_from([0, 1 << 27, 1 << 31, 1 << 62, 1 << 63, 1 << 64, -1]))
json_values = json_values | deep_values
tensor_like = st.one_of(
    st.lists(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=4), max_size=4),
    st.fixed_dictionaries(
        {"data": json_values},
        optional={"dtype": st.sampled_from(["float32", "float64", "complex64", "complex128", "int32", "int64", "x"]),
                  "shape": st.lists(dimensions, max_size=4) | json_values},
    ),
    json_values,
)  # fmt: skip
bodies = st.fixed_dictionaries(
    {},
    optional={
        "A": tensor_like,
        "B": tensor_like,
        "LU": tensor_like,
        "pivots": tensor_like,
        "left": json_values,
        "check_errors": st.booleans(),
        "adjoint": st.booleans(),
        "anorm": tensor_like,
        "norm": json_values,
        "max_iter": json_values,
        "factor_dtype": st.sampled_from(["float32", "float64", "complex64", "tf32", None]) | json_values,
    },
)


def _call(app, path: str, **kwargs) -> httpx.Response:
    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://lu.test") as client:
            return await client.post(path, **kwargs)

    r = asyncio.run(post())
    assert r.status_code < 500, (r.status_code, r.text)
    check_error_model(r)
    return r


@pytest.fixture(scope="module")
def app():
    app = create_app(make_settings(**LIMITS))
    app.state.worker.start()  # what the lifespan does
    app.state.ready.set()
    yield app
    app.state.worker.stop(10)


# The derived operations too (solve_refined, lu_rcond, slogdet, det): their own options and inputs.
MODELS = ["lu_factor", "lu_unpack", "lu_solve", "lu", "solve", "solve_refined", "lu_rcond", "slogdet", "det"]


@given(path=st.sampled_from([f"/{m}" for m in MODELS]), body=bodies)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_random_json_bodies_never_5xx(app, path, body):
    _call(app, path, json=body)


v2_inputs = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.sampled_from(["A", "B", "LU", "pivots", "anorm"]) | json_values,
            "shape": st.lists(dimensions, max_size=4) | json_values,
            "datatype": st.sampled_from(["FP64", "FP32", "INT32", "COMPLEX128"]) | json_values,
            "data": json_values,
            "parameters": json_values,
        },
    ),
    max_size=3,
)
v2_bodies = st.fixed_dictionaries(
    {"inputs": v2_inputs | json_values},
    optional={
        "id": json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["left", "pivot", "binary_data_output", "max_iter", "factor_dtype", "norm", "zzz"]),
            json_values,
        )
        | json_values,
        "outputs": st.lists(st.fixed_dictionaries({"name": json_values}, optional={"parameters": json_values}))
        | json_values,
    },
)


@given(model=st.sampled_from(MODELS), body=v2_bodies)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_random_v2_json_bodies_never_5xx(app, model, body):
    _call(app, f"/v2/models/{model}/infer", json=body)


@given(
    model=st.sampled_from([*MODELS, "nope"]),
    shape=st.lists(st.integers(0, 4), max_size=4),
    declared=st.none() | st.lists(dimensions, max_size=4),
    datatype=st.sampled_from(["FP32", "FP64", "COMPLEX64", "COMPLEX128", "INT32", "INT64", "FP16", "BOOL", "BYTES"]),
    names=st.lists(st.sampled_from(["A", "B", "LU", "pivots", "anorm", "X"]), min_size=1, max_size=3),
    cut=st.integers(-16, 16),
    params=st.dictionaries(
        st.sampled_from(["left", "adjoint", "pivot", "binary_data_output", "max_iter", "factor_dtype", "norm", "zzz"]),
        json_values,
    ),
)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_random_binary_bodies_never_5xx(app, model, shape, declared, datatype, names, cut, params):
    rng = np.random.default_rng(len(shape))
    arr = rng.standard_normal(shape)
    body, headers = binary_request({n: arr for n in dict.fromkeys(names)}, params)
    hlen = int(headers["inference-header-content-length"])
    header = json.loads(body[:hlen])
    for entry in header["inputs"]:
        entry["datatype"] = datatype
        if declared is not None:  # a shape that disagrees with the bytes, or declares huge or empty work
            entry["shape"] = declared
    new_header = json.dumps(header).encode()
    body = new_header + body[hlen:]
    if cut:
        body = body[:cut] if cut < 0 else body + bytes(cut)
    headers["inference-header-content-length"] = str(len(new_header))
    _call(app, f"/v2/models/{model}/infer", content=body, headers=headers)
    _call(app, f"/{model}", content=body, headers=headers)
