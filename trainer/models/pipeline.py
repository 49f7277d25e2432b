"""What one fit of a kind does, built from the flat settings a job table or
``ordrec-train train --set`` gives: the estimator, then each wrapper that selects, refines or
stops it (innermost first), then the serving choices written into its artifact.

:data:`WRAPPERS` and :data:`PUBLISHING` are the one table of flat names beyond the estimators'
own parameters (a settings group's fields, ``solver``'s, are given flat under their own names).
Read it top to bottom for a kind, e.g. DCR::

    DCR(n_components=..., ...)                       the estimator's own parameters
    PairwiseDCR(..)         when pairwise            pairwise_learning_rate, ...
    ValidatedRefinement(..) when pairwise_validation (default on, only with pairwise)
    EarlyStoppedDCR(..)     when early_stopping      validation_folds, patience, val_tol, ...
    SettingsTuner(..)       when tune (on in jobs)   tune_budget_seconds, tune_validation_fraction, ...
    to_artifact(..)                                  item_shrinkage, ann_min_items, ann_params

KnnScal is ``KnnScal(..)``, then always ``ValidatedIterations(..)`` (``keep_iterations``),
``KnnScalStartSelection(..)`` (``neighbor_embedding``, ...) and ``PolishedMap(..)``
(``polish_rounds``, ``polish_sharpness``). RTF is ``RTF(..)``, then ``EarlyStoppedRTF(..)`` when
``early_stopping`` (default on: ``validation_posts``, ``patience``, ``min_iter``, ``val_tol``, ...),
then ``RTFGridSearch(..)`` when ``grid_validation``. A switch given as a table of its settings
(``early_stopping = {patience = 9}``) turns it on with them; a setting given flat beside it wins.

A new wrapper is one more :class:`Wrapper` row; nothing else lists names.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from inspect import signature
from typing import Any

from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.data.interactions import ordinal_levels
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models import estimator_class
from ordrec.trainer.models.base import validate_params
from ordrec.trainer.models.dcr import (
    SERVING_CONSTRAINTS,
    SERVING_DEFAULTS,
    EarlyStoppedDCR,
    PairwiseDCR,
    ValidatedRefinement,
    ValidationStopping,
    check_serving,
)
from ordrec.trainer.models.knnscal_selection import KnnScalStartSelection, PolishedMap, ValidatedIterations
from ordrec.trainer.models.memory import check_fit_memory
from ordrec.trainer.models.rtf_selection import DEFAULT_GRID, RTFGridSearch
from ordrec.trainer.models.rtf_stopping import EarlyStoppedRTF
from ordrec.trainer.models.selection import PlateauStopping, planned_fits
from ordrec.trainer.models.tuning import SettingsTuner, chosen_levels, describe_tuning


@dataclass(frozen=True)
class Declared:
    """Settings a wrapper row declares itself (not a class's ``__init__``): defaults and constraints."""

    defaults: dict[str, Any]
    _parameter_constraints: dict[str, list]


@dataclass(frozen=True)
class Wrapper:
    """One step around a kind's estimator: ``build(inner, **settings)`` makes it.

    ``switch`` is the flat boolean that turns it on (default ``on``; None: always on);
    ``settings`` maps each flat name to the setting of ``build`` it sets, whose default and
    constraints are those the first class of ``declared_by`` having it declares (its
    ``__init__`` default, its ``_parameter_constraints``). ``within`` names a switch that must
    be on too (the validation of a refinement needs the refinement).
    """

    switch: str | None
    build: Callable[..., Any]
    settings: dict[str, str]
    declared_by: tuple[Any, ...]
    on: bool = False
    within: str | None = None
    jobs_on: bool = False  # on by default in ``ordrec-train train`` and the cron job only

    def declared(self, setting: str) -> tuple[Any, list]:
        """The default and constraints of one of ``build``'s settings."""
        owner = next(o for o in self.declared_by if setting in o._parameter_constraints)
        if isinstance(owner, Declared):
            return owner.defaults[setting], owner._parameter_constraints[setting]
        return signature(owner).parameters[setting].default, owner._parameter_constraints[setting]

    def names(self) -> list[str]:
        """Its flat names: the switch, then the settings."""
        return ([self.switch] if self.switch else []) + list(self.settings)

    def constraints(self) -> dict[str, list]:
        """Each flat name's constraints (a switch is a boolean)."""
        own = {flat: self.declared(setting)[1] for flat, setting in self.settings.items()}
        return ({self.switch: ["boolean"]} if self.switch else {}) | own

    def applies(self, given: dict[str, Any]) -> bool:
        """Whether the flat settings ``given`` turn it on."""
        switches = [s for s in (self.switch, self.within) if s is not None]
        return all(given.get(s, self.on if s == self.switch else False) for s in switches)

    def recorded(self, given: dict[str, Any]) -> dict[str, Any]:
        """Its settings under their flat names, each given or its default (what a manifest records)."""
        return {flat: given.get(flat, self.declared(setting)[0]) for flat, setting in self.settings.items()}

    def wrap(self, inner: Any, given: dict[str, Any]) -> Any:
        """``inner`` wrapped, each setting given or its default."""
        flat = self.recorded(given)
        return self.build(inner, **{setting: flat[name] for name, setting in self.settings.items()})


def _early_stopped(inner: Any, *, patience: int, tol: float, **holdout: Any) -> EarlyStoppedDCR:
    return EarlyStoppedDCR(inner, stopping=ValidationStopping(patience=patience, tol=tol), **holdout)


def _grid_search(inner: Any, *, n_components: Any, reg: Any, **rule: Any) -> RTFGridSearch:
    return RTFGridSearch(inner, {"n_components": tuple(n_components), "reg": tuple(reg)}, **rule)


# The settings chosen on validation within a time budget (outermost: it fits the whole pipeline).
_TUNE = Wrapper(
    "tune",
    SettingsTuner,
    {
        "tune_budget_seconds": "budget_seconds",
        "tune_validation_fraction": "validation_fraction",
        "tune_split": "split",
        "tune_keep": "keep",
        "tune_confidence": "confidence",
        "tune_min_users": "min_users",
    },
    (SettingsTuner,),
    jobs_on=True,
)

# The hold-outs every DCR model selection is made on.
_DCR_HOLDOUT = {"validation_folds": "folds", "validation_fraction": "fraction"}

WRAPPERS: dict[str, tuple[Wrapper, ...]] = {
    "dcr": (
        Wrapper(
            "pairwise",
            PairwiseDCR,
            {
                "pairwise_learning_rate": "learning_rate",
                "pairwise_reg": "reg",
                "pairwise_max_iter": "max_iter",
                "pairs_per_epoch": "pairs_per_epoch",
            },
            (PairwiseDCR,),
        ),
        Wrapper(
            "pairwise_validation",
            ValidatedRefinement,
            {
                **_DCR_HOLDOUT,
                "pairwise_margin": "margin",
                "pairwise_confidence": "confidence",
                "pairwise_validation_max_users": "max_users",
            },
            (ValidatedRefinement,),
            on=True,
            within="pairwise",
        ),
        Wrapper(
            "early_stopping",
            _early_stopped,
            {**_DCR_HOLDOUT, "patience": "patience", "val_tol": "tol"},
            (EarlyStoppedDCR, ValidationStopping),
        ),
        _TUNE,
    ),
    "coe": (_TUNE,),
    "rtf": (
        Wrapper(
            "early_stopping",
            EarlyStoppedRTF,
            {name: name for name in PlateauStopping.field_names()},
            (EarlyStoppedRTF,),
            on=True,
        ),
        Wrapper(
            "grid_validation",
            _grid_search,
            {
                "grid_n_components": "n_components",
                "grid_reg": "reg",
                "grid_margin": "margin",
                "grid_confidence": "confidence",
            },
            (RTFGridSearch, Declared(DEFAULT_GRID, {"n_components": [list, tuple], "reg": [list, tuple]})),
        ),
    ),
    "knnscal": (
        Wrapper(None, ValidatedIterations, {"keep_iterations": "keep_iterations"}, (ValidatedIterations,)),
        Wrapper(
            None,
            KnnScalStartSelection,
            {
                "neighbor_embedding": "method",
                "neighbor_embedding_starts": "n_starts",
                "neighbor_embedding_rank_decay": "rank_decay",
            },
            (KnnScalStartSelection,),
        ),
        Wrapper(
            None,
            PolishedMap,
            {"polish_rounds": "rounds", "polish_sharpness": "sharpness"},
            (PolishedMap,),
        ),
    ),
}


@dataclass(frozen=True)
class Publishing:
    """The serving choices a kind's ``to_artifact`` takes: each flat name's constraints, and the
    check of them together (an unknown index setting) made before any fitting."""

    constraints: dict[str, list]
    check: Callable[..., None]


PUBLISHING: dict[str, Publishing] = {
    "dcr": Publishing(SERVING_CONSTRAINTS, lambda **given: check_serving(**dict(SERVING_DEFAULTS, **given)))
}

# Flat names that were renamed, per kind: old -> new (the old one still works, with a warning).
RENAMED: dict[str, dict[str, str]] = {
    "dcr": {"pairwise_validation_users": "pairwise_validation_max_users"},
    "knnscal": {
        "ne_starts": "neighbor_embedding_starts",
        "ne_rank_decay": "neighbor_embedding_rank_decay",
        "ne_exact_max_n": "exact_max_n",
        "cmds_max_n": "classical_mds_max_n",
        "hop2_fraction": "two_hop_fraction",
        "refinement": "keep_iterations",
    },
}


def accepted_params(kind: str) -> list[str]:
    """The flat setting names a ``kind`` takes: its estimator's parameters (a settings group
    also by its fields), its wrappers' switches and settings, its serving choices."""
    cls = estimator_class(kind)
    names = [*cls.param_names(), *(f for group in cls.nested_settings.values() for f in group.field_names())]
    for row in WRAPPERS.get(kind, ()):
        names += [name for name in row.names() if name not in names]
    return names + list(_publishing(kind).constraints)


def flat_constraints(kind: str) -> dict[str, list]:
    """The constraints of every flat name of ``kind`` (the reproduce commands type their flags by them)."""
    merged = dict(estimator_class(kind).flat_constraints())
    for row in WRAPPERS.get(kind, ()):
        merged.update(row.constraints())
    return merged | _publishing(kind).constraints


def job_defaults(kind: str) -> dict[str, bool]:
    """The switches ``ordrec-train train`` and the cron job turn on unless a model says otherwise."""
    return {row.switch: True for row in WRAPPERS.get(kind, ()) if row.jobs_on and row.switch}


def wrapper(kind: str, switch: str) -> Wrapper:
    """``kind``'s wrapper turned on by ``switch``."""
    return next(w for w in WRAPPERS[kind] if w.switch == switch)


def wrapper_settings(kind: str, switch: str, given: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``kind``'s wrapper ``switch`` among the flat settings ``given``, by the
    wrapper's own names (``pairwise_learning_rate`` -> ``learning_rate``)."""
    return {setting: given[flat] for flat, setting in wrapper(kind, switch).settings.items() if flat in given}


@dataclass
class FitPipeline:
    """One fit of a kind: ``estimator`` (the outermost wrapper, or the estimator alone), the
    switches turned on (``selection``), the serving choices its artifact is written with, and
    the flat settings its manifest records besides the estimator's own parameters."""

    estimator: Any
    kind: str
    serving: dict[str, Any] = field(default_factory=dict)
    selection: tuple[str, ...] = ()
    recorded: dict[str, Any] = field(default_factory=dict)

    def planned_fits(self) -> int:
        """How many times the estimator is fitted (each hold-out of a model selection once, the
        final fit once)."""
        return planned_fits(self.estimator)

    def describe(self) -> str:
        """One line for the fit log: the estimator, the wrappers turned on and the fits they run."""
        turned_on = f" with {', '.join(self.selection)}" if self.selection else ""
        fits = self.planned_fits()
        return f"{self.kind}{turned_on}: {fits} fit{'s' if fits != 1 else ''} of the estimator"

    @property
    def tuned(self) -> bool:
        """Whether the settings tuner wraps the fit (it chooses settings on validation)."""
        return isinstance(self.estimator, SettingsTuner)

    @property
    def chooses_levels(self) -> bool:
        """Whether the fit chooses how raw interactions become levels itself (the settings
        tuner does, on validation): its data is then given unlevelled."""
        return self.tuned

    def fit_note(self) -> str | None:
        """A line for the fit log on what the fit chose (the tuner's choice), or None."""
        return describe_tuning(self.estimator.record()) if self.tuned else None

    def fitted_data(self, data: Any) -> Any:
        """``data`` as the fitted model saw it: levelled by the mapping the fit chose, if any."""
        mapping = chosen_levels(self.estimator)
        return data if mapping is None else ordinal_levels(data, mapping)

    def fit(self, data: Any, check_memory: bool = True, **fit_params: Any) -> FitPipeline:
        """Fit in this process; unless ``check_memory`` is false, a fit predicted to need more
        memory than the process has left stops first (:class:`FitTooLarge`, naming both).
        ``fit_params`` go to the outermost estimator's ``fit`` (as a scikit-learn Pipeline's do):
        DCR's research options, e.g. ``variants``, ``validation`` and ``stopping``."""
        if check_memory:
            check_fit_memory(self.kind, self.estimator, data)
        self.estimator.fit(data, **fit_params)
        return self

    @property
    def best_estimator_(self) -> Any:
        """The fitted model the artifact serves: the estimator's, inside any wrappers."""
        return getattr(self.estimator, "best_estimator_", self.estimator)

    def fit_on_cluster(self, data: Ratings, address: str) -> FitPipeline:
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
        """The fitted model's artifact; its manifest also records the wrappers' switches and the
        settings given (beside the estimator's own parameters)."""
        artifact = self.estimator.to_artifact(**self.serving)
        artifact.hyperparameters.update(self.recorded)
        return artifact


def configure(kind: str, params: dict[str, Any]) -> FitPipeline:
    """The fit of ``kind`` from flat ``params``: unknown names and bad values are a ValueError
    naming them, before any fitting; a renamed name is taken with a FutureWarning."""
    params = _switch_tables(kind, _renamed(kind, params))
    unknown = set(params) - set(accepted_params(kind))
    if unknown:
        raise ValueError(f"{kind} has no parameter(s) {sorted(unknown)}; known: {accepted_params(kind)}")
    wrappers, serving = _wrapper_settings(kind, params), _serving(kind, params)
    own = {name: value for name, value in params.items() if name not in wrappers and name not in serving}
    estimator: Any = estimator_class(kind).from_flat(**own)
    turned_on = []
    for row in WRAPPERS.get(kind, ()):  # innermost first
        if row.applies(wrappers):
            estimator = row.wrap(estimator, wrappers)
            turned_on += [row.switch] if row.switch and not row.on else []
    return FitPipeline(estimator, kind, serving, tuple(turned_on), _recorded(kind, wrappers, serving))


def _recorded(kind: str, wrappers: dict[str, Any], serving: dict[str, Any]) -> dict[str, Any]:
    """What the manifest records beside the estimator's parameters: every wrapper's switch, the
    settings of those that ran (given or default), the serving choices given."""
    recorded: dict[str, Any] = {}
    for row in WRAPPERS.get(kind, ()):
        applies = row.applies(wrappers)
        recorded.update({row.switch: applies} if row.switch else {})
        recorded.update(row.recorded(wrappers) if applies else {})
    return recorded | serving


def _publishing(kind: str) -> Publishing:
    return PUBLISHING.get(kind, Publishing({}, lambda **given: None))


def _renamed(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with each renamed flat name under its new name, also inside a settings group
    given as a table (``solver = {cmds_max_n = 900}``); a FutureWarning says so."""
    out = _new_names(kind, params)
    for group in estimator_class(kind).nested_settings:
        if isinstance(out.get(group), Mapping):
            out[group] = _new_names(kind, out[group])
    return out


def _switch_tables(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with a wrapper's switch given as a table of its settings turned on, the
    settings given flat (a flat name given beside the table wins)."""
    out = dict(params)
    for switch, settings in ((row.switch, row.settings) for row in WRAPPERS.get(kind, ()) if row.switch):
        table = out.get(switch)
        if isinstance(table, Mapping):
            unknown = set(table) - set(settings)
            if unknown:
                raise ValueError(f"the {switch!r} table of {kind} has no field(s) {sorted(unknown)}")
            out = {**table, **out, switch: True}
    return out


def _new_names(kind: str, given: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(given)
    for old, new in RENAMED.get(kind, {}).items():
        if old in out:
            # FutureWarning: shown by default, as a deprecation meant for users (job files) is.
            warnings.warn(
                f"the setting {old!r} is now {new!r}; {old!r} will be removed", FutureWarning, stacklevel=4
            )
            out.setdefault(new, out.pop(old))
    return out


def _wrapper_settings(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The wrappers' flat settings among ``params``, checked by name before any fitting."""
    given: dict[str, Any] = {}
    for row in WRAPPERS.get(kind, ()):
        mine = {name: params[name] for name in row.names() if name in params}
        validate_params(estimator_class(kind).__name__, mine, row.constraints())
        given.update(mine)
    return given


def _serving(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The serving choices among ``params``, checked (an unknown index setting too) before any fitting."""
    publishing = _publishing(kind)
    serving = {name: params[name] for name in publishing.constraints if name in params}
    validate_params(estimator_class(kind).__name__, serving, publishing.constraints)
    publishing.check(**serving)
    return serving
