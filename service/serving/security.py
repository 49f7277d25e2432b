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


class TokenCheck:
    """``authorization: Bearer <token>`` on every call but health checks."""

    def __init__(self, tokens: list[bytes]):
        if not tokens:
            raise ValueError("TokenCheck needs at least one token")
        self.tokens = tokens

    @staticmethod
    def is_open(full_method: str) -> bool:
        """Whether calls of ``full_method`` need no token (health checks)."""
        return full_method.startswith(_OPEN_PREFIXES)

    def refusal(self, metadata) -> str | None:
        """Why a call with this invocation ``metadata`` is refused, or None when it may proceed."""
        authorization = None
        for key, value in metadata or ():
            if key == "authorization":
                authorization = value
        return bearer_refusal(authorization, self.tokens, "metadata")


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(Path(key_file).read_bytes(), Path(cert_file).read_bytes())])
