"""Model indices by kind. Each kind lives in its own module ``service.models.<kind>``
exposing ``Index``; modules are imported on first use so a server that serves
one kind does not pay for the others."""
from __future__ import annotations

import importlib

from ordrec.service.artifacts import Artifact, ArtifactError
from ordrec.service.models.base import ModelIndex

KINDS = ("dcr", "coe", "rtf", "score", "knnscal")


def index_class(kind: str) -> type[ModelIndex]:
    if kind not in KINDS:
        raise ArtifactError(f"unknown model kind {kind!r} (known: {', '.join(KINDS)})")
    module = importlib.import_module(f"ordrec.service.models.{kind}")
    return module.Index


def build_index(artifact: Artifact) -> ModelIndex:
    """The index for a verified artifact, smoke-tested and warmed up."""
    index = index_class(artifact.kind).from_artifact(artifact)
    index.smoke()
    return index
