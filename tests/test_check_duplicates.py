"""scripts/check_duplicates.py (`make lint` runs it over the repository): a block of code
standing in two modules fails, what repeats by nature does not."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dup():
    spec = importlib.util.spec_from_file_location(
        "check_duplicates", ROOT / "scripts" / "check_duplicates.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_duplicates"] = module
    spec.loader.exec_module(module)
    return module


BLOCK = """
    total = sum(values)
    count = len(values)
    mean = total / count
    spread = max(values) - min(values)
    ratio = spread / mean
    result = round(ratio, places)
"""


def module_with(body: str, header: str = "") -> str:
    return (
        textwrap.dedent(header)
        + "\n\ndef scale(values, places):\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
    )


def tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_a_block_in_two_modules_is_reported_with_both_line_ranges(dup, tmp_path, monkeypatch):
    monkeypatch.setattr(dup, "ALLOWED", {})
    first = module_with(BLOCK, '"""One."""\nimport math\n')
    second = module_with("x = 1\n" + textwrap.dedent(BLOCK) + "return result\n", "import os\n\n\nY = 2\n")
    root = tree(tmp_path, {"service/a.py": first, "trainer/sub/b.py": second})
    blocks, stale = dup.check(root)
    assert [str(b) for b in blocks] == ["service/a.py:7-12 ~ trainer/sub/b.py:10-15"]
    assert stale == []
    assert dup.main(["--root", str(root)]) == 1


def test_layout_and_comments_do_not_hide_a_copy(dup, tmp_path, monkeypatch):
    monkeypatch.setattr(dup, "ALLOWED", {})
    reformatted = BLOCK.replace("total / count", "total/count  # the mean").replace(" = len(", "=len(")
    root = tree(tmp_path, {"tools/a.py": module_with(BLOCK), "ordrec/b.py": module_with(reformatted)})
    assert len(dup.check(root)[0]) == 1


@pytest.mark.parametrize(
    "second",
    [
        BLOCK.replace("ratio, places", "ratio, 2"),  # five lines alike, not six
        BLOCK.replace("spread = max(values) - min(values)", "spread = 0"),
    ],
)
def test_fewer_than_six_shared_lines_pass(dup, tmp_path, monkeypatch, second):
    monkeypatch.setattr(dup, "ALLOWED", {})
    root = tree(tmp_path, {"service/a.py": module_with(BLOCK), "service/b.py": module_with(second)})
    assert dup.check(root) == ([], [])


def test_what_repeats_by_nature_passes(dup, tmp_path, monkeypatch):
    """Imports, docstrings, an override's signature and lines of punctuation alone."""
    monkeypatch.setattr(dup, "ALLOWED", {})
    shared = '''
        """A docstring that both modules
        happen to share, word for word,
        over several lines
        of text.
        """
        from collections import OrderedDict
        from itertools import chain
        import json, math, os, sys


        class Index:
            def recommend(
                self,
                user_row: int,
                n: int,
                *,
                exclude: list | None = None,
                candidates: list | None = None,
            ) -> list:
                return [
                    (
                        {
                            1,
                        }
                    )
                ]
        '''
    text = textwrap.dedent(shared)
    root = tree(tmp_path, {"service/a.py": text, "trainer/b.py": text.replace("1,", "2,")})
    assert dup.check(root) == ([], [])


def test_repeats_inside_one_module_and_generated_code_are_not_this_checks(dup, tmp_path, monkeypatch):
    monkeypatch.setattr(dup, "ALLOWED", {})
    twice = module_with(BLOCK) + module_with(BLOCK).replace("def scale", "def again")
    root = tree(tmp_path, {"service/a.py": twice, "ordrec/v1/x_pb2.py": module_with(BLOCK)})
    assert dup.check(root) == ([], [])


def test_an_allowed_pair_passes_and_a_stale_entry_fails(dup, tmp_path, monkeypatch):
    root = tree(tmp_path, {"service/a.py": module_with(BLOCK), "service/b.py": module_with(BLOCK)})
    monkeypatch.setattr(dup, "ALLOWED", {("service/b.py", "service/a.py"): "waiting for a shared helper"})
    assert dup.check(root) == ([], [])
    monkeypatch.setattr(dup, "ALLOWED", {("service/a.py", "service/c.py"): "gone"})
    blocks, stale = dup.check(root)
    assert len(blocks) == 1 and stale == ["service/a.py ~ service/c.py"]
