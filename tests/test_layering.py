"""The layering contract (docs/architecture.md, "The parts") beyond what import-linter sees:
tests, benchmarks and scripts use public names of ordrec only: no private import, no private attribute."""

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


# ------------------------------------------------------------ attribute access
# What tests, benchmarks and scripts may still read behind a leading underscore, and why.
# argparse keeps a parser's sub-commands and options only in private attributes.
FOREIGN_PRIVATES = {"_actions", "_choices_actions", "_group_actions", "_subparsers"}
# The estimator protocol every kind declares (scikit-learn's names; docs/architecture.md,
# "Adding a model kind"): the constraints table and the check that reads it.
PROTOCOL_PRIVATES = {"_parameter_constraints", "_validate_params"}
# Reaches into a module's privates waiting for a public name (none now); an entry no longer
# used fails the check, so the list only shrinks.
PENDING: set[tuple[str, str]] = set()
NAMED_ACCESS = {"getattr", "setattr", "hasattr", "delattr"}  # also monkeypatch.setattr/delattr


def _named_privates(call: ast.Call) -> list[str]:
    """Private names a ``getattr``-like call reaches by string: ``setattr(x, "_y", v)`` or
    ``monkeypatch.setattr("ordrec.a._b", v)``."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name not in NAMED_ACCESS:
        return []
    strings = [a.value for a in call.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return [part for s in strings for part in s.split(".") if _private(part)]


def _own_accesses(tree: ast.Module) -> set[int]:
    """Attribute nodes on a method's first parameter (``self``, ``cls``) of a class the file
    defines: that class's privates are the file's own."""
    own = set()
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        for method in cls.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
                continue
            if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in method.decorator_list):
                continue
            first = method.args.args[0].arg
            own.update(
                id(node)
                for node in ast.walk(method)
                if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == first
            )
    return own


def private_attributes(source: str) -> list[str]:
    """Every ``x._name`` (or ``getattr(x, "_name")``) in ``source`` that reaches behind an
    underscore of something other than the file's own classes, as ``line: _name``."""
    tree = ast.parse(source)
    own = _own_accesses(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if id(node) not in own:
                found.append(f"{node.lineno}: {node.attr}")
        elif isinstance(node, ast.Call):
            found += [f"{node.lineno}: {name}" for name in _named_privates(node)]
    return sorted(found, key=lambda f: (int(f.split(":")[0]), f))


def _excused(file: str, finding: str) -> bool:
    name = finding.split(": ", 1)[1]
    return name in FOREIGN_PRIVATES | PROTOCOL_PRIVATES or (file, name) in PENDING


def test_the_check_sees_private_attributes_however_they_are_reached():
    source = """
index.item_factors, index._item, topk._exclude_kernel.signatures
getattr(est, "_embed"), setattr(ann, "_map_in", None), getattr(est, "coordinates_")
monkeypatch.setattr(ann, "_map_in", print)
monkeypatch.setattr("ordrec.service.indices.topk._exclude_kernel", print)
monkeypatch.setattr("builtins.hash", print), served.__class__
class Fake:
    def method(self, other):
        return self._lock, other._lock
    @classmethod
    def make(cls):
        return cls._registry
    @staticmethod
    def peek(index):
        return index._item
cls = estimator_class("dcr")
cls._parameter_constraints
"""
    assert private_attributes(source) == [
        "2: _exclude_kernel",
        "2: _item",
        "3: _embed",
        "3: _map_in",
        "4: _map_in",
        "5: _exclude_kernel",
        "9: _lock",
        "15: _item",
        "17: _parameter_constraints",
    ]


def test_tests_benchmarks_and_scripts_reach_no_private_attribute():
    offenders = {}
    for folder in CLIENT_FOLDERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            file = f"{folder}/{path.name}"
            found = [f for f in private_attributes(path.read_text(encoding="utf-8")) if not _excused(file, f)]
            if found:
                offenders[file] = found
    assert offenders == {}


def test_every_pending_exception_is_still_needed():
    """An entry of ``PENDING`` goes when its access does, so the list only shrinks."""
    used = set()
    for file, name in PENDING:
        source = (ROOT / file).read_text(encoding="utf-8") if (ROOT / file).exists() else ""
        if any(f.endswith(f": {name}") for f in private_attributes(source)):
            used.add((file, name))
    assert PENDING - used == set()
