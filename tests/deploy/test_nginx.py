"""deploy/nginx.conf: requests about one stored factorization reach one replica; the rest are balanced.

The configuration is parsed and its name-extracting regex checked everywhere; where an
``nginx`` binary is installed (Debian: ``apt-get install nginx``), the file itself runs on
loopback in front of two real lu-service apps.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import uvicorn

from service.app import create_app
from tests.service.conftest import make_settings

CONF = Path(__file__).resolve().parents[2] / "deploy" / "nginx.conf"


def parse(text: str) -> list:
    """nginx's syntax as nested lists: a directive is [name, *args], a block adds a list of children."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|[{};]|[^\s{};"]+', re.sub(r"#[^\n]*", "", text))
    stack: list[list] = [[]]
    current: list[str] = []
    for tok in tokens:
        if tok == ";":
            stack[-1].append(current)
            current = []
        elif tok == "{":
            block: list = []
            stack[-1].append([*current, block])
            stack.append(block)
            current = []
        elif tok == "}":
            stack.pop()
        else:
            current.append(tok[1:-1] if tok.startswith('"') else tok)
    assert len(stack) == 1 and not current, "unbalanced configuration"
    return stack[0]


def find(block: list, *names: str) -> list[list]:
    return [d for d in block if d and d[0] == names[0] and (len(names) == 1 or list(d[1:-1]) == list(names[1:]))]


def upstream(http: list, name: str) -> list:
    return find(http, "upstream", name)[0][-1]


def _location(server: list, path: str = "/") -> list:
    return next((d[-1] for d in server if d[0] == "location" and d[1:-1] == [path]), [])


def test_names_hash_consistently_and_the_rest_is_least_connections():
    http = find(parse(CONF.read_text()), "http")[0][-1]
    by_name, rest = upstream(http, "lu_by_name"), upstream(http, "lu_replicas")
    assert ["hash", "$lu_factorization", "consistent"] in by_name
    assert ["least_conn"] in rest
    servers = [d for d in rest if d[0] == "server"]
    assert servers and [d for d in by_name if d[0] == "server"] == servers  # the same replicas
    server = find(http, "server")[0][-1]
    locations = {tuple(d[1:-1]): d[-1] for d in server if d[0] == "location"}
    assert ["proxy_pass", "http://lu_by_name"] in locations[("/factorizations/",)]
    assert ["proxy_pass", "http://lu_replicas"] in locations[("/",)]
    # gRPC: the same replicas on their gRPC port, through a server that speaks HTTP/2
    grpc = upstream(http, "lu_grpc_replicas")
    assert ["least_conn"] in grpc
    assert [d for d in grpc if d[0] == "server"] == [[d[0], d[1].replace(":8000", ":8001"), *d[2:]] for d in servers]
    (grpc_server,) = [
        s[-1] for s in find(http, "server") if ["grpc_pass", "grpc://lu_grpc_replicas"] in _location(s[-1])
    ]
    assert ["http2", "on"] in grpc_server or any(d[0] == "listen" and "http2" in d for d in grpc_server)
    # the map that extracts the name, run with Python's regex engine (same syntax for this pattern)
    mapping = find(http, "map", "$uri", "$lu_factorization")[0][-1]
    (pattern, value), default = next(d for d in mapping if d[0] != "default"), find(mapping, "default")[0]
    assert default == ["default", ""] and pattern.startswith("~")
    regex = re.compile(pattern[1:].replace("(?<", "(?P<"))
    group = value.removeprefix("$")

    def name_of(uri: str) -> str:
        m = regex.search(uri)
        return m.group(group) if m else ""

    assert name_of("/factorizations/sys.1") == "sys.1"
    assert name_of("/factorizations/sys.1/solve") == "sys.1" == name_of("/factorizations/sys.1/unpack")
    assert name_of("/factorizations") == "" == name_of("/lu_solve") == name_of("/v2/models/lu_solve/infer")


# --------------------------------------------------------------------------- nginx on loopback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def replicas() -> Iterator[list]:
    """Two real service apps on loopback, as the two replicas (HTTP, and gRPC on ``app.state.grpc.port``)."""
    servers, threads, apps = [], [], []
    for _ in range(2):
        app = create_app(make_settings(grpc_port=_free_port()))
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append(server)
        threads.append(thread)
        apps.append((app, port))
    for _, port in apps:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
    yield apps
    for server in servers:
        server.should_exit = True
    for thread in threads:
        thread.join(30)


