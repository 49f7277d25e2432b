"""Serving indices by kind. Each built-in kind lives in its own module
``service.indices.models.<kind>`` exposing its index (``DCRIndex``, ``COEIndex``, ...); the kinds and where their
indices live are registered in :mod:`ordrec.service.indices.models.kinds`."""

from __future__ import annotations

from ordrec.service.indices.models import kinds
from ordrec.service.indices.models.base import ModelIndex
from ordrec.service.storage.artifact import Artifact


def index_class(kind: str) -> type[ModelIndex]:
    """The serving index class of a registered kind (:class:`kinds.UnknownKind` otherwise)."""
    return kinds.get(kind).index_class()


def build_index(artifact: Artifact) -> ModelIndex:
    """The index for a verified artifact, smoke-tested and warmed up."""
    index = index_class(artifact.kind).from_artifact(artifact)
    index.smoke()
    return index
