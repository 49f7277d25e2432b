"""Check the import contracts in pyproject.toml ([tool.importlinter]) with import-linter.

The repository keeps service/, trainer/ and tools/ at the top and setuptools
maps them into the ``ordrec`` namespace; import-linter reads packages from one
folder tree, so this lays the installed tree out as symlinks in a temporary
folder (from pyproject's package-dir) and runs ``lint-imports`` over it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def lay_out(package_dir: dict[str, str], into: Path) -> None:
    """Symlink each mapped folder at its dotted name's path under ``into``."""
    for name, folder in sorted(package_dir.items(), key=lambda item: item[0].count(".")):
        target = into.joinpath(*name.split("."))
        if name.count(".") == 0:  # the namespace root: a real folder, so the others can nest in it
            target.mkdir(parents=True)
            for child in (ROOT / folder).iterdir():
                (target / child.name).symlink_to(child)
        else:
            target.symlink_to(ROOT / folder, target_is_directory=True)


def main() -> int:
    pyproject = ROOT / "pyproject.toml"
    package_dir = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"]
    lint = Path(sys.executable).with_name("lint-imports")
    with tempfile.TemporaryDirectory(prefix="ordrec-lint-") as tmp:
        lay_out(package_dir, Path(tmp))
        env = {**os.environ, "PYTHONPATH": tmp}
        return subprocess.run(
            [str(lint), "--config", str(pyproject), "--no-cache"], cwd=tmp, env=env
        ).returncode


if __name__ == "__main__":
    raise SystemExit(main())
