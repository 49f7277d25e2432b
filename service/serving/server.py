"""Assembling and running one server process: gRPC, health, reflection, metrics,
reloading, graceful shutdown."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
from concurrent import futures
from http.server import ThreadingHTTPServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ordrec.service.config import Limits, ServerConfig
from ordrec.service.indices import diversity, explain, topk
from ordrec.service.indices.item_attributes import read_item_attributes
from ordrec.service.live.forgotten import KEY_FILE_ENV, ForgottenUsers, forgotten_key, read_forgotten
from ordrec.service.live.forgotten import backends as forgotten_backends
from ordrec.service.live.fresh import FreshEvidence, FreshItems, known_to_all
from ordrec.service.live.hidden import HiddenState, RedisBackend, RegistryBackend
from ordrec.service.live.online import NoOnlineEvaluation, OnlineEvaluation
from ordrec.service.live.redis_state import RedisSeenStore, VersionListener, connect
from ordrec.service.live.seen import SeenStore
from ordrec.service.live.trending import TrendingIndex, TrendingSettings
from ordrec.service.metrics import Metrics
from ordrec.service.serving import wire
from ordrec.service.serving.batching import BatchObserver, RecommendBatcher
from ordrec.service.serving.gateway import JsonGateway
from ordrec.service.serving.http import start_http_server
from ordrec.service.serving.interceptor import CallGuard, GuardedRegistration
from ordrec.service.serving.security import AccessPolicy, server_credentials
from ordrec.service.serving.servicer import RecommenderServicer, add_to_server
from ordrec.service.serving.status_page import StatusPage
from ordrec.service.serving.store import ModelStore, Reloader
from ordrec.service.serving.streams import StreamGuard
from ordrec.service.storage import mapped
from ordrec.service.storage.objectstore import open_registry
from ordrec.v1 import recommender_pb2

log = logging.getLogger("ordrec.service")
SERVICE_NAME = recommender_pb2.DESCRIPTOR.services_by_name["Recommender"].full_name
# A health entry of its own, so probes can see Redis trouble while the
# service itself stays SERVING (it fails open without Redis).
REDIS_HEALTH = "ordrec.redis"
# SERVING while the process answers at all, models or not: a liveness probe's target. The
# overall status ("") waits for a loaded model, so it suits readiness, not liveness (an
# empty registry would otherwise restart every replica in a loop).
LIVENESS_HEALTH = "ordrec.liveness"


def batch_observer(metrics: Metrics) -> BatchObserver:
    """The batcher's reports as Prometheus metrics (children looked up once, not per call)."""
    shed = {reason: metrics.shed.labels(reason) for reason in ("queue_full", "deadline")}
    return BatchObserver(
        batch_users=metrics.batch_users.observe,
        queue_seconds=metrics.queue_seconds.observe,
        shed=lambda reason: shed[reason].inc(),
    )


class ListingHealthServicer(health.HealthServicer):
    """The stock health servicer plus ``List`` (advertised by the proto, missing upstream)."""

    def List(self, request, context):  # noqa: N802 - gRPC method name
        with self._lock:
            statuses = {
                name: health_pb2.HealthCheckResponse(status=status)
                for name, status in self._server_status.items()
            }
        return health_pb2.HealthListResponse(statuses=statuses)


def warm_up_kernels() -> None:
    """Compile, or load from numba's cache, every kernel a request may call: what a server
    does before it listens, and what an image build or a test session does once to fill the cache."""
    topk.warm_up()
    mapped.warm_up()
    diversity.warm_up()  # the request features' kernels (service/indices/diversity.py, explain.py)
    explain.warm_up()
    wire.warm_up()  # Recommend's plain reply (service/serving/wire.py)


