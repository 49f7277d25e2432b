"""An estimator as a job table or ``ordrec-train train --set`` configures it: one flat set of
settings split into the model's parameters, its model selection (a wrapper around the
estimator) and its serving choices (passed to ``to_artifact`` when the version is written).

The estimators keep only the model's own hyperparameters; these flat names stay what job
files and commands have always written (``early_stopping = true``, ``ann_min_items = 1000``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from inspect import signature
from typing import Any

from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models import estimator_class
from ordrec.trainer.models.base import validate_params
from ordrec.trainer.models.coe import COE
from ordrec.trainer.models.dcr import (
    DCR,
    PAIRWISE_FLAT,
    SERVING_CONSTRAINTS,
    SERVING_DEFAULTS,
    EarlyStoppedDCR,
    PairwiseDCR,
    ValidatedRefinement,
    ValidationStopping,
    check_serving,
)
from ordrec.trainer.models.knnscal_selection import FLAT_NAMES as KNNSCAL_START
from ordrec.trainer.models.knnscal_selection import KnnScalStartSelection
from ordrec.trainer.models.memory import check_fit_memory
from ordrec.trainer.models.rtf import RTF
from ordrec.trainer.models.rtf_selection import DEFAULT_GRID, RTFGridSearch

# DCR's model selection under its flat names: flat name -> the wrapper setting it names (class,
# setting), whose default and constraints are the flat name's; the two switches: their default.
_DCR_SELECTION_SOURCES: dict[str, tuple[Any, str] | bool] = {
    "early_stopping": False,
    "validation_folds": (EarlyStoppedDCR, "folds"),
    "validation_fraction": (EarlyStoppedDCR, "fraction"),
    "patience": (ValidationStopping, "patience"),
    "val_tol": (ValidationStopping, "tol"),
    "pairwise_validation": True,
    "pairwise_margin": (ValidatedRefinement, "margin"),
    "pairwise_confidence": (ValidatedRefinement, "confidence"),
    "pairwise_validation_users": (ValidatedRefinement, "max_users"),
}
DCR_SELECTION: dict[str, Any] = {
    flat: source if isinstance(source, bool) else signature(source[0]).parameters[source[1]].default
    for flat, source in _DCR_SELECTION_SOURCES.items()
}
DCR_SELECTION_CONSTRAINTS: dict[str, list] = {
    flat: ["boolean"] if isinstance(source, bool) else source[0]._parameter_constraints[source[1]]
    for flat, source in _DCR_SELECTION_SOURCES.items()
}
DCR_SERVING = ("item_shrinkage", "ann_min_items", "ann_params")


# DCR's pairwise refinement (PairwiseDCR) and COE's and DCR's solver fields under their flat
# names, and the constraints of every flat name (the reproduce commands' flags are typed by them).
DCR_PAIRWISE = ("pairwise", *PAIRWISE_FLAT)
DCR_FLAT_CONSTRAINTS: dict[str, list] = {
    **DCR.flat_constraints(),
    "pairwise": ["boolean"],
    **{flat: PairwiseDCR._parameter_constraints[name] for flat, name in PAIRWISE_FLAT.items()},
}
COE_FLAT_CONSTRAINTS: dict[str, list] = COE.flat_constraints()


@dataclass
class Configured:
    """What to fit (an estimator or a model-selection wrapper) and how to write its artifact."""

    estimator: Any
    serving: dict[str, Any] = field(default_factory=dict)
    selection: tuple[str, ...] = ()  # the model-selection settings turned on, by flat name
    recorded: dict[str, Any] = field(
        default_factory=dict
    )  # given selection/serving settings, for the manifest
    kind: str = ""  # the registered kind (its memory predictor); configure sets it

    def fit(self, data: Any, check_memory: bool = True) -> Configured:
        """Fit in this process; unless ``check_memory`` is false, a fit predicted to need more
        memory than the process has left stops first (:class:`FitTooLarge`, naming both)."""
        if check_memory:
            check_fit_memory(self.kind, self.estimator, data)
        self.estimator.fit(data)
        return self

    def fit_on_cluster(self, data: Ratings, address: str) -> Configured:
        """The fit by DSGD on a cluster: only a plain DCR fits there (a ValueError names the
        model selection that does not)."""
        from ordrec.trainer.models.dcr_distributed import fit_on_cluster

        if self.selection:
            raise ValueError(
                f"the distributed DCR fit does not support {self.selection[0]}=True (fit it in one process)"
            )
        self.estimator = fit_on_cluster(self.estimator, data, address)
        return self

    def to_artifact(self) -> Artifact:
        """The fitted model's artifact; its manifest also records the selection and serving
        settings given (beside the estimator's own parameters)."""
        artifact = self.estimator.to_artifact(**self.serving)
        artifact.hyperparameters.update(self.recorded)
        return artifact


# RTF's grid search under its flat names (issue 34 moved it out of the estimator): flat name ->
# RTFGridSearch setting. RTF's early stopping and KnnScal's solver are settings groups whose
# fields the estimators take flat (``from_flat``); KnnScal's start selection is KNNSCAL_START.
RTF_SELECTION: dict[str, str] = {
    "grid_validation": "",
    "grid_n_components": "n_components",
    "grid_reg": "reg",
    "grid_margin": "margin",
    "grid_confidence": "confidence",
}


def accepted_params(kind: str) -> list[str]:
    """The flat setting names a ``kind`` takes: its estimator's parameters (a settings group
    also by its fields), then (DCR) its model selection and serving choices, (RTF) its grid
    search, (KNNSCAL) its start selection."""
    cls = estimator_class(kind)
    names = [*cls.param_names(), *(f for group in cls.nested_settings.values() for f in group.field_names())]
    extra = {
        "dcr": list(DCR_PAIRWISE) + list(DCR_SELECTION) + list(DCR_SERVING),
        "rtf": list(RTF_SELECTION),
        "knnscal": list(KNNSCAL_START),
    }
    return names + extra.get(kind, [])


def configure(kind: str, params: dict[str, Any]) -> Configured:
    """The estimator of ``kind`` set from flat ``params`` (unknown names and bad values are a
    ValueError naming them)."""
    unknown = set(params) - set(accepted_params(kind))
    if unknown:
        raise ValueError(f"{kind} has no parameter(s) {sorted(unknown)}; known: {accepted_params(kind)}")
    builders: dict[str, Callable[[dict[str, Any]], Configured]] = {
        "dcr": _dcr,
        "rtf": _rtf,
        "knnscal": _knnscal,
    }
    configured = builders.get(kind, _plain(kind))(dict(params))
    configured.kind = kind
    return configured


def _plain(kind: str) -> Callable[[dict[str, Any]], Configured]:
    return lambda params: Configured(estimator_class(kind).from_flat(**params))


def _dcr(params: dict[str, Any]) -> Configured:
    """DCR (its solver fields given flat merged into ``solver``), wrapped in ``PairwiseDCR``
    with ``pairwise``, that in ``ValidatedRefinement`` unless ``pairwise_validation`` is false,
    and the whole in ``EarlyStoppedDCR`` with ``early_stopping``."""
    recorded = {
        name: params[name] for name in [*DCR_SELECTION, *PAIRWISE_FLAT, *DCR_SERVING] if name in params
    }
    selection = {name: params.pop(name, default) for name, default in DCR_SELECTION.items()}
    validate_params("DCR", selection, DCR_SELECTION_CONSTRAINTS)
    serving = {name: params.pop(name) for name in DCR_SERVING if name in params}
    validate_params("DCR", serving, SERVING_CONSTRAINTS)
    check_serving(**dict(SERVING_DEFAULTS, **serving))  # an unknown index setting, before any fitting
    pairwise = {name: params.pop(name) for name in DCR_PAIRWISE if name in params}
    validate_params("DCR", pairwise, DCR_FLAT_CONSTRAINTS)  # named as given, before any fitting
    refine = pairwise.pop("pairwise", False)
    model = DCR.from_flat(**params)
    refinement = PairwiseDCR.from_flat(model, pairwise)
    holdout = dict(folds=selection["validation_folds"], fraction=selection["validation_fraction"])
    estimator: Any = model
    turned_on: list[str] = []
    if refine:
        estimator = refinement
        if selection["pairwise_validation"]:
            estimator = ValidatedRefinement(
                refinement,
                margin=selection["pairwise_margin"],
                confidence=selection["pairwise_confidence"],
                max_users=selection["pairwise_validation_users"],
                **holdout,
            )
        turned_on.append("pairwise")
    if selection["early_stopping"]:
        rule = ValidationStopping(patience=selection["patience"], tol=selection["val_tol"])
        estimator = EarlyStoppedDCR(estimator, stopping=rule, **holdout)
        turned_on.append("early_stopping")
    return Configured(estimator, serving, tuple(turned_on), recorded)


def _rtf(params: dict[str, Any]) -> Configured:
    """RTF, wrapped in ``RTFGridSearch`` when ``grid_validation`` is true (its grid from
    ``grid_n_components`` and ``grid_reg``, its rule from ``grid_margin`` and ``grid_confidence``)."""
    recorded = {name: params.pop(name) for name in RTF_SELECTION if name in params}
    validate_params(
        "RTF", {"grid_validation": recorded.get("grid_validation", False)}, {"grid_validation": ["boolean"]}
    )
    model = RTF.from_flat(**params)
    if not recorded.get("grid_validation", False):
        return Configured(model, recorded=recorded)
    grid = dict(DEFAULT_GRID)
    for name in ("grid_n_components", "grid_reg"):
        if name in recorded:
            grid[RTF_SELECTION[name]] = tuple(recorded[name])
    rule = {
        RTF_SELECTION[name]: recorded[name] for name in ("grid_margin", "grid_confidence") if name in recorded
    }
    return Configured(RTFGridSearch(model, grid, **rule), selection=("grid_validation",), recorded=recorded)


def _knnscal(params: dict[str, Any]) -> Configured:
    """KnnScal wrapped in its start selection (``neighbor_embedding``, ``ne_starts``,
    ``ne_rank_decay``), its solver fields given flat (``block_size=10000``) merged into ``solver``."""
    return Configured(KnnScalStartSelection.from_flat(**params))
