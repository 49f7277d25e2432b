"""Service errors and the one place they become gRPC status codes."""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """An error whose message is safe and useful to show the caller."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
