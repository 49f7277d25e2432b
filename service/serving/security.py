"""Optional bearer-token authentication and TLS.

Tokens come from a file (one a line, so a token can be rotated by listing
old and new together) or an environment variable, and are compared in
constant time. The health service stays open so orchestrators can probe
without credentials; everything else (reflection included) needs a token.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

import grpc

_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def load_tokens(token_file: str | None, token_env: str | None) -> list[bytes]:
    tokens: list[str] = []
    if token_file:
        tokens += [line.strip() for line in Path(token_file).read_text().splitlines() if line.strip()]
    if token_env:
        value = os.environ.get(token_env, "").strip()
        if not value:
            raise ValueError(f"environment variable {token_env} holds no token")
        tokens.append(value)
    if (token_file or token_env) and not tokens:
        raise ValueError(f"{token_file}: holds no token")
    for token in tokens:
        if len(token) < 16:
            raise ValueError("tokens must be at least 16 characters")
    return [t.encode() for t in tokens]


def _token_matches(presented: bytes, tokens: list[bytes]) -> bool:
    # Compare against every token (no early exit) so timing does not tell which matched.
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(presented, token)
    return matched


def _deny(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    def abort(request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.unary_unary:
        return handler._replace(unary_unary=abort)
    if handler.unary_stream:

        def abort_stream(request, context):
            abort(request, context)
            yield  # pragma: no cover - abort raises

        return handler._replace(unary_stream=abort_stream)
    if handler.stream_stream:

        def abort_bidi(requests, context):
            abort(None, context)
            yield  # pragma: no cover

        return handler._replace(stream_stream=abort_bidi)
    return handler._replace(stream_unary=lambda requests, context: abort(None, context))


def bearer_refusal(authorization: str | bytes | None, tokens: list[bytes], where: str) -> str | None:
    """Why an ``authorization`` value (``Bearer <token>``) is refused, or None when it
    holds an accepted token: the one check of gRPC metadata and HTTP headers alike.
    ``where`` names the carrier in the message (e.g. "metadata", "header")."""
    raw = authorization if isinstance(authorization, bytes) else (authorization or "").encode()
    presented = raw[len(b"Bearer ") :].strip() if raw.startswith(b"Bearer ") else b""
    if not presented:
        return f"missing bearer token ({where} 'authorization: Bearer <token>')"
    if not _token_matches(presented, tokens):
        return "invalid bearer token"
    return None


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """``authorization: Bearer <token>`` on every call but health checks."""

    def __init__(self, tokens: list[bytes]):
        if not tokens:
            raise ValueError("TokenAuthInterceptor needs at least one token")
        self.tokens = tokens

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self.checked(handler, handler_call_details)

    def checked(self, handler: grpc.RpcMethodHandler, handler_call_details) -> grpc.RpcMethodHandler:
        """``handler`` when the call may proceed, else one that refuses it UNAUTHENTICATED."""
        if handler_call_details.method.startswith(_OPEN_PREFIXES):
            return handler
        authorization = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                authorization = value
        refusal = bearer_refusal(authorization, self.tokens, "metadata")
        return handler if refusal is None else _deny(handler, refusal)


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(Path(key_file).read_bytes(), Path(cert_file).read_bytes())])
