"""OpenAPI documents for bodies the routes read themselves (for /docs, clients and schemathesis).

The routes decode bodies with :mod:`service.codec` (orjson, zero-copy binary),
not with pydantic, so their request and response shapes are described here.
"""

from __future__ import annotations

from typing import Any

from service.codec import DATATYPES, JSON_DTYPES
from service.operations import Operation, option_schema

__all__ = ["install_components", "native_openapi", "v2_health_openapi", "v2_infer_openapi", "v2_openapi"]

_NUMBER: dict[str, Any] = {"anyOf": [{"type": "number"}, {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]}]}
_NESTED: dict[str, Any] = {
    "description": "Row-major nested lists of numbers; complex elements are [re, im] pairs.",
    "type": "array",
    "items": {},
}
_TENSOR: dict[str, Any] = {
    "description": "A nested list (float64; int32 for pivots) or the typed object form.",
    "anyOf": [
        {"type": "array", "items": {"anyOf": [_NUMBER, {"type": "array"}]}},
        {
            "type": "object",
            "required": ["data"],
            "additionalProperties": False,
            "properties": {
                "dtype": {"type": "string", "enum": list(JSON_DTYPES)},
                "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "data": _NESTED,
            },
        },
    ],
}
_TENSOR_OUT: dict[str, Any] = {
    "type": ["object", "null"],
    "properties": {
        "dtype": {"type": "string", "enum": list(JSON_DTYPES)},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "data": _NESTED,
    },
}
_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error", "code", "request_id"],
    "properties": {
        "error": {"type": "string"},
        "code": {"type": "string"},
        "request_id": {"type": "string"},
        "indices": {"type": "array", "description": "singular_matrix only: batch indices"},
        "info": {"type": "array", "description": "singular_matrix only: LAPACK info per index"},
    },
}
_BINARY = {
    "application/octet-stream": {
        "schema": {
            "type": "string",
            "format": "binary",
            "description": "OIP binary tensor extension: a JSON header of Inference-Header-Content-Length "
            "bytes, then each tensor's raw little-endian bytes.",
        }
    }
}
_STATUSES = {
    "400": "Malformed body.",
    "401": "Missing or wrong API key (only when LU_API_KEY is set).",
    "408": "deadline_exceeded: the request's timeout (Triton's option, microseconds) passed while it was queued.",
    "413": "Body over LU_MAX_REQUEST_BYTES, or tensors over LU_MAX_ELEMENTS.",
    "415": "Unsupported content type.",
    "422": "Well-formed but invalid: shapes, dtypes, pivots, options, a singular system.",
    "503": "Overloaded or out of device memory; see Retry-After.",
}


def _errors() -> dict[str, Any]:
    return {
        code: {"description": text, "content": {"application/json": {"schema": _ERROR}}}
        for code, text in _STATUSES.items()
    }


def native_openapi(op: Operation) -> dict[str, Any]:
    props: dict[str, Any] = {name: _TENSOR for name in op.inputs}
    props.update({k: option_schema(v) for k, v in op.options.items()})
    request = {"type": "object", "required": list(op.inputs), "properties": props, "additionalProperties": False}
    response = {"type": "object", "properties": {name: _TENSOR_OUT for name in op.outputs}}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}, **_BINARY}},
        "responses": {"200": {"content": {"application/json": {"schema": response}, **_BINARY}}, **_errors()},
    }


# ---------------------------------------------------------------- the Open Inference Protocol (/v2)
# Written from the protocol's REST text (kserve/open-inference-protocol,
# specification/protocol/open_inference_rest.yaml and inference_rest.md), object for object and
# field for field, with the same names and required fields. Where the service knows more (the
# model names, the datatypes, its option names) the enums narrow a field; they never add one.


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


_STRING: dict[str, Any] = {"type": "string"}
_STRINGS: dict[str, Any] = {"type": "array", "items": _STRING}
_SHAPE: dict[str, Any] = {"type": "array", "items": {"type": "integer"}}