def test_nginx_routes_each_name_to_one_replica(replicas, tmp_path):
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx)")
    port, grpc_port = _free_port(), _free_port()
    version = re.search(
        r"nginx/(\d+)\.(\d+)\.(\d+)", subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr
    )
    old = version is not None and tuple(map(int, version.groups())) < (1, 25, 1)  # no "http2 on;" before 1.25.1
    text = CONF.read_text().replace("listen 8080;", f"listen 127.0.0.1:{port};")
    text = text.replace("listen 8081;", f"listen 127.0.0.1:{grpc_port}{' http2' if old else ''};")
    if old:
        text = re.sub(r"^\s*http2 on;[^\n]*\n", "", text, flags=re.M)
    # every upstream server: lu-gpuN:8000 is replica N's HTTP port, lu-gpuN:8001 its gRPC port
    ports = {"8000": [p for _, p in replicas], "8001": [app.state.grpc.port for app, _ in replicas]}
    text = re.sub(r"lu-gpu(\d+):(\d+)", lambda m: f"127.0.0.1:{ports[m[2]][int(m[1])]}", text)
    listens = [f"127.0.0.1:{port}", f"127.0.0.1:{grpc_port}" + (" http2" if old else "")]
    assert "lu-gpu" not in text and re.findall(r"^\s*listen ([^;]+);", text, re.M) == listens
    temp = "".join(f"    {d}_temp_path {tmp_path}/{d};\n" for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    text = text.replace("http {\n", f"http {{\n    access_log off;\n{temp}", 1).replace(
        "worker_processes auto;", "worker_processes 1;"
    )
    (tmp_path / "nginx.conf").write_text(text)
    directives = f"daemon off; pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log;"
    if os.geteuid() == 0:
        directives += " user root;"  # the workers must reach the temporary folders under tmp_path
    cmd = [nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-g", directives]
    check = subprocess.run([*cmd, "-t"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/nginx-health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        with httpx.Client(base_url=url, timeout=60) as client:
            names = [f"sys-{i}" for i in range(16)]
            for i, name in enumerate(names):
                r = client.put(f"/factorizations/{name}", json={"A": (np.eye(3) * (i + 1)).tolist()})
                assert r.status_code == 201, r.text
            for _ in range(2):  # without hashing on the name, about half of these would be 404
                for i, name in enumerate(names):
                    r = client.post(f"/factorizations/{name}/solve", json={"B": [[1.0], [1.0], [1.0]]})
                    assert r.status_code == 200, r.text
                    assert r.json()["X"]["data"][0] == [1.0 / (i + 1)]
            assert client.delete(f"/factorizations/{names[0]}").status_code == 204
            held = [sorted(e.name for e in app.state.store.names("")) for app, _ in replicas]
            assert sorted(held[0] + held[1]) == sorted(names[1:])  # each name in exactly one replica
            assert held[0] and held[1]  # and the names spread over both
            for _ in range(10):  # other routes: least connections (round robin when idle)
                assert client.post("/solve", json={"A": [[2.0]], "B": [[4.0]]}).status_code == 200
        served = [
            sum(s.value for m in app.state.metrics.requests.collect() for s in m.samples
                if s.labels.get("endpoint") == "/solve" and s.name.endswith("_total"))
            for app, _ in replicas
        ]  # fmt: skip
        assert served[0] > 0 and served[1] > 0 and sum(served) == 10
        # gRPC (grpc_pass over HTTP/2): least connections over the replicas' gRPC ports
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            assert client.is_server_live()
            for i in range(10):
                inputs = [grpcclient.InferInput("A", [1, 1], "FP64"), grpcclient.InferInput("B", [1, 1], "FP64")]
                inputs[0].set_data_from_numpy(np.array([[2.0]]))
                inputs[1].set_data_from_numpy(np.array([[2.0 * i]]))
                assert client.infer("solve", inputs).as_numpy("X").tolist() == [[float(i)]]
        served = [
            sum(s.value for m in app.state.metrics.requests.collect() for s in m.samples
                if s.labels.get("method") == "gRPC" and s.labels.get("endpoint", "").endswith("/ModelInfer")
                and s.name.endswith("_total"))
            for app, _ in replicas
        ]  # fmt: skip
        assert served[0] > 0 and served[1] > 0 and sum(served) == 10
    finally:
        proc.terminate()
        proc.wait(30)
