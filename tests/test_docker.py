"""The Dockerfile and its lock files, checked without a Docker engine (`make docker-smoke` builds
and runs the image; it is too slow for the suite). docs/docker.md describes what is checked here."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The Python the locks are resolved for (`make lock`: --python-version 3.11): both bases have 3.11.
LOCK_PYTHON = {"python_version": "3.11", "python_full_version": "3.11.2"}
LOCKS = {"serve": ["s3"], "train": ["s3", "train", "distributed"]}  # the train image is also a Dask worker


def _instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n(\s*#.*\n)*", " ", text)
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def _final_stage() -> list[str]:
    lines = _instructions(DOCKERFILE)
    last_from = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    return lines[last_from:]


def _index(lines: list[str], pattern: str) -> int:
    found = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    assert len(found) == 1, f"expected one instruction matching {pattern!r}, found {len(found)}"
    return found[0]


def _locked(name: str) -> dict[str, list[Requirement]]:
    """Lock file requirements by name (a name may appear once per Python-version marker)."""
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    entries = re.sub(r"\\\n\s*", " ", text).splitlines()
    locked: dict[str, list[Requirement]] = {}
    for entry in entries:
        if not entry.strip() or entry.lstrip().startswith("#"):
            continue
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), (
            f"requirements/{name}.txt: no hash in {entry!r}"
        )
        req = Requirement(entry.split(" --hash")[0].strip())
        assert str(req.specifier).startswith("=="), f"requirements/{name}.txt: {req} is not pinned"
        locked.setdefault(canonicalize_name(req.name), []).append(req)
    return locked


def _applies(req: Requirement, extras: list[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**LOCK_PYTHON, "extra": extra}) for extra in ["", *extras])


def _wanted(extras: list[str]) -> list[Requirement]:
    """pyproject's dependencies, these extras' and the build's, for the locks' Python."""
    reqs = PYPROJECT["project"]["dependencies"] + PYPROJECT["build-system"]["requires"]
    for extra in extras:
        reqs += PYPROJECT["project"]["optional-dependencies"][extra]
    return [r for r in map(Requirement, reqs) if _applies(r, extras)]


def test_the_base_image_is_pinned_by_digest_and_overridable():
    assert re.search(r"^ARG BASE=[\w./:-]+@sha256:[0-9a-f]{64}$", DOCKERFILE, re.M)
    assert "FROM ${BASE}" in _instructions(DOCKERFILE)
    assert "docker-base:" in (ROOT / "Makefile").read_text()


def test_dependencies_are_installed_from_the_lock_before_the_source_is_copied():
    stage = _final_stage()
    install = _index(stage, r"pip install --no-deps --require-hashes -r \S*\$\{EXTRAS:-serve\}\.txt")
    source = _index(stage, r"^COPY --from=source ")
    project = _index(stage, r'pip install "\.\[s3\$\{EXTRAS:\+,\$EXTRAS\}\]" --no-deps --no-build-isolation')
    assert install < source < project
    # Nothing before the dependencies' layer copies anything but the lock files.
    copies = [line for line in stage[:install] if line.startswith(("COPY", "ADD"))]
    assert copies == ["COPY requirements/serve.txt requirements/train.txt /opt/ordrec-locks/"]


def test_a_source_edit_reruns_only_the_last_steps():
    """Settings (EXPOSE, CMD, ...) sit above the source copy, so they stay cached too."""
    stage = _final_stage()
    after = stage[_index(stage, r"^COPY --from=source ") :]
    assert [line.split()[0] for line in after] == ["COPY", "RUN", "USER"]


def test_the_source_stage_copies_only_what_the_build_reads():
    """An edit elsewhere (docs, tests) must not invalidate the image's source layers."""
    lines = _instructions(DOCKERFILE)
    start = lines.index("FROM scratch AS source")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("FROM "))
    assert all(line.startswith("COPY ") for line in lines[start + 1 : end])
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"tests", "benchmarks", ".venv", ".git"} <= set(ignored)


@pytest.mark.parametrize("lock, extras", LOCKS.items())
def test_each_lock_pins_exactly_what_pyproject_asks(lock, extras):
    locked = _locked(lock)
    for req in _wanted(extras):
        name = canonicalize_name(req.name)
        assert name in locked, f"requirements/{lock}.txt lacks {req}: run `make lock`"
        for pin in locked[name]:
            version = str(pin.specifier).removeprefix("==")
            assert req.specifier.contains(version, prereleases=True), (
                f"requirements/{lock}.txt pins {pin}, pyproject asks {req}: run `make lock`"
            )


def test_the_serving_lock_leaves_the_trainer_out():
    train_only = {canonicalize_name(r.name) for r in _wanted(["train"])} - {
        canonicalize_name(r.name) for r in _wanted(["s3"])
    }
    assert train_only and not train_only & set(_locked("serve"))
    assert train_only <= set(_locked("train"))


def test_the_locks_come_from_make_lock():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lock: ", makefile, re.M) and "--generate-hashes" in makefile
    for lock in LOCKS:
        assert "#    make lock" in (ROOT / "requirements" / f"{lock}.txt").read_text()


def test_the_numba_cache_is_compiled_into_the_image():
    stage = _final_stage()
    env = stage[_index(stage, r"^ENV .*NUMBA_CACHE_DIR=")]
    cache = re.search(r"NUMBA_CACHE_DIR=(\S+)", env).group(1)
    assert cache.startswith("/opt/ordrec/")  # inside the image, not a volume or the user's home
    warm = _index(stage, r"from ordrec\.service\.serving\.server import warm_up_kernels; warm_up_kernels\(\)")
    assert warm > _index(stage, r"^COPY --from=source ")
    assert 'chmod -R a+rwX "$NUMBA_CACHE_DIR"' in stage[warm]  # numba ignores a cache it cannot write


def test_metrics_bind_to_loopback_and_every_process_port_is_exposed():
    cmd = _final_stage()[_index(_final_stage(), r"^CMD ")]
    assert '"--metrics-host", "127.0.0.1"' in cmd and '"--metrics-port", "9095"' in cmd
    assert '"--processes", "0"' in cmd
    expose = _final_stage()[_index(_final_stage(), r"^EXPOSE ")].split()[1:]
    assert "50051" in expose and "9095-9110" in expose  # --processes 0: process i on 9095+i


def test_docker_smoke_is_not_part_of_the_test_target():
    makefile = (ROOT / "Makefile").read_text()
    test_target = re.search(r"^test: (.*)$", makefile, re.M).group(1)
    assert "docker" not in test_target and re.search(r"^docker-smoke:", makefile, re.M)


def test_markers_are_evaluated_for_the_locks_python():
    """The helper the lock checks rely on: tomli is the train extra's only for Python < 3.11."""
    assert not _applies(Requirement("tomli>=2.0; python_version < '3.11'"), ["train"])
    assert Marker("python_version >= '3.11'").evaluate(LOCK_PYTHON)
