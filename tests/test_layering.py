"""The layering contract (docs/architecture.md, "The parts") beyond what import-linter sees:
tests, benchmarks and scripts use public names of ordrec only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENT_FOLDERS = ("tests", "benchmarks", "scripts")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(source: str) -> list[str]:
    """Every ``ordrec`` import in ``source`` that names a private module or attribute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ordrec"):
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names if alias.name.startswith("ordrec")]
        else:
            continue
        found += [m for m in modules if any(_private(part) for part in m.split("."))]
    return found


def test_the_check_sees_private_modules_and_names():
    assert private_imports("from ordrec.trainer.models import _x_kernels as K") == [
        "ordrec.trainer.models._x_kernels"
    ]
    assert private_imports("from ordrec.trainer.reproduce.rtf import _TestSet, run") == [
        "ordrec.trainer.reproduce.rtf._TestSet"
    ]
    assert private_imports("import ordrec.service._hidden\nfrom ordrec import __version__") == [
        "ordrec.service._hidden"
    ]


def test_tests_benchmarks_and_scripts_import_only_public_names():
    offenders = {}
    for folder in CLIENT_FOLDERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            found = private_imports(path.read_text(encoding="utf-8"))
            if found:
                offenders[f"{folder}/{path.name}"] = found
    assert offenders == {}
