"""The OpenAPI 3 document of the JSON API, built from the proto descriptors at start-up.

Every unary RPC is ``POST /v1/<Rpc>``; every message reachable from them is a schema
under ``components/schemas`` named by its full proto name, with the JSON field names
``json_format`` reads and writes (lowerCamelCase), int64 as strings, enums by name
(numbers are accepted too), maps as objects. Nothing here is written by hand per RPC:
a field or RPC added to the proto appears in the document.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from ordrec.service.serving.gateway import HTTP_STATUS, SERVICE, unary_methods

_F = FieldDescriptor
_SCALARS: dict[int, dict[str, Any]] = {
    _F.TYPE_DOUBLE: {"type": "number", "format": "double"},
    _F.TYPE_FLOAT: {"type": "number", "format": "float"},
    _F.TYPE_INT32: {"type": "integer", "format": "int32"},
    _F.TYPE_SINT32: {"type": "integer", "format": "int32"},
    _F.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    _F.TYPE_UINT32: {"type": "integer", "format": "int64", "minimum": 0},
    _F.TYPE_FIXED32: {"type": "integer", "format": "int64", "minimum": 0},
    # 64-bit integers are JSON strings in protobuf's mapping (numbers are accepted on input)
    _F.TYPE_INT64: {"type": "string", "format": "int64"},
    _F.TYPE_SINT64: {"type": "string", "format": "int64"},
    _F.TYPE_SFIXED64: {"type": "string", "format": "int64"},
    _F.TYPE_UINT64: {"type": "string", "format": "uint64"},
    _F.TYPE_FIXED64: {"type": "string", "format": "uint64"},
    _F.TYPE_BOOL: {"type": "boolean"},
    _F.TYPE_STRING: {"type": "string"},
    _F.TYPE_BYTES: {"type": "string", "format": "byte"},
}
_ERROR = {
    "type": "object",
    "description": "Every error: the HTTP status, a message for the caller and the gRPC status code's name.",
    "properties": {
        "code": {"type": "integer", "description": "the HTTP status"},
        "message": {"type": "string"},
        "status": {"type": "string", "enum": sorted(code.name for code in HTTP_STATUS)},
    },
    "required": ["code", "message", "status"],
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


class _Schemas:
    """Collects a schema for each message and enum reachable from the RPCs."""

    def __init__(self) -> None:
        self.schemas: dict[str, dict[str, Any]] = {}

    def message(self, descriptor: Descriptor) -> dict[str, str]:
        name = descriptor.full_name
        if name not in self.schemas:
            self.schemas[name] = {}  # placed first: a message that refers to itself stops here
            self.schemas[name] = {
                "type": "object",
                "properties": {f.json_name: self._field(f) for f in descriptor.fields},
            }
        return _ref(name)

    def enum(self, descriptor: EnumDescriptor) -> dict[str, Any]:
        name = descriptor.full_name
        if name not in self.schemas:
            self.schemas[name] = {
                "description": "by name; the number is accepted on input",
                "anyOf": [
                    {"type": "string", "enum": [v.name for v in descriptor.values]},
                    {"type": "integer", "enum": [v.number for v in descriptor.values]},
                ],
            }
        return _ref(name)

    def _value(self, field: FieldDescriptor) -> dict[str, Any]:
        if field.type == _F.TYPE_MESSAGE:
            return self.message(field.message_type)
        if field.type == _F.TYPE_ENUM:
            return self.enum(field.enum_type)
        return dict(_SCALARS[field.type])

    def _field(self, field: FieldDescriptor) -> dict[str, Any]:
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            return {"type": "object", "additionalProperties": self._value(entry.fields_by_name["value"])}
        if field.is_repeated:
            return {"type": "array", "items": self._value(field)}
        return self._value(field)


def openapi_document(
    secured: Callable[[str], bool], title: str = "ordrec JSON API", version: str = "v1"
) -> dict[str, Any]:
    """The OpenAPI 3.0 document of ``POST /v1/<Rpc>`` for every unary RPC of the service;
    ``secured(name)``: the server wants a bearer token on calls of the RPC ``name``."""
    schemas = _Schemas()
    paths: dict[str, Any] = {}
    for method in unary_methods():
        operation: dict[str, Any] = {
            "operationId": method.name,
            "summary": f"{SERVICE.full_name}.{method.name} (gRPC) over HTTP/JSON",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": schemas.message(method.input_type)}},
            },
            "responses": {
                "200": {
                    "description": f"a {method.output_type.full_name}",
                    "content": {"application/json": {"schema": schemas.message(method.output_type)}},
                },
                "default": {
                    "description": "an error (HTTP status from the gRPC code: docs/service.md)",
                    "content": {"application/json": {"schema": _ref("Error")}},
                },
            },
        }
        if secured(method.name):
            operation["security"] = [{"bearerAuth": []}]
        paths[f"/v1/{method.name}"] = {"post": operation}
    components: dict[str, Any] = {"schemas": {**schemas.schemas, "Error": _ERROR}}
    if any(map(secured, (m.name for m in unary_methods()))):
        components["securitySchemes"] = {"bearerAuth": {"type": "http", "scheme": "bearer"}}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": title,
            "version": version,
            "description": f"Every unary RPC of {SERVICE.full_name} in protobuf's JSON mapping"
            " (proto/ordrec/v1/recommender.proto holds each field's documentation).",
        },
        "paths": paths,
        "components": components,
    }
