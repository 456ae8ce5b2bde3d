"""/healthz, /readyz, /metrics, structured logs, settings and device selection."""

from __future__ import annotations

import json
import logging
import re

import anyio
import pytest

from service.config import Settings
from service.device import DeviceUnavailableError, select_device
from service.logs import JsonFormatter, configure_logging

pytestmark = pytest.mark.anyio


async def test_healthz_and_readyz(client):
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    body = (await client.get("/readyz")).json()
    assert body["status"] == "ready"
    assert body["device"]["kind"] == "cpu"
    assert body["versions"]["numpy"] and body["versions"]["lu-service"]
    assert body["queue"]["max"] == 64


async def test_readyz_is_503_until_warm(make_client):
    client = await make_client()
    client.app.state.ready.clear()
    r = await client.get("/readyz")
    assert r.status_code == 503 and r.json()["status"] == "starting"
    r = await client.get("/v2/health/ready")
    assert r.status_code == 503 and r.json() == {"ready": False}
    r = await client.get("/v2/models/lu/ready")
    assert r.status_code == 503 and r.json() == {"name": "lu", "ready": False}
    assert (await client.get("/v2/health/live")).json() == {"live": True}


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"])
async def test_head_on_a_probe_gives_the_get_s_status_and_headers_without_a_body(make_client, path):
    """A load balancer's HEAD probe: 200 (503 while warming up, for readiness) with the GET's headers; it
    stays out of the OpenAPI document (one operation per path and method there)."""
    client = await make_client()
    for ready in (True, False):
        if not ready:
            client.app.state.ready.clear()
        get, head = await client.get(path), await client.head(path)
        assert head.status_code == get.status_code == (200 if ready or "ready" not in path else 503)
        assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]
        assert head.headers["content-length"] == get.headers["content-length"] == str(len(get.content))
    spec = (await client.get("/openapi.json")).json()
    assert "head" not in spec["paths"][path] and "get" in spec["paths"][path]


async def test_warmup_runs_every_operation_before_ready(make_client):
    client = await make_client(warmup=True)  # the warm-up runs in the background: 503, then 200
    with anyio.fail_after(180):
        while (await client.get("/readyz")).status_code != 200:
            await anyio.sleep(0.05)
    metrics = (await client.get("/metrics")).text
    assert "lu_device_info" in metrics


async def test_metrics_count_requests_bytes_and_compute(client):
    await client.post("/solve", json={"A": [[2.0]], "B": [4.0]})
    await client.post("/solve", content=b"{")
    text = (await client.get("/metrics")).text
    assert 'lu_requests_total{device="cpu",endpoint="/solve",method="POST",status="200"} 1.0' in text
    assert 'lu_requests_total{device="cpu",endpoint="/solve",method="POST",status="400"} 1.0' in text
    assert 'lu_compute_seconds_count{device="cpu",operation="solve"} 1.0' in text
    assert 'lu_errors_total{code="malformed_json"} 1.0' in text
    assert 'lu_request_bytes_total{endpoint="/solve"}' in text
    assert "lu_queue_wait_seconds_count 1.0" in text
    assert 'lu_device_info{device="cpu"' in text


async def test_openapi_documents_every_route(client):
    doc = (await client.get("/openapi.json")).json()
    for path in ("/lu_factor", "/lu_unpack", "/lu_solve", "/lu", "/solve", "/v2/models/{model}/infer"):
        body = doc["paths"][path]["post"]["requestBody"]["content"]
        assert {"application/json", "application/octet-stream"} <= set(body)
    assert set(doc["paths"]["/lu_solve"]["post"]["responses"]) >= {"200", "400", "413", "422", "503"}


def test_json_logs_carry_the_request_id():
    record = logging.makeLogRecord({"name": "x", "msg": "hello %s", "args": ("you",), "levelno": 20,
                                    "levelname": "INFO", "request_id": "r-1", "status": 200})  # fmt: skip
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "hello you" and line["request_id"] == "r-1" and line["status"] == 200


async def test_access_log_lines_are_json_with_the_request_id(client, capsys, monkeypatch):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    for flag in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing", "logAsyncioTasks"):
        if not hasattr(logging, flag):
            continue  # logAsyncioTasks: Python 3.12+
        monkeypatch.setattr(logging, flag, getattr(logging, flag))
    configure_logging("info", json_lines=True)
    try:
        await client.get("/healthz", headers={"x-request-id": "trace-me"})
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    access = next(x for x in lines if x["logger"] == "service.access")
    assert access["request_id"] == "trace-me" and access["status"] == 200 and access["path"] == "/healthz"
    assert access["duration_ms"] >= 0 and access["level"] == "info"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", access["ts"]), access["ts"]


