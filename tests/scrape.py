"""Read a server's Prometheus metrics in tests: one parser (prometheus_client's) for every test."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metrics_text(source) -> str:
    """The exposition text of ``source``: a server harness with ``metrics_url``, or that URL."""
    url = getattr(source, "metrics_url", source)
    return urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()


def metric_in(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def metric(source, name: str, **labels: str) -> float:
    """:func:`metric_in` on what ``source`` serves now."""
    return metric_in(metrics_text(source), name, **labels)
