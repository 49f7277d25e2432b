"""The gRPC handlers: the RPC glue between requests and the modules that answer them.

Each handler turns a request into a call of its RPC's module (``recommend.py`` and its
stages, ``similar_items.py``, ``maps.py``, ``catalog.py``, ``hiding.py``, ``users.py``) over
the shared :class:`~ordrec.service.serving.state.ServingState`, and the answer into the reply.
Errors become status codes in one place, :func:`rpc`: a :class:`ServiceError` carries its
code and a message for the caller; anything else is logged with its stack and answered
INTERNAL without one.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError

from ordrec.service.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, ServiceError
from ordrec.service.live.forgotten import ForgetfulSeen, ForgottenUsers
from ordrec.service.live.fresh import FreshItems
from ordrec.service.live.hidden import HiddenState
from ordrec.service.live.online import NoOnlineEvaluation
from ordrec.service.live.seen import SeenStore
from ordrec.service.live.trending import TrendingIndex
from ordrec.service.metrics import Metrics
from ordrec.service.serving import catalog, hiding, maps, users, validation
from ordrec.service.serving.batching import RecommendBatcher
from ordrec.service.serving.recommend import Recommender
from ordrec.service.serving.similar_items import similar_items
from ordrec.service.serving.state import ServingState
from ordrec.service.serving.store import ModelStore
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc

log = logging.getLogger("ordrec.service")


class Undecodable:
    """Stands in for a request whose bytes are not a valid message of its type."""

    def __init__(self, type_name: str, error: str):
        self.type_name, self.error = type_name, error


def lenient_deserializer(message_class) -> Callable[[bytes], object]:
    """``FromString`` that returns :class:`Undecodable` instead of raising, so a
    garbled request is answered INVALID_ARGUMENT by :func:`rpc` rather than
    grpcio's generic INTERNAL."""

    def deserialize(data: bytes):
        try:
            return message_class.FromString(data)
        except DecodeError as exc:
            return Undecodable(message_class.DESCRIPTOR.full_name, str(exc))

    return deserialize


def _check_request(request, context) -> None:
    if isinstance(request, Undecodable):
        raise InvalidArgument(f"request is not a valid {request.type_name} message ({request.error})")
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise DeadlineExceeded("the call's deadline passed before it was handled")


def _within_message_limit(reply, limits: validation.Limits):
    """``reply``, or ResourceExhausted when it is over the send limit: the status then
    comes from here (and is counted), not from grpcio failing the send afterwards."""
    size = len(reply) if isinstance(reply, bytes) else reply.ByteSize()
    if size > limits.max_message_bytes:
        raise ResourceExhausted(
            f"the reply is {size:,} bytes, over the {limits.max_message_bytes:,}-byte"
            " message limit: ask for less"
        )
    return reply


def rpc(method: Callable) -> Callable:
    """Map exceptions to status codes: the only place that does."""

    @functools.wraps(method)
    def unary(self, request, context):
        try:
            _check_request(request, context)
            return _within_message_limit(method(self, request, context), self.limits)
        except ServiceError as exc:
            context.abort(exc.code, str(exc))
        except Exception:  # noqa: BLE001
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, "internal error (logged on the server)")

    @functools.wraps(method)
    def stream(self, request, context):
        try:
            _check_request(request, context)
            for reply in method(self, request, context):
                yield _within_message_limit(reply, self.limits)
        except ServiceError as exc:
            context.abort(exc.code, str(exc))
        except Exception:  # noqa: BLE001
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, "internal error (logged on the server)")

    return stream if inspect.isgeneratorfunction(method) else unary


