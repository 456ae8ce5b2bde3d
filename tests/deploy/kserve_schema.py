"""JSON Schemas of KServe's ``ServingRuntime`` and ``InferenceService``, from the kserve package's models.

The ``kserve`` distribution carries its resources as OpenAPI-generated model classes
(``kserve/models/*.py``: ``openapi_types``, ``attribute_map``, and setters that refuse
``None`` for required fields). This module reads those files as source text (``ast``),
never importing them, so neither kserve nor its dependencies (pandas, grpcio-tools,
protobuf and kubernetes pins) enter the dev environment. Kubernetes types it refers to
(``V1Container``, ``V1ResourceRequirements``, ...) become ``$ref``s into the Kubernetes
schemas that ``kubernetes-validate`` ships, so one validation covers both.

Regenerate the committed schema after a KServe upgrade::

    pip download --no-deps --dest .cache/wheels kserve==<version>
    python -m tests.deploy.kserve_schema .cache/wheels/kserve-<version>-py3-none-any.whl \
        > deploy/kserve/kserve.schema.json
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["K8S_DEFINITIONS", "K8S_VERSION", "KINDS", "generate", "read_models"]

# The Kubernetes release whose schemas (from kubernetes-validate) the manifests are checked against.
K8S_VERSION = "1.36"
K8S_DEFINITIONS = "https://kubernetes.io/api/_definitions.json"
# kind -> (model class, apiVersion)
KINDS = {
    "ServingRuntime": ("V1alpha1ServingRuntime", "serving.kserve.io/v1alpha1"),
    "InferenceService": ("V1beta1InferenceService", "serving.kserve.io/v1beta1"),
}
_REQUIRED = re.compile(r"client_side_validation and (\w+) is None")
_K8S_GROUPS = ("io.k8s.api.core.v1", "io.k8s.apimachinery.pkg.apis.meta.v1")
_PRIMITIVES: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "object": {},
    "datetime": {"type": "string"},
    "date": {"type": "string"},
}


class Model:
    def __init__(self, name: str, types: dict[str, str], keys: dict[str, str], required: list[str]) -> None:
        self.name, self.types, self.keys, self.required = name, types, keys, required


def _parse(source: str) -> Model | None:
    tree = ast.parse(source)
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        found: dict[str, Any] = {}
        for stmt in node.body:
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
            if isinstance(target, ast.Name) and target.id in ("openapi_types", "attribute_map"):
                found[target.id] = ast.literal_eval(stmt.value)
        if "openapi_types" in found:
            required = sorted(set(_REQUIRED.findall(source)) & set(found["openapi_types"]))
            return Model(node.name, found["openapi_types"], found["attribute_map"], required)
    return None


def read_models(source: Path) -> tuple[str, dict[str, Model]]:
    """``(kserve version, {class name: Model})`` from a kserve wheel or an installed ``kserve`` directory."""
    texts: dict[str, str] = {}
    version = "unknown"
    if source.is_file():
        with zipfile.ZipFile(source) as wheel:
            for name in wheel.namelist():
                if name.startswith("kserve/models/") and name.endswith(".py"):
                    texts[name] = wheel.read(name).decode()
                if name.endswith(".dist-info/METADATA"):
                    version = re.search(r"^Version: (\S+)", wheel.read(name).decode(), re.M).group(1)
    else:
        for path in sorted((source / "models").glob("*.py")):
            texts[path.name] = path.read_text()
    models = {}
    for text in texts.values():
        model = _parse(text)
        if model is not None:
            models[model.name] = model
    return version, models


def _k8s_name(cls: str, k8s_defs: dict[str, Any]) -> str | None:
    """``V1Container`` -> ``io.k8s.api.core.v1.Container``; ``K8sIoApiAppsV1X`` -> ``io.k8s.api.apps.v1.X``."""
    if cls == "ResourceQuantity":
        return "io.k8s.apimachinery.pkg.api.resource.Quantity"
    m = re.fullmatch(r"K8sIo(Api|Apimachinery)([A-Z][a-z0-9]+)(V\d+(?:(?:alpha|beta)\d+)?)([A-Z]\w*)", cls)
    if m:
        root = "io.k8s.api" if m.group(1) == "Api" else "io.k8s.apimachinery.pkg.apis"
        name = f"{root}.{m.group(2).lower()}.{m.group(3).lower()}.{m.group(4)}"
        return name if name in k8s_defs else None
    m = re.fullmatch(r"V1([A-Z]\w*)", cls)
    if m:
        for group in _K8S_GROUPS:
            if f"{group}.{m.group(1)}" in k8s_defs:
                return f"{group}.{m.group(1)}"
    return None


def generate(source: Path, k8s_defs: dict[str, Any]) -> dict[str, Any]:
    """The schema document: ``definitions`` of every reachable kserve model, and one entry per kind."""
    version, models = read_models(source)
    definitions: dict[str, Any] = {}
    unresolved: set[str] = set()

    def schema_of(type_name: str) -> dict[str, Any]:
        if type_name in _PRIMITIVES:
            return dict(_PRIMITIVES[type_name])
        m = re.fullmatch(r"list\[(.+)\]", type_name)
        if m:
            return {"type": "array", "items": schema_of(m.group(1))}
        m = re.fullmatch(r"dict\(str, (.+)\)", type_name)
        if m:
            return {"type": "object", "additionalProperties": schema_of(m.group(1))}
        if type_name in models:
            define(type_name)
            return {"$ref": f"#/$defs/{type_name}"}
        k8s = _k8s_name(type_name, k8s_defs)
        if k8s is not None:
            return {"$ref": f"{K8S_DEFINITIONS}#/$defs/{k8s}"}
        unresolved.add(type_name)
        return {}

    def define(name: str) -> None:
        if name in definitions:
            return
        definitions[name] = {}  # placeholder against cycles
        model = models[name]
        properties = {model.keys[attr]: schema_of(t) for attr, t in sorted(model.types.items())}
        definitions[name] = {
            "type": "object",
            "properties": properties,
            "additionalProperties": False,  # a misspelt field is an error, as with kubectl --validate=strict
            **({"required": [model.keys[a] for a in model.required]} if model.required else {}),
        }

    kinds = {}
    for kind, (cls, api_version) in KINDS.items():
        kinds[kind] = {
            "allOf": [
                schema_of(cls),
                {
                    "properties": {"apiVersion": {"const": api_version}, "kind": {"const": kind}},
                    "required": ["apiVersion", "kind", "metadata", "spec"],
                },
            ]
        }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://lu-service.invalid/kserve-{version}.schema.json",
        "description": f"ServingRuntime and InferenceService of KServe {version}, from kserve/models (tests/deploy/kserve_schema.py)",
        "x-kserve-version": version,
        "x-unresolved-types": sorted(unresolved),
        "kinds": kinds,
        "$defs": dict(sorted(definitions.items())),
    }


def k8s_definitions(strict: bool = True) -> dict[str, Any]:
    """The ``$defs`` of kubernetes-validate's schemas for :data:`K8S_VERSION`."""
    from importlib.resources import files

    folder = f"v{K8S_VERSION}.0-local" + ("-strict" if strict else "")
    path = files("kubernetes_validate") / "kubernetes-json-schema" / folder / "_definitions.json"
    return json.loads(path.read_text())


def main(argv: list[str]) -> int:
    doc = generate(Path(argv[0]), k8s_definitions()["$defs"])
    sys.stdout.write(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
