"""The one list of model kinds, read by the service and the trainer alike.

A kind is registered once, by :func:`register`, with where its parts live:
the serving index (runtime), the estimator and the paper's reproduction
protocol (trainer). The parts are named by dotted path and imported on first
use, so the runtime never imports the trainer and a server that serves one
kind does not pay for the others. Everything else about a kind is read from
its parts: the data shape ``fit`` takes is the estimator's ``input_shape``,
and a kind is a map when its index is a
:class:`~ordrec.service.indices.models.base.MapIndex`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ordrec.service.storage.artifact import ArtifactError


class UnknownKind(ArtifactError, ValueError):
    """A kind nobody registered: an artifact error to the service, a usage error to the trainer."""


def resolve(path: str) -> Any:
    """The object at ``"package.module:attribute"`` (a module for ``"package.module"``)."""
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


@dataclass(frozen=True)
class ModelKind:
    """One kind of model.

    Parameters
    ----------
    name : str
        The kind as artifacts, job files and the CLI spell it.
    index : str
        ``"module:Class"`` of the serving index (a ``ModelIndex`` subclass).
    estimator : str
        ``"module:Class"`` of the estimator (an ``Estimator`` subclass).
    protocol : str
        Module of the paper's reproduction protocol (``add_arguments``,
        ``run``; optionally ``fit_metrics``, ``map_paper_figures``,
        ``DEFAULT_RUNS``, ``DATA_REQUIRED``).
    summary : str
        One line on what the protocol measures (``ordrec-train reproduce --help``).
    memory : str, optional
        ``"module:function"`` predicting a fit's peak memory from what is fitted and the data
        (``function(estimator, data)``, a ``MemoryPrediction``); checked before every fit.
        None: the kind's fits are not predicted, so not checked.
    """

    name: str
    index: str
    estimator: str
    protocol: str
    summary: str
    memory: str | None = None

    def index_class(self) -> type:
        return resolve(self.index)

    def estimator_class(self) -> Any:
        return resolve(self.estimator)

    def protocol_module(self):
        return resolve(self.protocol)

    def memory_predictor(self) -> Any:
        """The fit's memory predictor, or None when the kind registers none."""
        return resolve(self.memory) if self.memory else None

    @property
    def input_shape(self) -> str:
        return self.estimator_class().input_shape

    @property
    def is_map(self) -> bool:
        from ordrec.service.indices.models.base import MapIndex

        return issubclass(self.index_class(), MapIndex)


_REGISTRY: dict[str, ModelKind] = {}


def register(kind: ModelKind) -> ModelKind:
    """Add ``kind``; registering the same entry again is harmless, another one under its name is an error."""
    known = _REGISTRY.get(kind.name)
    if known is not None and known != kind:
        raise ValueError(f"model kind {kind.name!r} is already registered differently")
    _REGISTRY[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get(name: str) -> ModelKind:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownKind(f"unknown model kind {name!r} (known: {', '.join(names())})") from None


def names() -> tuple[str, ...]:
    """Every registered kind, in registration order."""
    return tuple(_REGISTRY)


def map_names() -> tuple[str, ...]:
    """The kinds whose index is a map (published with a map report)."""
    return tuple(name for name, kind in _REGISTRY.items() if kind.is_map)


def _builtin(name: str, estimator: str, summary: str, memory: str | None = None) -> ModelKind:
    # Kind "dcr": the estimator ordrec.trainer.models.dcr:DCR, the serving index
    # ordrec.service.indices.models.dcr:DCRIndex, the protocol ordrec.trainer.reproduce.dcr.
    return register(
        ModelKind(
            name,
            index=f"ordrec.service.indices.models.{name}:{name.upper()}Index",
            estimator=f"ordrec.trainer.models.{name}:{estimator}",
            protocol=f"ordrec.trainer.reproduce.{name}",
            summary=summary,
            memory=memory,
        )
    )


_builtin(
    "dcr",
    "DCR",
    "DCR / Pairwise DCR: NDCG@10 with N training ratings per user (Table 2)",
    memory="ordrec.trainer.models.dcr_memory:predicted_memory",
)
_builtin(
    "coe",
    "COE",
    "COE: preservation / prediction accuracy and k-NN ratings on ML-100K (Table 3)",
    memory="ordrec.trainer.models.coe_memory:predicted_memory",
)
_builtin("rtf", "RTF", "RTF: F1@1..10 and AUC of tag recommendation on a p-core (Section 5)")
_builtin("score", "SCORE", "SCORE: per-aspect preservation, split ratios, aspect relatedness (Table 1)")
_builtin(
    "knnscal", "KnnScal", "KNNSCAL: stress, order agreement, neighbour recall against reference embeddings"
)