async def test_access_lines_skip_logging_only_while_nothing_else_would_see_them(client, capsys, monkeypatch):
    """The access log's direct line (service.logs._AccessLines) is the line logging would write; while
    another handler or filter is in the way (a caplog, an application's own), records go through logging."""
    from service import logs

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    for flag in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing", "logAsyncioTasks"):
        if hasattr(logging, flag):
            monkeypatch.setattr(logging, flag, getattr(logging, flag))
    monkeypatch.setattr(logs, "_lines", None)
    seen: list[logging.LogRecord] = []

    class Spy(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    spy = Spy()
    configure_logging("info", json_lines=True)
    try:
        assert logs._lines is not None and logs._lines.usable()
        await client.get("/healthz", headers={"x-request-id": "direct"})
        logs.ACCESS.addHandler(spy)
        assert not logs._lines.usable()
        await client.get("/healthz", headers={"x-request-id": "through-logging"})
        logs.ACCESS.removeHandler(spy)
        root.addHandler(spy)
        assert not logs._lines.usable()
        root.removeHandler(spy)
        parent = logging.getLogger("service")  # between service.access and the root
        parent.addHandler(spy)
        assert not logs._lines.usable()
        parent.removeHandler(spy)
        monkeypatch.setattr(parent, "propagate", False)
        assert not logs._lines.usable()
        monkeypatch.setattr(parent, "propagate", True)
        assert logs._lines.usable()
        factory = logging.getLogRecordFactory()  # a tracing integration's factory adds to every record
        logging.setLogRecordFactory(lambda *a, **k: factory(*a, **k))
        try:
            assert not logs._lines.usable()
        finally:
            logging.setLogRecordFactory(factory)
        assert logs._lines.usable()
    finally:
        logs.ACCESS.removeHandler(spy)
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    direct = next(x for x in lines if x.get("request_id") == "direct")
    logged = next(x for x in lines if x.get("request_id") == "through-logging")
    assert list(direct) == list(logged)  # the same fields, in the same order
    for key in ("ts", "request_id", "duration_ms"):
        direct.pop(key), logged.pop(key)
    assert direct == logged and direct["msg"] == "GET /healthz 200" and direct["logger"] == "service.access"
    assert [r.getMessage() for r in seen] == ["GET /healthz 200"] and seen[0].request_id == "through-logging"


def test_settings_come_from_lu_environment(monkeypatch):
    monkeypatch.setenv("LU_PORT", "9001")
    monkeypatch.setenv("LU_MAX_REQUEST_BYTES", "1234")
    monkeypatch.setenv("LU_API_KEY", "a, b")
    monkeypatch.setenv("PORT", "1")  # not ours
    s = Settings()
    assert s.port == 9001 and s.max_request_bytes == 1234 and s.api_keys == (b"a", b"b")
    monkeypatch.setenv("LU_DEVICE", "tpu")
    with pytest.raises(ValueError, match="device"):
        Settings()
    monkeypatch.setenv("LU_DEVICE", "cpu")
    monkeypatch.setenv("LU_API_KEY", " , ")
    with pytest.raises(ValueError, match="no key"):
        Settings()
    monkeypatch.setenv("LU_API_KEY", " ")  # blank, as compose passes an unset one: no authentication
    assert Settings().api_keys == ()


def test_gpu_without_a_gpu_fails_and_auto_falls_back(monkeypatch):
    import service.device as device_module

    monkeypatch.setattr(device_module, "gpu_problem", lambda index: "CuPy is not installed")
    with pytest.raises(DeviceUnavailableError, match="LU_DEVICE=gpu"):
        select_device(Settings(device="gpu"))
    auto = select_device(Settings(device="auto"))
    assert auto.kind == "cpu" and "CuPy is not installed" in auto.describe()["note"]


def test_the_cpu_names_its_lapack_and_a_bad_choice_stops_the_start(monkeypatch, caplog):
    from lu_core._cpu import _lapack

    with caplog.at_level(logging.INFO, logger="service.device"):
        cpu = select_device(Settings(device="cpu"))
    from lu_core._cpu import _mkl

    have_mkl = _mkl.library_path() is not None
    on_mkl = have_mkl and _lapack.auto_takes_mkl(_lapack.cpu_vendor())
    assert cpu.describe()["lapack"].startswith("MKL (" if on_mkl else "SciPy (")
    assert (_lapack.MKL_BESIDE in cpu.describe()["lapack"]) is (have_mkl and not on_mkl)
    assert f"LAPACK: {cpu.describe()['lapack']}" in caplog.text
    monkeypatch.setattr(_lapack, "_chosen", None)  # chosen afresh, as in a new process
    monkeypatch.setenv("LU_CORE_LAPACK", "openblas")
    with pytest.raises(DeviceUnavailableError, match="LU_CORE_LAPACK must be one of auto, mkl, scipy"):
        select_device(Settings(device="cpu"))
