"""The installed layout: one `ordrec` namespace, every package folder listed."""
from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = {"ordrec": ROOT / "ordrec", "ordrec.service": ROOT / "service", "ordrec.trainer": ROOT / "trainer",
                "ordrec.tools": ROOT / "tools"}


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
    import ordrec.service.server
    import ordrec.trainer.cli

    assert Path(ordrec.service.server.__file__).parent == ROOT / "service"
    assert Path(ordrec.trainer.cli.__file__).parent == ROOT / "trainer"
