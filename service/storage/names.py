"""Names in a registry: models, versions, files beside a model's versions, registry-level files."""

from __future__ import annotations

import re

from ordrec.service.storage.artifact import ArtifactError

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


# Files beside a model's versions (e.g. the training job's events checkpoint): plain names,
# at most one folder deep, never hidden, so they never look like a version or a temporary folder.
_MODEL_FILE_RE = re.compile(r"^[A-Z0-9_]{1,64}$|^[a-z]{1,32}/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def validate_model_file(path: str) -> str:
    """``path`` if it may name a file beside a model's versions, else ValueError."""
    if not _MODEL_FILE_RE.match(path) or ".." in path:
        raise ValueError(f"{path!r} is not a model file name (NAME, or folder/name)")
    return path


# Fixed width, so text order is time order: 20261125T223500.123456Z
_VERSION_RE = re.compile(r"^\d{8}T\d{6}\.\d{6}Z$")


_VERSION_FMT = "%Y%m%dT%H%M%S.%fZ"


_ROOT_FILE_RE = re.compile(r"^[A-Z][A-Z_]{0,63}$")


def validate_model_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"model name {name!r} must be 1-64 characters of a-z, 0-9, '_', '-', '.'"
            " starting with a letter or digit"
        )
    return name


def validate_root_file(filename: str) -> str:
    """A registry-level file's name: capitals and underscores (``FORGOTTEN``), nothing else."""
    if not _ROOT_FILE_RE.match(filename):
        raise ArtifactError(f"{filename!r} is not a registry-level file name (A-Z and _)")
    return filename


def is_version(text: str) -> bool:
    return bool(_VERSION_RE.match(text))
