"""OpenAPI documents for bodies the routes read themselves (for /docs, clients and schemathesis).

The routes decode bodies with :mod:`service.codec` (orjson, zero-copy binary),
not with pydantic, so their request and response shapes are described here.
"""

from __future__ import annotations

from typing import Any

from service.codec import DATATYPES, JSON_DTYPES
from service.operations import Operation

__all__ = ["native_openapi", "v2_openapi"]

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
    props.update({k: {"type": "boolean", "default": v} for k, v in op.options.items()})
    request = {"type": "object", "required": list(op.inputs), "properties": props, "additionalProperties": False}
    response = {"type": "object", "properties": {name: _TENSOR_OUT for name in op.outputs}}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}, **_BINARY}},
        "responses": {"200": {"content": {"application/json": {"schema": response}, **_BINARY}}, **_errors()},
    }


def v2_openapi(op: Operation) -> dict[str, Any]:
    tensor = {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string", "enum": list(op.inputs)},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "datatype": {"type": "string", "enum": list(DATATYPES)},
            "parameters": {"type": "object"},
            "data": _NESTED,
        },
    }
    params = {k: {"type": "boolean", "default": v} for k, v in op.options.items()}
    params["binary_data_output"] = {"type": "boolean"}
    request = {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {"type": "object", "properties": params, "additionalProperties": False},
            "inputs": {"type": "array", "items": tensor},
            "outputs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "enum": list(op.outputs)},
                        "parameters": {"type": "object"},
                    },
                },
            },
        },
    }
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}, **_BINARY}},
        "responses": {"200": {"content": {"application/json": {"schema": {"type": "object"}}, **_BINARY}}, **_errors()},
    }