def _oip_schemas() -> dict[str, Any]:
    from service.operations import OPERATIONS  # (the registry, for the names the enums list)

    inputs = sorted({n for op in OPERATIONS.values() for n in op.inputs})
    outputs = sorted({n for op in OPERATIONS.values() for n in op.outputs})
    # Each option's schema (boolean, or a string or integer option of the refined operations), without
    # its default: the same name means the same thing in every model.
    specs = {k: spec for op in OPERATIONS.values() for k, spec in op.options.items()}
    parameters = {
        k: {f: v for f, v in option_schema(spec).items() if f != "default"} for k, spec in sorted(specs.items())
    }
    parameters.update(
        {
            "binary_data_output": {"type": "boolean"},
            "timeout": {"type": "integer", "minimum": 0, "description": "Microseconds (Triton); 0: none."},
            "priority": {"type": "integer", "minimum": 0},
        }
    )
    return {
        "metadata_server_response": _object(
            ["name", "version", "extensions"], name=_STRING, version=_STRING, extensions=_STRINGS
        ),
        "metadata_server_error_response": _object(["error"], error=_STRING),
        "metadata_model_response": _object(
            ["name", "platform"],
            name=_STRING,
            versions=_STRINGS,
            platform=_STRING,
            inputs={"type": "array", "items": _ref("metadata_tensor")},
            outputs={"type": "array", "items": _ref("metadata_tensor")},
        ),
        "metadata_tensor": _object(["name", "datatype", "shape"], name=_STRING, datatype=_STRING, shape=_SHAPE),
        "metadata_model_error_response": _object(["error"], error=_STRING),
        "inference_request": _object(
            ["inputs"],
            id=_STRING,
            parameters={**_ref("parameters"), "properties": parameters, "additionalProperties": False},
            inputs={"type": "array", "items": _ref("request_input")},
            outputs={"type": "array", "items": _ref("request_output")},
        ),
        "parameters": {"type": "object", "description": "Parameters: name to value."},
        "request_input": _object(
            ["name", "shape", "datatype", "data"],
            name={"type": "string", "enum": inputs},
            shape={"type": "array", "items": {"type": "integer", "minimum": 0}},
            datatype={"type": "string", "enum": list(DATATYPES)},
            parameters=_ref("parameters"),
            data=_ref("tensor_data"),
        ),
        "tensor_data": {
            "type": "array",
            "items": {"anyOf": [_ref("tensor_data"), {"type": "number"}, _STRING, {"type": "boolean"}]},
        },
        "request_output": _object(["name"], name={"type": "string", "enum": outputs}, parameters=_ref("parameters")),
        "response_output": _object(
            ["name", "shape", "datatype", "data"],
            name=_STRING,
            shape=_SHAPE,
            datatype=_STRING,
            parameters=_ref("parameters"),
            data=_ref("tensor_data"),
        ),
        "inference_response": _object(
            ["model_name", "outputs"],
            model_name=_STRING,
            model_version=_STRING,
            id=_STRING,
            parameters=_ref("parameters"),
            outputs={"type": "array", "items": _ref("response_output")},
        ),
        "inference_error_response": _object(["error"], error=_STRING),
        # inference_rest.md's health bodies (the YAML leaves them out).
        "live_response": _object(["live"], live={"type": "boolean"}),
        "ready_response": _object(["ready"], ready={"type": "boolean"}),
        "model_ready_response": _object(["name", "ready"], name=_STRING, ready={"type": "boolean"}),
    }


def _json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _error(description: str, protocol_error: str) -> dict[str, Any]:
    # The protocol's error object ({"error"}) plus this service's code and request id.
    return {"description": description, "content": _json_content({"allOf": [_ref(protocol_error), _ERROR]})}


_UNAUTHORIZED = "Missing or wrong API key (only when LU_API_KEY is set)."
_NOT_READY = "Not ready (warming up, or stopping)."


def v2_openapi(kind: str) -> dict[str, Any]:
    """Responses of the metadata routes: ``kind`` is ``metadata_server`` or ``metadata_model``."""
    responses = {
        "200": {"description": "OK", "content": _json_content(_ref(f"{kind}_response"))},
        "401": _error(_UNAUTHORIZED, f"{kind}_error_response"),
    }
    if kind == "metadata_model":
        responses["404"] = _error("No such model or version.", "metadata_model_error_response")
    return {"responses": responses}


def v2_health_openapi(kind: str) -> dict[str, Any]:
    """Responses of the health routes: ``kind`` is ``live``, ``ready`` or ``model_ready``."""
    body = _json_content(_ref(f"{kind}_response"))
    responses: dict[str, Any] = {"200": {"description": "OK", "content": body}}
    if kind != "live":
        responses["503"] = {"description": _NOT_READY, "content": body}
    if kind == "model_ready":
        responses["401"] = _error(_UNAUTHORIZED, "metadata_model_error_response")
        responses["404"] = _error("No such model or version.", "metadata_model_error_response")
    return {"responses": responses}


def v2_infer_openapi() -> dict[str, Any]:
    """Request and responses of ``POST /v2/models/{model}[/versions/{version}]/infer``."""
    errors = {code: _error(text, "inference_error_response") for code, text in _STATUSES.items()}
    errors["404"] = _error("No such model or version.", "inference_error_response")
    return {
        "requestBody": {"required": True, "content": {**_json_content(_ref("inference_request")), **_BINARY}},
        "responses": {
            "200": {"description": "OK", "content": {**_json_content(_ref("inference_response")), **_BINARY}},
            **errors,
        },
    }


def install_components(app: Any) -> None:
    """Add the protocol's named schemas to the app's OpenAPI document (the routes refer to them)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            document.setdefault("components", {}).setdefault("schemas", {}).update(_oip_schemas())
            _validation_errors_follow_the_error_model(document)
        return app.openapi_schema

    app.openapi = openapi


def _validation_errors_follow_the_error_model(document: dict[str, Any]) -> None:
    # FastAPI documents a 422 HTTPValidationError for every route with parameters; the
    # service's handler answers those in its own error model (errors.py), so say that.
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            response = operation.get("responses", {}).get("422")
            if response is None:
                continue
            schema = response.get("content", {}).get("application/json", {}).get("schema", {})
            if schema.get("$ref", "").endswith("/HTTPValidationError"):
                del schema["$ref"]
                if not schema:
                    schema.update(_ERROR)
