"""What the server runs around every call: the access check (tokens and the admin scope),
stream admission and metrics, applied to each handler once, when it is registered.

grpcio runs a server's interceptors on every call, before the handler is even found (a
pipeline of closures, then ours looking the wrapped handler up again); this wraps the
handlers themselves instead, so a call meets one Python function of ours before its
handler (``docs/serving-cost.md``, "Call metrics and the guard"). The order is the one the three
interceptors had: metrics outermost (refused calls are counted too), then the token
check, then stream admission innermost (a refused call never takes a stream slot).
:class:`GuardedRegistration` stands in for the server wherever services register (ours,
health, reflection), so nothing is registered unwrapped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import grpc

from ordrec.service.metrics import CallMetrics, ended_code, split_method
from ordrec.service.serving.security import AccessPolicy
from ordrec.service.serving.streams import StreamGuard


class CallGuard:
    """Wraps a method handler in the metrics, the access check (when the policy checks the
    method) and, for streams, admission and the watchdog."""

    def __init__(self, calls: CallMetrics, guard: StreamGuard, access: AccessPolicy):
        self.calls, self.guard, self.access = calls, guard, access

    def wrap(self, handler: grpc.RpcMethodHandler, full_method: str) -> grpc.RpcMethodHandler:
        """``handler`` with everything the server runs around a call of ``full_method``."""
        service, method = split_method(full_method)
        tokens = _MethodAccess(self.access, full_method) if self.access.checks(full_method) else None
        if handler.unary_unary:
            meter = self.calls.meter("unary", service, method)
            return handler._replace(unary_unary=_unary(handler.unary_unary, meter, tokens))
        if handler.unary_stream:
            meter = self.calls.meter("server_stream", service, method)
            behavior = self.guard.guarded(handler.unary_stream)
            return handler._replace(unary_stream=_stream(behavior, meter, tokens))
        # Client and bidi streams (reflection): admission and the token check, not counted.
        if handler.stream_stream:
            behavior = self.guard.guarded(handler.stream_stream)
            return handler._replace(stream_stream=_uncounted_stream(behavior, tokens))
        if handler.stream_unary:
            return handler._replace(stream_unary=_uncounted_unary(handler.stream_unary, tokens))
        return handler


class _MethodAccess:
    """The access policy bound to one method."""

    def __init__(self, access: AccessPolicy, full_method: str):
        self.access, self.full_method = access, full_method

    def refusal(self, metadata):
        return self.access.metadata_refusal(self.full_method, metadata)


def _check_token(tokens: _MethodAccess | None, context) -> None:
    if tokens is not None:
        refusal = tokens.refusal(context.invocation_metadata())
        if refusal is not None:
            context.abort(refusal.code, refusal.message)


def _unary(behavior: Callable, meter, tokens: _MethodAccess | None) -> Callable:
    start_call, finish_call, clock = meter.start, meter.finish, time.perf_counter

    def metered(request, context):
        start_call()
        start = clock()
        failed = True
        try:
            if tokens is not None:
                _check_token(tokens, context)
            response = behavior(request, context)
            failed = False
            return response
        finally:
            finish_call((context.code() or ended_code(context, failed)).name, clock() - start)

    return metered


def _stream(behavior: Callable, meter, tokens: _MethodAccess | None) -> Callable:
    def metered(request, context):
        meter.start()
        start = time.perf_counter()
        failed = True
        try:
            _check_token(tokens, context)
            yield from behavior(request, context)
            failed = False
        finally:
            meter.finish((context.code() or ended_code(context, failed)).name, time.perf_counter() - start)

    return metered


def _uncounted_stream(behavior: Callable, tokens: _MethodAccess | None) -> Callable:
    def checked(requests, context):
        _check_token(tokens, context)
        yield from behavior(requests, context)

    return checked


def _uncounted_unary(behavior: Callable, tokens: _MethodAccess | None) -> Callable:
    def checked(requests, context):
        _check_token(tokens, context)
        return behavior(requests, context)

    return checked


class _WrappedGeneric(grpc.GenericRpcHandler):
    """A generic handler whose method handlers come back wrapped (each wrapped once)."""

    def __init__(self, inner: grpc.GenericRpcHandler, guard: CallGuard):
        self.inner, self.guard = inner, guard
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(self, handler_call_details):
        handler = self.inner.service(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[method] = (handler, self.guard.wrap(handler, method))
        return cached[1]


class GuardedRegistration:
    """The part of ``grpc.Server`` that services register with (``add_*_to_server``), wrapping
    every handler in ``guard`` before the server gets it."""

    def __init__(self, server: grpc.Server, guard: CallGuard):
        self.server, self.guard = server, guard

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self.server.add_generic_rpc_handlers(
            tuple(_WrappedGeneric(h, self.guard) for h in generic_rpc_handlers)
        )

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        """Handlers grpcio finds by the method's path in its C core, with no per-call lookup of ours."""
        self.server.add_registered_method_handlers(
            service_name,
            {
                name: self.guard.wrap(handler, f"/{service_name}/{name}")
                for name, handler in method_handlers.items()
            },
        )
