"""HTTP/JSON beside gRPC: every unary RPC of the Recommender service as ``POST /v1/<Rpc>``.

The body is the RPC's request message in protobuf's JSON mapping (``json_format``) and
the reply its response message the same way. A call runs the servicer's own method with
a context that records what it aborts with, so validation, limits and status codes are
the gRPC ones; :data:`HTTP_STATUS` (google's gRPC-to-HTTP table) is the one place a status
code becomes an HTTP status. The transport (body size, content type, timeouts) is
``service/serving/http.py``'s.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence

import grpc
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message

from ordrec.service.metrics import Metrics
from ordrec.service.serving.security import AccessPolicy
from ordrec.v1 import recommender_pb2 as pb

log = logging.getLogger("ordrec.http")
SERVICE = pb.DESCRIPTOR.services_by_name["Recommender"]
JSON_TYPE = "application/json"
_MAX_MESSAGE_CHARS = 1000  # a parse error quotes the value: a 4 MB string must not come back whole

# google.rpc.Code's HTTP mapping (googleapis/google/rpc/code.proto), as grpc-gateway uses it.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}


class HttpError(Exception):
    """A refused request: its gRPC status code, a message for the caller and the HTTP
    status: the table's, unless the transport refused it before any RPC (413, 415, ...)."""

    def __init__(self, code: grpc.StatusCode, message: str, http_status: int | None = None):
        super().__init__(message)
        self.code, self.message = code, message[:_MAX_MESSAGE_CHARS]
        self.http_status = http_status or HTTP_STATUS[code]

    def body(self) -> bytes:
        """The JSON error body: ``{"code": <HTTP status>, "message": ..., "status": <gRPC code name>}``."""
        return json.dumps(
            {"code": self.http_status, "message": self.message, "status": self.code.name}
        ).encode()


class Aborted(Exception):
    """Raised by :meth:`HttpCallContext.abort`, as grpcio's ``context.abort`` raises."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class HttpCallContext:
    """The parts of ``grpc.ServicerContext`` the servicer uses, for a call that came over
    HTTP: ``abort`` records the code and message and raises :class:`Aborted`."""

    def __init__(self, metadata: Sequence[tuple[str, str]], peer: str):
        self._metadata, self._peer = tuple(metadata), peer
        self._code: grpc.StatusCode | None = None
        self._details = ""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details
        raise Aborted(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def time_remaining(self) -> float | None:
        return None  # HTTP carries no deadline; the client's own timeout ends its wait

    def is_active(self) -> bool:
        return True

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer


def full_method(name: str) -> str:
    """The gRPC path of the service's RPC ``name`` (what the access policy is keyed by)."""
    return f"/{SERVICE.full_name}/{name}"


def unary_methods() -> list[MethodDescriptor]:
    """The RPCs the JSON API answers: every method of the service that is not streaming."""
    return [m for m in SERVICE.methods if not (m.client_streaming or m.server_streaming)]


def parse_request(method: MethodDescriptor, body: bytes) -> Message:
    """The request message of ``method`` from a JSON body (an empty body is ``{}``);
    anything else is INVALID_ARGUMENT naming what is wrong."""
    message = message_factory.GetMessageClass(method.input_type)()
    type_name = method.input_type.full_name
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HttpError(
            grpc.StatusCode.INVALID_ARGUMENT, f"the body is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    if not text.strip():
        return message
    if not text.lstrip().startswith("{"):
        raise HttpError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the body must be a JSON object: a {type_name} in protobuf's JSON mapping",
        )
    try:
        json_format.Parse(text, message)
    except (json_format.ParseError, RecursionError) as exc:
        raise HttpError(grpc.StatusCode.INVALID_ARGUMENT, f"not a valid {type_name}: {exc}") from None
    return message


def reply_json(reply: Message) -> bytes:
    """A reply in protobuf's JSON mapping, every field present (zeros and empty lists too,
    so a browser client need not know proto3's defaults)."""
    text = json_format.MessageToJson(
        reply, indent=None, ensure_ascii=False, always_print_fields_with_no_presence=True
    )
    return text.encode("utf-8")


class JsonGateway:
    """Answers ``POST /v1/<Rpc>`` with the servicer's methods; counted in the gRPC metrics
    under the same labels as a gRPC call, refusals included."""

    def __init__(self, servicer, metrics: Metrics, access: AccessPolicy):
        self.servicer, self.metrics, self.access = servicer, metrics, access
        self.methods = {m.name: m for m in unary_methods()}

    def secured(self, name: str) -> bool:
        """Whether calls of the RPC ``name`` need a token (the access policy checks them)."""
        return self.access.checks(full_method(name))

    def method(self, name: str) -> MethodDescriptor:
        """The unary RPC ``name``: NOT_FOUND for no such RPC, UNIMPLEMENTED for a streaming one."""
        method = self.methods.get(name)
        if method is not None:
            return method
        if name in SERVICE.methods_by_name:
            raise HttpError(grpc.StatusCode.UNIMPLEMENTED, f"{name} is a streaming RPC: call it over gRPC")
        listed = ", ".join(sorted(self.methods))
        raise HttpError(grpc.StatusCode.NOT_FOUND, f"no RPC {name[:64]!r}; the JSON API has {listed}")

    def call(
        self,
        method: MethodDescriptor,
        headers: Sequence[tuple[str, str]],
        read_body: Callable[[], bytes],
        peer: str = "",
    ) -> bytes:
        """The JSON reply of one call, or :class:`HttpError`. ``read_body`` is called after
        the token check and raises the transport's refusals (size, type, timeout)."""
        meter = self.metrics.calls.meter("unary", SERVICE.full_name, method.name)
        meter.start()
        start = time.perf_counter()
        code = grpc.StatusCode.UNKNOWN
        try:
            reply = self._answer(method, headers, read_body, peer)
            code = grpc.StatusCode.OK
            return reply
        except HttpError as exc:
            code = exc.code
            raise
        except Exception:  # noqa: BLE001 - anything else is ours, logged and answered INTERNAL
            log.exception("JSON %s failed", method.name)
            code = grpc.StatusCode.INTERNAL
            raise HttpError(code, "internal error (logged on the server)") from None
        finally:
            meter.finish(code.name, time.perf_counter() - start)

    def _answer(self, method, headers, read_body, peer: str) -> bytes:
        if self.secured(method.name):
            authorization = next((v for k, v in headers if k == "authorization"), None)
            # http.server decodes header bytes as latin-1: encode back to the bytes that came
            refusal = self.access.refusal(
                full_method(method.name),
                authorization.encode("latin-1") if authorization is not None else None,
                "header",
            )
            if refusal:
                raise HttpError(refusal.code, refusal.message)
        request = parse_request(method, read_body())
        context = HttpCallContext(headers, peer)
        try:
            reply = getattr(self.servicer, method.name)(request, context)
        except Aborted as exc:
            raise HttpError(exc.code, exc.details) from None
        code = context.code()
        if code is not None and code != grpc.StatusCode.OK:
            raise HttpError(code, context.details())
        return reply_json(reply)