class Server:
    """One serving process. ``start()`` loads models and opens the ports."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self.metrics = Metrics()
        self.health = ListingHealthServicer()
        self.store = ModelStore(
            open_registry(config.registry, config.cache_dir), self.metrics, on_change=self._update_health
        )
        self.seen = (
            RedisSeenStore(
                config.redis_url,
                self.metrics,
                config.redis_timeout,
                config.seen_ttl,
                on_change=self._update_health,
                events_maxlen=config.events_maxlen,
                trending=TrendingSettings(config.trending_half_life, config.trending_window),
            )
            if config.redis_url
            else SeenStore()
        )
        self.trending = self._trending_index(config)
        # Polling is the fallback that always works; Redis news only wakes it early.
        self.reloader = Reloader(self.store, config.poll_interval or None)
        self.listener = VersionListener(config.redis_url, self.reloader.wake) if config.redis_url else None
        self.forgotten, self.forget_client = self._forgotten_users(config)
        self.fresh = self._fresh_items(config)
        self.online = self._online_evaluation(config)
        self.hidden, self.hidden_mirror = self._hidden_state(config)
        self.metrics.hidden_items.set_function(lambda: sum(map(len, self.hidden.sets().values())))
        self.metrics.rules_stale.set_function(lambda: float(self.hidden.stale))
        self.grpc_server: grpc.Server | None = None
        self.stream_guard: StreamGuard | None = None
        self.http_server: ThreadingHTTPServer | None = None
        self.status_page: StatusPage | None = None
        self.port = config.port
        self.metrics_port = config.metrics_port

    def _trending_index(self, config: ServerConfig) -> TrendingIndex | None:
        """Trending read from the seen store's Redis (service/live/trending.py); None without Redis."""
        if not isinstance(self.seen, RedisSeenStore):
            return None
        settings = TrendingSettings(config.trending_half_life, config.trending_window)
        return TrendingIndex(self.seen.client, settings, healthy=self.seen.healthy, name=config.trending)

    def _fresh_items(self, config: ServerConfig) -> FreshItems | None:
        """Items the served versions were not trained on, read from the events stream
        (service/live/fresh.py); None without Redis or with ``fresh_interval`` 0."""
        if not isinstance(self.seen, RedisSeenStore) or config.fresh_interval <= 0:
            return None
        store = self.store

        def recommenders() -> list:
            return [m.index for m in store.snapshot().values() if "Recommend" in m.index.rpcs]

        evidence = FreshEvidence(
            self.seen.client, known_to_all(recommenders), self.seen.healthy, config.fresh_interval
        )
        attributes = None
        if config.fresh_item_attributes:
            attributes = read_item_attributes(config.fresh_item_attributes)
        gauge = self.metrics.fresh_items

        def count(index, fresh: int) -> None:
            """``ordrec_fresh_items`` of the version whose overlay was just built."""
            model = store.served_with(index)
            if model is not None:
                gauge.labels(model.name, model.version).set(fresh)

        return FreshItems(
            evidence,
            self.forgotten.unknown,
            attributes=attributes,
            users_token=self.forgotten.digests,
            on_built=count,
        )

    def _online_evaluation(self, config: ServerConfig) -> NoOnlineEvaluation:
        """Sampling and hit counting in Redis (service/live/online.py); off without Redis."""
        if not config.redis_url or config.online_sample_rate <= 0:
            return NoOnlineEvaluation()
        store = self.store

        def recommenders() -> list[str]:
            return [n for n, m in store.snapshot().items() if "Recommend" in m.index.rpcs]

        return OnlineEvaluation(
            connect(config.redis_url, max(config.redis_timeout, 1.0)),
            self.metrics,
            recommenders,
            store.loaded_versions,
            config.online_sample_rate,
            config.online_window,
            skip_user=self.forgotten.contains,
        )

    def _forgotten_users(self, config: ServerConfig) -> tuple[ForgottenUsers, object]:
        """The FORGOTTEN list (service/live/forgotten.py): read like the hidden items; and the Redis
        client ForgetUser erases with (None without Redis). A list this process's key cannot match
        stops the start (ValueError): its users would be answered again."""
        read_forgotten(self.store.registry)
        if forgotten_key() is None:
            log.warning(
                "the FORGOTTEN list is not keyed (bare sha256, open to enumeration): set %s", KEY_FILE_ENV
            )
        if not config.redis_url:
            primary, _ = forgotten_backends(self.store.registry)
            return ForgottenUsers(primary, config.poll_interval or 5.0), None
        client = connect(config.redis_url, max(config.redis_timeout, 1.0))
        primary, files = forgotten_backends(self.store.registry, client)
        return ForgottenUsers(primary, config.hidden_interval, fallback=files), client

    def _hidden_state(self, config: ServerConfig) -> tuple[HiddenState, object]:
        """Hidden items in Redis (mirrored to the registry, read from there when Redis is down at
        start-up), or in the registry followed by the poll."""
        files = RegistryBackend(self.store.registry)
        if not config.redis_url:
            return HiddenState(files, config.poll_interval or 5.0), None
        # Its own client with a longer timeout: it reads whole sets off the request path.
        backend = RedisBackend(connect(config.redis_url, max(config.redis_timeout, 1.0)))
        return HiddenState(backend, config.hidden_interval, fallback=files), files

    def serving(self) -> bool:
        return bool(self.store.snapshot())

    def health_detail(self) -> dict[str, str]:
        detail = {
            "models": ", ".join(f"{n}@{m.version}" for n, m in sorted(self.store.snapshot().items()))
            or "none loaded"
        }
        if self.config.redis_url:
            detail["redis"] = "up" if self.seen.healthy() else "down (seen filter failing open)"
        return detail

    def _update_health(self) -> None:
        if self._stopping.is_set():
            return
        serving, not_serving = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        status = serving if self.serving() else not_serving
        for service in ("", SERVICE_NAME):
            self.health.set(service, status)
        self.health.set(LIVENESS_HEALTH, serving)
        if self.config.redis_url:
            self.health.set(REDIS_HEALTH, serving if self.seen.healthy() else not_serving)

    def start(self) -> Server:
        cfg = self.config
        self._update_health()
        warm_up_kernels()  # compiled (or loaded from numba's cache) before the first request, not during it
        self.store.refresh()
        self._update_health()
        options = [
            ("grpc.max_receive_message_length", cfg.limits.max_message_bytes),
            ("grpc.max_send_message_length", cfg.limits.max_message_bytes),
            ("grpc.so_reuseport", 1 if cfg.reuse_port else 0),
            ("grpc.max_connection_age_ms", int(cfg.max_connection_age * 1000)),
            ("grpc.max_connection_age_grace_ms", int(cfg.max_connection_age_grace * 1000)),
            ("grpc.max_concurrent_streams", cfg.max_streams_per_connection_http2),
        ]
        self.stream_guard = StreamGuard(
            cfg.streams, on_cancel=lambda reason: self.metrics.streams_ended.labels(reason).inc()
        )
        self.metrics.open_streams.set_function(self.stream_guard.open_streams)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="ordrec-rpc"),
            options=options,
        )
        access = AccessPolicy(cfg.tokens, cfg.admin_tokens, cfg.admin_open)
        # Every service registers through this, its handlers wrapped in the access check, stream
        # admission and metrics once, here, rather than by an interceptor on every call.
        registration = GuardedRegistration(
            server,
            CallGuard(self.metrics.calls, self.stream_guard, access),
        )
        batcher = (
            RecommendBatcher(
                cfg.batch_max_size, cfg.batch_max_queue, batch_observer(self.metrics), cfg.batch_min_work
            )
            if cfg.batch_max_size
            else None
        )
        add_to_server(self._servicer(cfg.limits, batcher), registration)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, registration)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            registration,
        )
        self.port = self._bind(server, cfg.host, cfg.port)
        server.start()
        self.grpc_server = server
        if cfg.metrics_port >= 0:
            self.status_page = StatusPage(
                self.store, self.metrics, self.serving, self.health_detail, self.hidden
            )
            self.status_page.window.start()
            self.http_server = start_http_server(
                cfg.metrics_host,
                cfg.metrics_port,
                self.metrics,
                self.store,
                self.serving,
                self.health_detail,
                gateway=JsonGateway(self._json_servicer(), self.metrics, access),
                status_page=self.status_page,
                settings=cfg.http,
            )
            self.metrics_port = self.http_server.server_address[1]
        self.reloader.start()
        if self.listener:
            self.listener.start()
        self.hidden.start()
        self.forgotten.start()
        if self.fresh is not None:  # after the first load: items every version knows are not fresh
            self.fresh.evidence.start()
        models = ", ".join(f"{n}@{m.version}" for n, m in sorted(self.store.snapshot().items())) or "none"
        log.info(
            "listening on %s:%d (metrics on %s:%s); serving %s",
            cfg.host,
            self.port,
            cfg.metrics_host,
            self.metrics_port,
            models,
        )
        return self

    def _servicer(self, limits: Limits, batcher: RecommendBatcher | None = None) -> RecommenderServicer:
        """The servicer over this server's state and rules: one for gRPC, one for the JSON API."""
        return RecommenderServicer(
            self.store,
            self.metrics,
            limits,
            self.seen,
            self.hidden,
            self.hidden_mirror,
            self.online,
            batcher=batcher,
            forgotten=self.forgotten,
            forget_client=self.forget_client,
            trending=self.trending,
            fresh=self.fresh,
        )

    def _json_servicer(self) -> RecommenderServicer:
        """The servicer the JSON API calls: the same state and rules, the JSON message limit
        (``--http-max-message-bytes``, at most gRPC's) instead of gRPC's."""
        cfg = self.config
        limit = min(cfg.http.max_message_bytes, cfg.limits.max_message_bytes)
        return self._servicer(dataclasses.replace(cfg.limits, max_message_bytes=limit))

    def _bind(self, server: grpc.Server, host: str, port: int) -> int:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.config.tls_cert:
            bound = server.add_secure_port(
                address, server_credentials(self.config.tls_cert, self.config.tls_key)
            )
        else:
            bound = server.add_insecure_port(address)
        if bound == 0:
            raise OSError(f"cannot listen on {address}")
        return bound

    def stop(self, grace: float | None = None) -> None:
        """Refuse new calls, let in-flight ones finish within ``grace`` seconds."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self.health.enter_graceful_shutdown()
        self.reloader.stop()
        if self.listener:
            self.listener.stop()
        self.hidden.stop()
        self.forgotten.stop()
        if self.fresh is not None:
            self.fresh.evidence.stop()
        self.online.stop()
        if isinstance(self.seen, RedisSeenStore):
            self.seen.close()
        if self.grpc_server is not None:
            self.grpc_server.stop(self.config.grace if grace is None else grace).wait()
        if self.http_server is not None:
            self.http_server.shutdown()
            self.http_server.server_close()
        if self.status_page is not None:
            self.status_page.window.stop()
        if self.stream_guard is not None:
            self.stream_guard.stop()
        log.info("stopped")
        self._stopped.set()

    def wait(self) -> None:
        """Block until ``stop`` has finished draining. The wait is sliced: a signal the kernel
        hands to another thread does not wake a main thread parked on a lock, and Python runs
        its handler only when the main thread next runs bytecode."""
        while not self._stopped.wait(0.2):
            pass

    def stop_on_signals(self) -> None:
        def handler(signum, _frame):
            log.info("signal %d: draining in-flight calls", signum)
            threading.Thread(target=self.stop, name="ordrec-stop").start()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, handler)
