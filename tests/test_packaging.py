"""The installed layout: one `ordrec` namespace, every package folder listed."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = {
    "ordrec": ROOT / "ordrec",
    "ordrec.service": ROOT / "service",
    "ordrec.trainer": ROOT / "trainer",
    "ordrec.tools": ROOT / "tools",
}


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_folders() -> set[str]:
    found = set()
    for name, folder in SOURCE_ROOTS.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            found.add(".".join((name, *rel)))
    return found


def test_every_package_folder_is_installed_under_ordrec():
    listed = set(_setuptools()["packages"])
    assert listed == _package_folders()
    assert all(p == "ordrec" or p.startswith("ordrec.") for p in listed)


def test_source_folders_map_into_the_namespace():
    assert _setuptools()["package-dir"] == {k: str(v.relative_to(ROOT)) for k, v in SOURCE_ROOTS.items()}


def test_console_scripts_point_into_the_namespace():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts and all(target.startswith("ordrec.") for target in scripts.values())


def test_imports_resolve_to_the_source_folders():
    import ordrec.service.serving.server
    import ordrec.trainer.cli

    assert Path(ordrec.service.serving.server.__file__).parent == ROOT / "service" / "serving"
    assert Path(ordrec.trainer.cli.__file__).parent == ROOT / "trainer"


# ------------------------------------------------- dependencies and extras
def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirement_names(requirements: list[str]) -> set[str]:
    import re

    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def _third_party_imports(folder: Path) -> set[str]:
    """Distributions whose modules the .py files under ``folder`` import (stdlib and ordrec left out)."""
    import ast
    from importlib.metadata import packages_distributions

    dists = packages_distributions()
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    names -= set(sys.stdlib_module_names) | {"ordrec", "__future__"}
    # A module that is not installed here (tomli on Python >= 3.11) keeps its own name.
    return {d.lower().replace("_", "-") for n in names for d in dists.get(n, [n])}


def test_the_base_install_is_what_serving_imports():
    project = _project()
    base = _requirement_names(project["dependencies"])
    s3 = _requirement_names(project["optional-dependencies"]["s3"])  # imported only for s3:// registries
    # The tools (ordrec-loadtest, the server harness) run beside a server, from the same install.
    serving = set().union(*(_third_party_imports(ROOT / part) for part in ("service", "ordrec", "tools")))
    assert serving <= base | s3 | {"botocore"}, f"serving imports {serving - base - s3}, not in base or s3"
    assert {"scikit-learn", "tqdm"}.isdisjoint(base)  # the trainer's, in the train extra


def test_the_train_extra_covers_what_only_the_trainer_imports():
    project = _project()
    available = _requirement_names(project["dependencies"] + project["optional-dependencies"]["train"])
    # pyarrow is imported only when a .parquet file is read (trainer/data/parquet.py): its own extra.
    available |= _requirement_names(project["optional-dependencies"]["parquet"])
    # Likewise implicit (reproduce topn's baseline) and Dask (the distributed DCR fit, --cluster).
    for extra in ("baselines", "distributed"):
        available |= _requirement_names(project["optional-dependencies"][extra])
    trainer = _third_party_imports(ROOT / "trainer")
    assert trainer <= available, f"the trainer imports {trainer - available}, in neither base nor train"
    assert any(
        dep.startswith("ordrec[") and "train" in dep for dep in project["optional-dependencies"]["dev"]
    )


def _python(code: str) -> str:
    import subprocess

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


# Importing these modules fails, as in an install without the train extra.
_BLOCK_TRAIN_EXTRA = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sklearn", "tqdm", "tomli"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
"""


def test_serving_imports_without_the_train_extra():
    out = _python(
        _BLOCK_TRAIN_EXTRA
        + """
import pkgutil, importlib, ordrec.service, ordrec.tools
for package in (ordrec.service, ordrec.tools):
    for m in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not m.name.endswith(".__main__"):  # importing it would run the server
            importlib.import_module(m.name)
import ordrec.client_cli
print(sorted(m for m in sys.modules
             if m.startswith("ordrec.trainer") or m.split(".")[0] in ("sklearn", "tqdm")))
"""
    )
    assert out.strip() == "[]"


def test_the_trainer_without_its_extra_says_what_to_install():
    out = _python(
        _BLOCK_TRAIN_EXTRA
        + """
import contextlib, io
from ordrec.trainer.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(["reproduce", "knnscal", "--digits", "--runs", "1", "--n-neighbors", "5"])
print(code, err.getvalue())
"""
    )
    assert out.startswith("1 ") and "pip install 'ordrec[train]'" in out


def test_the_python_client_imports_only_grpc_and_the_generated_code():
    out = _python(
        "import sys, ordrec.client; print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'numpy', 'numba', 'scipy', 'redis', 'prometheus_client'}), "
        "sorted(m for m in sys.modules if m.startswith(('ordrec.service', 'ordrec.trainer'))))"
    )
    assert out.strip() == "[] []"


# ---------------------------------------------------------- wheel and sdist
def test_the_proto_files_live_once_in_proto():
    """The wheel gets them from proto/ at build time (setup.py), so the tree holds no copy to go stale."""
    sources = sorted((ROOT / "proto" / "ordrec" / "v1").glob("*.proto"))
    assert sources
    assert not list((ROOT / "ordrec").rglob("*.proto"))


def test_license():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert _project()["license"] == "Apache-2.0" and _project()["license-files"] == ["LICENSE"]


def test_the_sdist_builds_a_wheel_with_the_protos_and_the_license(tmp_path):
    """``python -m build`` makes the sdist, then the wheel from the sdist (so the sdist is complete)."""
    import subprocess
    import tarfile
    import zipfile

    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "deprecated" not in (result.stdout + result.stderr).lower()
    (wheel,) = tmp_path.glob("*.whl")
    (sdist,) = tmp_path.glob("*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    protos = {p.name for p in (ROOT / "proto" / "ordrec" / "v1").glob("*.proto")}
    assert {f"ordrec/v1/{p}" for p in protos} <= set(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "ordrec/client.py" in names and "ordrec/py.typed" in names
    assert all(n.startswith(("ordrec/", "ordrec-")) for n in names), [n for n in names if "ordrec" not in n]
    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    assert {f"proto/ordrec/v1/{p}" for p in protos} <= members and "LICENSE" in members


def test_the_docker_build_copies_what_the_build_reads():
    """No Docker engine here to build the image: at least `pip install .` gets every file pyproject names."""
    text = (ROOT / "Dockerfile").read_text()
    copied = {
        word
        for line in text.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for word in line.split()[1:-1]
    }
    project = _project()
    assert {project["readme"], *project["license-files"], "pyproject.toml", "setup.py", "proto"} <= copied
    assert set(SOURCE_ROOTS) and {str(v.relative_to(ROOT)) for v in SOURCE_ROOTS.values()} <= copied
    # Serving (and s3:// registries) by default; --build-arg EXTRAS=train adds the trainer's dependencies.
    assert 'pip install ".[s3${EXTRAS:+,$EXTRAS}]"' in text and 'ARG EXTRAS=""' in text
