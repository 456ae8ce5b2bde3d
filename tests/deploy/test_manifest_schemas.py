"""Every Kubernetes manifest under deploy/ against its schema, offline.

Built-in kinds (Deployment, Service, ...) go through kubernetes-validate's strict
schemas for :data:`K8S_VERSION`; KServe's kinds through ``deploy/kserve/kserve.schema.json``,
generated from the kserve package's models (``tests/deploy/kserve_schema.py``), whose
Kubernetes parts point into the same strict schemas. When the kserve wheel is at hand
(``make test`` downloads it into ``.cache/wheels`` without installing it), the committed
schema must equal what the wheel generates.
"""

from __future__ import annotations

import copy
import json
import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.deploy.kserve_schema import K8S_DEFINITIONS, K8S_VERSION, KINDS, generate, k8s_definitions

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMA_PATH = DEPLOY / "kserve" / "kserve.schema.json"
MANIFESTS = sorted(DEPLOY.rglob("*.yaml"))


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _kserve_validator(kind: str) -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    defs = DRAFT202012.create_resource(k8s_definitions(strict=True))
    registry = Registry().with_resources([(K8S_DEFINITIONS, defs), (schema["$id"], Resource.from_contents(schema))])
    entry = {"$schema": schema["$schema"], "$ref": f"{schema['$id']}#/kinds/{kind}"}
    return jsonschema.Draft202012Validator(entry, registry=registry)


def validate(doc: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` (or kubernetes-validate's subclass) if ``doc`` is invalid."""
    if doc.get("kind") in KINDS:
        _kserve_validator(doc["kind"]).validate(doc)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_manifest_is_found():
    names = {str(p.relative_to(DEPLOY)) for p in MANIFESTS}
    assert {"k8s/deployment.yaml", "kserve/servingruntime.yaml", "kserve/inferenceservice.yaml"} <= names


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_manifest_is_valid(path):
    docs = _documents(path)
    assert docs
    for doc in docs:
        validate(doc)


def _manifest(kind: str) -> dict[str, Any]:
    for path in MANIFESTS:
        for doc in _documents(path):
            if doc["kind"] == kind:
                return doc
    raise LookupError(kind)


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node: Any = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


_DELETE = object()


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("InferenceService", "spec.predictor.model.resourcse", {}),  # misspelt KServe field
        ("InferenceService", "spec.predictor.minReplicas", "one"),  # wrong type
        ("InferenceService", "spec.predictor.model.modelFormat", _DELETE),  # required by KServe
        ("InferenceService", "apiVersion", "serving.kserve.io/v1alpha1"),
        ("InferenceService", "spec.predictor.model.env.0.valeu", "x"),  # Kubernetes EnvVar, strict
        ("InferenceService", "spec.predictor.model.resources.limits", ["nvidia.com/gpu"]),
        ("ServingRuntime", "spec.containers", _DELETE),
        ("ServingRuntime", "spec.containers.0.ports.0.containerPort", "eighty"),  # Kubernetes ContainerPort
        ("ServingRuntime", "spec.containers.0.readinessProbe.httpGet.path", 5),
        ("ServingRuntime", "spec.supportedModelFormats.0.autoSelect", "yes"),
        ("ServingRuntime", "kind", "ClusterServingRuntimeX"),
        ("Deployment", "spec.template.spec.containers.0.resourcse", {}),
        ("Deployment", "spec.replicas", "2"),
        ("Service", "spec.ports.0.port", "http"),
        ("HorizontalPodAutoscaler", "spec.maxReplicas", _DELETE),
        ("ConfigMap", "data.LU_PORT", 8000),  # ConfigMap values are strings
    ],
)
def test_a_broken_manifest_is_refused(kind, path, value):
    broken = _set(_manifest(kind), path, value)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.SchemaNotFoundError)):
        validate(broken)


def test_kserve_manifests_fit_the_service():
    from service.config import Settings

    runtime, isvc = _manifest("ServingRuntime"), _manifest("InferenceService")
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"
    env = {e["name"]: e.get("value") for e in container["env"]}
    env.update({e["name"]: e.get("value") for e in isvc["spec"]["predictor"]["model"]["env"]})
    assert {n.removeprefix("LU_").lower() for n in env} <= set(Settings.model_fields)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert len(ports) == len(container["ports"])  # no name twice
    # REST (v2) on KServe's (Knative's) http1 port, which is the service's LU_PORT
    assert ports["http1"] == int(env["LU_PORT"]) and env["LU_HOST"] == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": ports["http1"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": ports["http1"]}
    assert runtime["metadata"]["annotations"]["prometheus.kserve.io/port"] == str(ports["http1"])
    assert container["command"] == ["python", "-m", "service"]
    for spec in (container, isvc["spec"]["predictor"]["model"]):
        assert spec["resources"]["limits"]["nvidia.com/gpu"] == "1"
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    # grpc-v2 only where the service has a gRPC port to offer, and then on the container's h2c port
    # (KServe's name for it), which is the service's LU_GRPC_PORT; no other ports.
    if "grpc-v2" in runtime["spec"]["protocolVersions"]:
        assert "grpc_port" in Settings.model_fields
        assert set(ports) == {"http1", "h2c"} and ports["h2c"] != ports["http1"]
        assert ports["h2c"] == int(env["LU_GRPC_PORT"])
    else:
        assert set(ports) == {"http1"}
        assert "grpc_port" not in Settings.model_fields or "LU_GRPC_PORT" not in env


def _kserve_source() -> Path | None:
    version = json.loads(SCHEMA_PATH.read_text())["x-kserve-version"]
    wheel = ROOT / ".cache" / "wheels" / f"kserve-{version}-py3-none-any.whl"
    if wheel.exists():
        return wheel
    spec = find_spec("kserve")  # an installed kserve is read as files, never imported
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return None


def test_the_committed_kserve_schema_is_what_the_kserve_package_generates():
    source = _kserve_source()
    if source is None:
        pytest.skip("no kserve wheel in .cache/wheels (make test downloads it) and no kserve installed")
    committed = json.loads(SCHEMA_PATH.read_text())
    generated = generate(source, k8s_definitions(strict=True)["$defs"])
    if source.is_dir():  # an installed kserve of another version is a different schema, not a drift
        generated["x-kserve-version"] = committed["x-kserve-version"]
        generated["$id"], generated["description"] = committed["$id"], committed["description"]
    assert generated == committed, "regenerate deploy/kserve/kserve.schema.json (see tests/deploy/kserve_schema.py)"


def test_the_schema_knows_the_fields_the_manifests_use():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert re.fullmatch(r"\d+\.\d+\.\d+", schema["x-kserve-version"])
    predictor = schema["$defs"]["V1beta1PredictorSpec"]["properties"]
    assert {"model", "minReplicas", "maxReplicas", "scaleMetric", "scaleTarget"} <= set(predictor)
    runtime = schema["$defs"]["V1alpha1ServingRuntimeSpec"]
    assert runtime["required"] == ["containers"] and runtime["additionalProperties"] is False
    makefile = (ROOT / "Makefile").read_text()
    assert f"KSERVE_VERSION ?= {schema['x-kserve-version']}" in makefile
