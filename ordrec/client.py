"""A small typed Python client for the ordrec gRPC API.

Example::

    from ordrec.client import Client

    with Client("127.0.0.1:50051") as client:
        client.wait_ready(10)               # the server may still be starting
        reply = client.recommend("u001", model="dcr", n=5)
        for item in reply.results[0].items:
            print(item.id, item.score)

Every method returns the protobuf reply of its RPC (``ordrec.v1.recommender_pb2``)
and raises ``grpc.RpcError`` when the call fails; ``error.code()`` is the
status (the table is in ``docs/service.md``). Calls answered UNAVAILABLE (the
server is not listening yet, restarting, or a model is not loaded yet) are
retried with exponential backoff within the call's timeout.

This module imports only grpc and the generated ``ordrec.v1`` code, so it is
usable from an installation without the trainer's dependencies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc

__all__ = ["Client", "ENTITIES", "entity"]

DEFAULT_TARGET = "127.0.0.1:50051"

# Entity names accepted wherever an ``Entity`` is asked for ("object" is the
# name SCORE and KNNSCAL use for the rows of their maps; on the wire it is ITEM).
ENTITIES = {
    "item": pb.ENTITY_ITEM,
    "user": pb.ENTITY_USER,
    "aspect": pb.ENTITY_ASPECT,
    "object": pb.ENTITY_ITEM,
}

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
_T = TypeVar("_T")


def entity(value: str | int | None) -> pb.Entity:
    """An ``ordrec.v1.Entity`` from a name (``"item"``, ``"user"``, ``"aspect"``, ``"object"``),
    an enum value, or None (unspecified).

    Raises
    ------
    ValueError
        For an unknown name or value.
    """
    if value is None or value == "":
        return pb.ENTITY_UNSPECIFIED
    if isinstance(value, str):
        try:
            return ENTITIES[value.lower()]
        except KeyError:
            raise ValueError(f"unknown entity {value!r}: one of {', '.join(ENTITIES)}") from None
    if value not in pb.Entity.values():
        raise ValueError(f"unknown entity value {value!r}")
    return cast(pb.Entity, int(value))  # a checked enum value (an Entity is an int on the wire)


def _read_pem(value: str | bytes | Path) -> bytes:
    if isinstance(value, bytes):
        return value
    text = str(value)
    if "-----BEGIN" in text:  # PEM text rather than a path
        return text.encode()
    return Path(text).read_bytes()


class Client:
    """A connection to one ordrec server.

    Parameters
    ----------
    target : str
        ``host:port`` of the server.
    token : str, optional
        Bearer token, sent as ``authorization: Bearer <token>`` on every call
        (the server's ``--token-file`` / ``--token-env``). :meth:`hide`,
        :meth:`unhide` and :meth:`forget` are admin calls: they need one of the
        server's admin tokens (``--admin-token-file`` / ``--admin-token-env``),
        which every other call accepts too.
    tls : bool
        Connect with TLS, trusting the system's root certificates unless
        ``tls_ca`` is given.
    tls_ca : str, bytes or Path, optional
        PEM root certificate(s), as a path or the PEM bytes; implies ``tls``.
    tls_server_name : str, optional
        The name to verify the server's certificate against, when it differs
        from the host in ``target`` (e.g. connecting by IP address).
    timeout : float
        Seconds each call may take, retries included.
    retries : int
        How many times a call answered UNAVAILABLE is tried again (0: never).
    backoff : float
        Seconds before the first retry; doubled for each further one, at most 2 s.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        token: str | None = None,
        tls: bool = False,
        tls_ca: str | bytes | Path | None = None,
        tls_server_name: str | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.1,
    ):
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.target, self.timeout, self.retries, self.backoff = target, float(timeout), int(retries), backoff
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        if tls or tls_ca is not None:
            roots = _read_pem(tls_ca) if tls_ca is not None else None
            options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
            self.channel = grpc.secure_channel(
                target, grpc.ssl_channel_credentials(root_certificates=roots), options=options
            )
        else:
            self.channel = grpc.insecure_channel(target)
        self._stub = recommender_pb2_grpc.RecommenderStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait_ready(self, timeout: float | None = None, service: str = "") -> bool:
        """Wait until the server's health service answers SERVING.

        The server listens only once its models are loaded, and its health is
        SERVING while at least one model is loaded, so after this returns True
        queries can be answered.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait (default: the client's timeout).
        service : str
            The health service name to ask about ("" is the whole server).

        Returns
        -------
        bool
            True once SERVING; False when the time ran out first.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                # wait_for_ready: the call waits for the connection instead of
                # failing at once while nothing listens on the port.
                reply = self._health.Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=left, wait_for_ready=True
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))

    # ------------------------------------------------------------- plumbing
    def _retrying(self, attempt: Callable[[float], _T], timeout: float | None) -> _T:
        """Run ``attempt(seconds_left)``, again after a backoff while it fails UNAVAILABLE."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        delay = self.backoff
        for tries_left in range(self.retries, -1, -1):
            try:
                return attempt(max(deadline - time.monotonic(), 0.001))
            except grpc.RpcError as exc:
                if exc.code() not in _RETRYABLE or tries_left == 0 or time.monotonic() + delay >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _unary(self, method, request, timeout: float | None):
        return self._retrying(lambda left: method(request, timeout=left, metadata=self._metadata), timeout)

    # ----------------------------------------------------------------- RPCs
    def health(self, service: str = "", *, timeout: float | None = None) -> health_pb2.HealthCheckResponse:
        """``grpc.health.v1.Health/Check``: SERVING while at least one model is loaded (no token needed)."""
        return self._unary(self._health.Check, health_pb2.HealthCheckRequest(service=service), timeout)

    def models(self, *, timeout: float | None = None) -> pb.ListModelsResponse:
        """``ListModels``: what is served, which version, and why."""
        return self._unary(self._stub.ListModels, pb.ListModelsRequest(), timeout)

    def recommend(
        self,
        user_ids: str | Sequence[str],
        *,
        model: str = "",
        n: int = 10,
        exclude_seen: bool | None = None,
        candidates: Iterable[str] = (),
        with_distribution: bool = False,
        exclude: Iterable[str] = (),
        filter: str = "",  # noqa: A002 - the request field's name
        explain: int = 0,
        diversity: float = 0.0,
        max_per_attribute: tuple[str, int] | None = None,
        timeout: float | None = None,
    ) -> pb.RecommendResponse:
        """``Recommend``: the top ``n`` items for one user or a batch.

        Parameters
        ----------
        user_ids : str or sequence of str
            One user id, or several (scored as one batch).
        model : str
            Registry name; "" picks the only loaded model that answers Recommend.
        n : int
            Items per user.
        exclude_seen : bool, optional
            Leave out training (and recorded) items; the server's default (None) is True.
        candidates : iterable of str
            When given, rank only these items.
        with_distribution : bool
            DCR only: return P(rating = level) with each item.
        exclude : iterable of str
            Items never to return in this call.
        filter : str
            Only items whose attributes pass it, e.g.
            ``genre in ("Comedy", "Drama") and year >= 1990`` (docs/service.md, "Business rules").
        explain : int
            Up to this many items of the user's history with each result, each with its share
            (``ScoredId.explanations``); 0 for none.
        diversity : float
            0 (the model's ranking) to 1: re-rank the model's top 5n by maximal marginal relevance.
        max_per_attribute : (attribute, m), optional
            At most ``m`` results per value of that item attribute (e.g. ``("genre", 2)``).

        Items the served version was not trained on, folded in from what users recorded since,
        come back with ``ScoredId.fresh`` set (docs/service.md, "Fresh items").
        """
        users = [user_ids] if isinstance(user_ids, str) else list(user_ids)
        request = pb.RecommendRequest(
            model=model,
            user_ids=users,
            n=n,
            candidate_item_ids=list(candidates),
            with_distribution=with_distribution,
            exclude_item_ids=list(exclude),
            filter=filter,
            explain=explain,
            diversity=diversity,
        )
        if max_per_attribute is not None:
            request.max_per_attribute.attribute, request.max_per_attribute.max = max_per_attribute
        if exclude_seen is not None:
            request.exclude_seen = exclude_seen
        return self._unary(self._stub.Recommend, request, timeout)

    def similar(
        self,
        item_ids: str | Sequence[str],
        *,
        model: str = "",
        n: int = 10,
        exclude: Iterable[str] = (),
        filter: str = "",  # noqa: A002 - the request field's name
        diversity: float = 0.0,
        max_per_attribute: tuple[str, int] | None = None,
        timeout: float | None = None,
    ) -> pb.SimilarItemsResponse:
        """``SimilarItems``: the ``n`` items most similar to one item, or to a basket of items
        (by the mean similarity), by the model's own item similarity (DCR, Pairwise DCR, COE).

        ``exclude``, ``filter``, ``diversity`` and ``max_per_attribute`` work as in :meth:`recommend`.
        """
        request = pb.SimilarItemsRequest(
            model=model,
            item_ids=[item_ids] if isinstance(item_ids, str) else list(item_ids),
            n=n,
            exclude_item_ids=list(exclude),
            filter=filter,
            diversity=diversity,
        )
        if max_per_attribute is not None:
            request.max_per_attribute.attribute, request.max_per_attribute.max = max_per_attribute
        return self._unary(self._stub.SimilarItems, request, timeout)

    def tags(
        self,
        user_id: str,
        item_id: str,
        *,
        model: str = "",
        n: int = 10,
        exclude_own_tags: bool = False,
        timeout: float | None = None,
    ) -> pb.TagsResponse:
        """``Tags``: the top ``n`` tags for ``user_id`` tagging ``item_id`` (RTF)."""
        request = pb.TagsRequest(
            model=model, user_id=user_id, item_id=item_id, n=n, exclude_own_tags=exclude_own_tags
        )
        return self._unary(self._stub.Tags, request, timeout)

    def neighbors(
        self,
        id: str,
        *,
        model: str = "",
        space: str = "",
        from_entity: str | int | None = None,
        to_entity: str | int | None = None,
        k: int = 10,
        timeout: float | None = None,
    ) -> pb.NeighborsResponse:
        """``Neighbors``: the ``k`` nearest entities to ``id`` on a map (COE, SCORE, KNNSCAL).

        ``from_entity`` / ``to_entity`` take ``"item"``, ``"user"``, ``"aspect"``, ``"object"``
        or an ``Entity`` value; None is the model's default. ``space`` names a SCORE aspect map.
        """
        request = pb.NeighborsRequest(
            model=model, space=space, id=id, k=k, from_entity=entity(from_entity), to_entity=entity(to_entity)
        )
        return self._unary(self._stub.Neighbors, request, timeout)

    def coordinates(
        self,
        ids: Iterable[str] = (),
        *,
        model: str = "",
        space: str = "",
        entity_kind: str | int | None = None,
        page_size: int = 0,
        timeout: float | None = None,
    ) -> Generator[pb.CoordinatesResponse, None, None]:
        """``Coordinates``: the pages of map points, for ``ids`` or (when empty) the whole map.

        The call is retried on UNAVAILABLE only until its first page arrives,
        so no page is ever repeated. ``timeout`` bounds the whole stream. The
        call starts at the first ``next()``; closing the iterator (or leaving
        a ``for`` loop over it, in CPython) cancels the rest of the stream.
        """
        request = pb.CoordinatesRequest(
            model=model, space=space, entity=entity(entity_kind), ids=list(ids), page_size=page_size
        )

        def first_page(left: float):
            stream = self._stub.Coordinates(request, timeout=left, metadata=self._metadata)
            return stream, next(stream, None)

        stream, page = self._retrying(first_page, timeout)
        try:
            if page is not None:
                yield page
                yield from stream
        finally:
            stream.cancel()  # a consumer that stops early frees the server's stream slot at once

    def place(
        self, ranked_neighbor_ids: Sequence[str], *, model: str = "", k: int = 0, timeout: float | None = None
    ) -> pb.PlaceResponse:
        """``Place``: coordinates of a new vertex from its neighbours, nearest first (KNNSCAL)."""
        request = pb.PlaceRequest(model=model, ranked_neighbor_ids=list(ranked_neighbor_ids), k=k)
        return self._unary(self._stub.Place, request, timeout)

    def record(
        self,
        user_id: str,
        item_ids: Iterable[str] = (),
        *,
        ratings: Mapping[str, float] | None = None,
        model: str = "",
        timeout: float | None = None,
    ) -> pb.RecordInteractionsResponse:
        """``RecordInteractions``: what ``user_id`` did, left out by ``recommend`` at once and
        trained on by the next ``ordrec-train run`` with ``[events]``.

        ``ratings`` maps items to values on ``model``'s rating scale (INVALID_ARGUMENT
        otherwise). Needs a server started with Redis (FAILED_PRECONDITION otherwise).

        A retried call may repeat an entry in the stream; training merges by (user, item),
        so nothing counts twice.
        """
        interactions = [pb.Interaction(item_id=i, value=v) for i, v in (ratings or {}).items()]
        request = pb.RecordInteractionsRequest(
            user_id=user_id, item_ids=list(item_ids), interactions=interactions, model=model
        )
        return self._unary(self._stub.RecordInteractions, request, timeout)

    def hide(
        self, item_ids: Iterable[str], *, model: str = "*", timeout: float | None = None
    ) -> pb.HideItemsResponse:
        """``HideItems``: Recommend, SimilarItems and Neighbors stop returning these items for
        ``model`` ("*": all models).

        Ids the served version does not know are kept (counted in ``unknown``).
        """
        request = pb.HideItemsRequest(model=model, item_ids=list(item_ids))
        return self._unary(self._stub.HideItems, request, timeout)

    def unhide(
        self, item_ids: Iterable[str], *, model: str = "*", timeout: float | None = None
    ) -> pb.HideItemsResponse:
        """``UnhideItems``: undo :meth:`hide` for the same scope."""
        request = pb.HideItemsRequest(model=model, item_ids=list(item_ids))
        return self._unary(self._stub.UnhideItems, request, timeout)

    def forget(
        self, user_id: str, *, reason: str = "", timeout: float | None = None
    ) -> pb.ForgetUserResponse:
        """``ForgetUser``: erase ``user_id`` everywhere (GDPR Art. 17); answered as unknown from now on.

        Safe to repeat: a retried or repeated call finishes what an interrupted one began.
        """
        request = pb.ForgetUserRequest(user_id=user_id, reason=reason)
        return self._unary(self._stub.ForgetUser, request, timeout)

    def hidden(
        self, *, model: str = "", after_item_id: str = "", timeout: float | None = None
    ) -> pb.ListHiddenResponse:
        """``ListHidden``: hidden items by scope ("" every scope, "*" the all-models one, or a model's),
        a page of at most the server's ``--max-ids`` ids each, after ``after_item_id``."""
        request = pb.ListHiddenRequest(model=model, after_item_id=after_item_id)
        return self._unary(self._stub.ListHidden, request, timeout)