class RecommenderServicer(recommender_pb2_grpc.RecommenderServicer):
    """Every RPC of the Recommender service, each handed to the module that answers it."""

    def __init__(
        self,
        store: ModelStore,
        metrics: Metrics,
        limits: validation.Limits,
        seen: SeenStore,
        hidden: HiddenState | None = None,
        hidden_mirror=None,
        online: NoOnlineEvaluation | None = None,
        batcher: RecommendBatcher | None = None,
        forgotten: ForgottenUsers | None = None,
        forget_client=None,
        trending: TrendingIndex | None = None,
        fresh: FreshItems | None = None,
    ):
        self.store, self.limits = store, limits
        self.state = ServingState(
            store,
            metrics,
            limits,
            # A forgotten user's recorded items are neither excluded nor folded in, on every transport.
            seen=ForgetfulSeen(seen, forgotten) if forgotten is not None else seen,
            hidden=hidden,
            hidden_mirror=hidden_mirror,
            online=online or NoOnlineEvaluation(),
            batcher=batcher,
            # Forgotten users are answered as unknown; ForgetUser erases through forget_client (Redis).
            forgotten=forgotten,
            forget_client=forget_client,
            # Trending (service/live/trending.py): unknown users' fallback, and a model name of its own.
            trending=trending,
            # Items the served versions were not trained on, folded in from recorded ratings.
            fresh=fresh,
        )
        self.recommender = Recommender(self.state)

    @rpc
    def Recommend(self, request: pb.RecommendRequest, context) -> pb.RecommendResponse:
        reply = self.recommender.answer(request, context)
        return pb.RecommendResponse.FromString(reply) if isinstance(reply, bytes) else reply

    @rpc
    def recommend_wire(self, request: pb.RecommendRequest, context) -> bytes:
        """Recommend answered as the bytes grpcio sends (``add_to_server`` registers it without
        a reply serialiser): the plain request's are written without a message (``wire.py``)."""
        reply = self.recommender.answer(request, context)
        return reply if isinstance(reply, bytes) else reply.SerializeToString()

    @rpc
    def SimilarItems(self, request: pb.SimilarItemsRequest, context) -> pb.SimilarItemsResponse:
        return similar_items(self.state, request)

    @rpc
    def Tags(self, request: pb.TagsRequest, context) -> pb.TagsResponse:
        return catalog.tags(self.state, request)

    @rpc
    def ListModels(self, request: pb.ListModelsRequest, context) -> pb.ListModelsResponse:
        return catalog.list_models(self.state)

    @rpc
    def Neighbors(self, request: pb.NeighborsRequest, context) -> pb.NeighborsResponse:
        return maps.neighbors(self.state, request)

    @rpc
    def Coordinates(self, request: pb.CoordinatesRequest, context):
        yield from maps.coordinates(self.state, request, context)

    @rpc
    def Place(self, request: pb.PlaceRequest, context) -> pb.PlaceResponse:
        return maps.place(self.state, request)

    @rpc
    def RecordInteractions(self, request: pb.RecordInteractionsRequest, context):
        return users.record_interactions(self.state, request)

    @rpc
    def ForgetUser(self, request: pb.ForgetUserRequest, context) -> pb.ForgetUserResponse:
        return users.forget_user(self.state, request)

    @rpc
    def HideItems(self, request: pb.HideItemsRequest, context) -> pb.HideItemsResponse:
        return hiding.change_hidden(self.state, request, hide=True)

    @rpc
    def UnhideItems(self, request: pb.HideItemsRequest, context) -> pb.HideItemsResponse:
        return hiding.change_hidden(self.state, request, hide=False)

    @rpc
    def ListHidden(self, request: pb.ListHiddenRequest, context) -> pb.ListHiddenResponse:
        return hiding.list_hidden(self.state, request)


def add_to_server(servicer: RecommenderServicer, server) -> None:
    """Register every RPC of the service descriptor with lenient request decoding, by path (grpcio
    then finds a call's handler in its C core), and as a generic handler too, as generated code
    does. ``server``: a ``grpc.Server`` or what stands in for one (``GuardedRegistration``)."""
    service = pb.DESCRIPTOR.services_by_name["Recommender"]
    handlers = {}
    for method in service.methods:
        factory = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        # Recommend's handler returns the reply's bytes itself (the plain request's, written
        # without a message: service/serving/wire.py), so grpcio sends them as they are.
        wire = method.name == "Recommend"
        handlers[method.name] = factory(
            servicer.recommend_wire if wire else getattr(servicer, method.name),
            request_deserializer=lenient_deserializer(getattr(pb, method.input_type.name)),
            response_serializer=None if wire else getattr(pb, method.output_type.name).SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
