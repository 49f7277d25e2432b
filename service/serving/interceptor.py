"""The server's one interceptor: authentication, stream admission and metrics in one step.

grpcio runs every interceptor of a server on every call (a pipeline of
closures before the handler is found), and each layer cost about 7 us of
server CPU per call (docs/serving-cost.md). The three concerns stay in their
own modules; this runs them as one layer, in the order they had as three:
metrics outermost (refused calls are counted too), then the token check, then
stream admission innermost (a refused call never takes a stream slot).
"""

from __future__ import annotations

import grpc

from ordrec.service.metrics import MetricsInterceptor
from ordrec.service.serving.security import TokenAuthInterceptor
from ordrec.service.serving.streams import StreamGuard


class ServerInterceptor(grpc.ServerInterceptor):
    """Token check (when tokens are configured), stream admission and metrics for every call."""

    def __init__(self, metrics: MetricsInterceptor, guard: StreamGuard, auth: TokenAuthInterceptor | None):
        self.metrics, self.guard, self.auth = metrics, guard, auth

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        if self.auth is not None:
            handler = self.auth.checked(handler, handler_call_details)
        # Unary handlers come back from admitted() unchanged, so the metrics' per-method cache
        # holds for them; streams (rare) are wrapped per call, as before.
        return self.metrics.counted(self.guard.admitted(handler), handler_call_details.method)
