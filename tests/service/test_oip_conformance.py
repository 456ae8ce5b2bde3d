"""/v2 against the Open Inference Protocol: the OpenAPI schemas follow the specification, and the service its schemas.

The REST specification's objects (kserve/open-inference-protocol,
``specification/protocol/open_inference_rest.yaml`` and ``inference_rest.md``)
are listed below with their fields and required fields, as the specification
states them; the service's own document must have exactly those. Schemathesis
then drives every /v2 route from that document in positive mode: no 5xx, and
every response matches its declared schema.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance

from service.app import create_app
from tests.service.conftest import make_settings

# object: (fields, required), from the specification's text.
SPEC = {
    "metadata_server_response": ({"name", "version", "extensions"}, {"name", "version", "extensions"}),
    "metadata_server_error_response": ({"error"}, {"error"}),
    "metadata_model_response": ({"name", "versions", "platform", "inputs", "outputs"}, {"name", "platform"}),
    "metadata_tensor": ({"name", "datatype", "shape"}, {"name", "datatype", "shape"}),
    "metadata_model_error_response": ({"error"}, {"error"}),
    "inference_request": ({"id", "parameters", "inputs", "outputs"}, {"inputs"}),
    "request_input": ({"name", "shape", "datatype", "parameters", "data"}, {"name", "shape", "datatype", "data"}),
    "request_output": ({"name", "parameters"}, {"name"}),
    "response_output": ({"name", "shape", "datatype", "parameters", "data"}, {"name", "shape", "datatype", "data"}),
    "inference_response": ({"model_name", "model_version", "id", "parameters", "outputs"}, {"model_name", "outputs"}),
    "inference_error_response": ({"error"}, {"error"}),
    "live_response": ({"live"}, {"live"}),
    "ready_response": ({"ready"}, {"ready"}),
    "model_ready_response": ({"name", "ready"}, {"name", "ready"}),
}
ROUTES = {
    ("/v2/", "get"): "metadata_server_response",
    ("/v2/health/live", "get"): "live_response",
    ("/v2/health/ready", "get"): "ready_response",
    ("/v2/models/{model}", "get"): "metadata_model_response",
    ("/v2/models/{model}/versions/{version}", "get"): "metadata_model_response",
    ("/v2/models/{model}/ready", "get"): "model_ready_response",
    ("/v2/models/{model}/versions/{version}/ready", "get"): "model_ready_response",
    ("/v2/models/{model}/infer", "post"): "inference_response",
    ("/v2/models/{model}/versions/{version}/infer", "post"): "inference_response",
}

APP = create_app(make_settings(max_elements=4096, max_request_bytes=1 << 20))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).include(path_regex=r"^/v2")
schema.config.generation.update(modes=[GenerationMode.POSITIVE])


def test_the_document_follows_the_specification_field_for_field():
    document = APP.openapi()
    components = document["components"]["schemas"]
    for name, (fields, required) in SPEC.items():
        assert set(components[name]["properties"]) == fields, name
        assert set(components[name]["required"]) == required, name
    for (path, method), response in ROUTES.items():
        ok = document["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": f"#/components/schemas/{response}"}, path
    infer = document["paths"]["/v2/models/{model}/infer"]["post"]["requestBody"]["content"]
    assert infer["application/json"]["schema"] == {"$ref": "#/components/schemas/inference_request"}


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
def test_v2_answers_follow_their_schemas(case):
    response = case.call()
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
