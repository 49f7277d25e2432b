"""Optional bearer-token authentication, the admin scope, and TLS.

Tokens come from a file (one a line, so a token can be rotated by listing
old and new together) or an environment variable, and are compared in
constant time. The health service stays open so orchestrators can probe
without credentials; everything else (reflection included) needs a token
when tokens are configured.

Admin calls (:data:`ADMIN_METHODS`: erasing a user, hiding and unhiding items) need an
admin token (``--admin-token-file`` / ``--admin-token-env``), which every other call
accepts too. A server with no admin token refuses them unless started with
``--admin-open``. :class:`AccessPolicy` decides, for gRPC and HTTP alike, and says why
with the status code the refusal carries.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
_SCHEME = b"bearer"  # compared case-insensitively (RFC 7235, section 2.1)
ADMIN_METHODS = frozenset(
    f"/ordrec.v1.Recommender/{name}" for name in ("ForgetUser", "HideItems", "UnhideItems")
)


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


def presented_token(authorization: str | bytes | None) -> bytes:
    """The token of an ``authorization`` value ``Bearer <token>`` (any case of the scheme),
    or b"" when it holds none."""
    raw = authorization if isinstance(authorization, bytes) else (authorization or "").encode()
    scheme, _, token = raw.strip().partition(b" ")
    return token.strip() if scheme.lower() == _SCHEME else b""


def bearer_refusal(authorization: str | bytes | None, tokens: list[bytes], where: str) -> str | None:
    """Why an ``authorization`` value (``Bearer <token>``) is refused, or None when it
    holds an accepted token: the one check of gRPC metadata and HTTP headers alike.
    ``where`` names the carrier in the message (e.g. "metadata", "header")."""
    presented = presented_token(authorization)
    if not presented:
        return f"missing bearer token ({where} 'authorization: Bearer <token>')"
    if not _token_matches(presented, tokens):
        return "invalid bearer token"
    return None


@dataclass(frozen=True)
class Refusal:
    """A refused call: the status code it ends with and the message for the caller."""

    code: grpc.StatusCode
    message: str


class AccessPolicy:
    """Who may call what (see the module docstring).

    ``tokens``: the ordinary scope (empty: ordinary calls are open); ``admin_tokens``:
    the admin scope, also accepted on ordinary calls; ``admin_open``: with no admin token,
    admin calls are checked as ordinary ones (the behaviour before the admin scope).
    """

    def __init__(
        self, tokens: list[bytes], admin_tokens: list[bytes] | None = None, admin_open: bool = False
    ):
        self.admin_tokens = list(admin_tokens or [])
        if admin_open and self.admin_tokens:
            raise ValueError("--admin-open is for a server without admin tokens: give one or the other")
        self.tokens, self.admin_open = list(tokens), admin_open
        self.secured = bool(self.tokens)  # whether ordinary calls need a token

    def checks(self, full_method: str) -> bool:
        """Whether calls of ``full_method`` are checked at all (health checks never are)."""
        if full_method.startswith(_OPEN_PREFIXES):
            return False
        return self.secured or (full_method in ADMIN_METHODS and not self.admin_open)

    def refusal(self, full_method: str, authorization: str | bytes | None, where: str) -> Refusal | None:
        """Why a call of ``full_method`` with this ``authorization`` value is refused, or None."""
        if full_method in ADMIN_METHODS and not self.admin_open:
            return self._admin_refusal(full_method, authorization, where)
        if not self.secured:
            return None
        why = bearer_refusal(authorization, self.tokens + self.admin_tokens, where)
        return Refusal(grpc.StatusCode.UNAUTHENTICATED, why) if why else None

    def metadata_refusal(self, full_method: str, metadata) -> Refusal | None:
        """:meth:`refusal` for a gRPC call's invocation ``metadata``."""
        authorization = None
        for key, value in metadata or ():
            if key == "authorization":
                authorization = value
        return self.refusal(full_method, authorization, "metadata")

    def _admin_refusal(self, full_method: str, authorization, where: str) -> Refusal | None:
        name = full_method.rsplit("/", 1)[-1]
        if not self.admin_tokens:
            return Refusal(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{name} is an admin call and this server has no admin token"
                " (--admin-token-file or --admin-token-env; --admin-open lets any caller make it)",
            )
        why = bearer_refusal(authorization, self.tokens + self.admin_tokens, where)
        if why:
            return Refusal(grpc.StatusCode.UNAUTHENTICATED, f"{name} needs an admin token: {why}")
        if not _token_matches(presented_token(authorization), self.admin_tokens):
            return Refusal(
                grpc.StatusCode.PERMISSION_DENIED, f"{name} needs an admin token, not an ordinary one"
            )
        return None


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(Path(key_file).read_bytes(), Path(cert_file).read_bytes())])
