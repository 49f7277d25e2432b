"""Tell Redis that a model version was published (optional, best effort).

After ``ordrec-train run`` publishes ``<name>@<version>`` and the job names a
Redis URL, two things happen, in this order:

1. ``SET ordrec:model:<name>:version <version>``: a durable key (no expiry), so
   a service replica that was disconnected when the message went out still
   finds the newest version when it reconnects (pub/sub alone loses messages
   across reconnects);
2. ``PUBLISH ordrec:models {"model": "<name>", "version": "<version>"}`` so
   subscribed replicas load it at once instead of at their next registry poll.

The key is written first so that a replica reacting to the message and reading
the key sees the new value. Both use short timeouts and no retries: Redis being
down must never fail a training job. The registry is the source of truth (the
service also polls it), so a lost notification only delays the reload; the
failure is logged as a warning and :func:`notify_published` returns False.

The service side (``service/``) subscribes to the same channel and reads the
same keys; the names here are the contract and must not change.
"""

from __future__ import annotations

import json
import logging

CHANNEL = "ordrec:models"
KEY_TEMPLATE = "ordrec:model:{name}:version"
DEFAULT_TIMEOUT = 1.0

log = logging.getLogger("ordrec.job")


def version_key(name: str) -> str:
    """The durable key holding ``name``'s newest published version."""
    return KEY_TEMPLATE.format(name=name)


def message(name: str, version: str) -> str:
    """The JSON message published on :data:`CHANNEL`."""
    return json.dumps({"model": name, "version": version}, separators=(",", ":"))


def notify_published(
    url: str, name: str, version: str, timeout: float = DEFAULT_TIMEOUT, logger: logging.Logger | None = None
) -> bool:
    """Set the version key and publish the message; True on success.

    Never raises for Redis or network trouble (nor for a malformed URL, which
    the job file validation already rejects): it logs a warning and returns
    False.
    """
    logger = logger or log
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError as exc:  # pragma: no cover - redis is a dependency
        logger.warning("redis notification skipped for %s@%s: %s", name, version, exc)
        return False
    try:
        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
        )
    except (ValueError, redis.RedisError) as exc:
        logger.warning("redis notification skipped for %s@%s: bad URL %s (%s)", name, version, url, exc)
        return False
    try:
        client.set(version_key(name), version)
        receivers = client.publish(CHANNEL, message(name, version))
    except (redis.RedisError, OSError) as exc:
        logger.warning(
            "redis notification failed for %s@%s (%s: %s); replicas will pick the version"
            " up at their next registry poll",
            name,
            version,
            type(exc).__name__,
            exc,
        )
        return False
    finally:
        client.close()
    logger.info(
        "notified redis: %s=%s, published on %s to %d subscriber(s)",
        version_key(name),
        version,
        CHANNEL,
        receivers,
    )
    return True
