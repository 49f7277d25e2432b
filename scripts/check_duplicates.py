"""Fail when a block of code stands in two of ordrec's modules (`make lint`).

Each module (service/, trainer/, tools/, ordrec/; not the generated ordrec/v1) is read
as its code lines, tokens only (layout and comments folded away), leaving out what
repeats by nature: imports, docstrings, a function's signature (an override repeats its
base's) and lines of punctuation or keywords alone. Two modules sharing ``MIN_LINES``
such lines in a row are reported as ``a.py:10-24 ~ b.py:40-54``; one piece of code
should serve both. ``ALLOWED`` names the pairs still waiting for that.
"""

from __future__ import annotations

import argparse
import ast
import io
import keyword
import sys
import tokenize
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("service", "trainer", "tools", "ordrec")
GENERATED = ("ordrec/v1",)
MIN_LINES = 6
# Pairs of modules that may share a block for now, each with the reason; an entry that
# no longer matches anything fails the check too, so the list only shrinks.
ALLOWED: dict[tuple[str, str], str] = {
    ("trainer/data/_lines.py", "trainer/data/readers.py"): "issue 34, branch reader: one reader",
}
SKIPPED_TOKENS = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}
Line = tuple[int, str]  # a kept code line: its number and its tokens joined by single spaces


@dataclass(frozen=True)
class Shared:
    """A block two modules share: the line ranges in each."""

    first: str
    first_lines: tuple[int, int]
    second: str
    second_lines: tuple[int, int]

    def __str__(self) -> str:
        (a, b), (c, d) = self.first_lines, self.second_lines
        return f"{self.first}:{a}-{b} ~ {self.second}:{c}-{d}"


def modules(root: Path) -> list[Path]:
    """The Python modules the check reads, in a stable order."""
    found = [path for folder in FOLDERS for path in sorted((root / folder).rglob("*.py"))]
    return [p for p in found if not any(p.relative_to(root).as_posix().startswith(g) for g in GENERATED)]


def passed_over(tree: ast.Module) -> set[int]:
    """Line numbers of imports, docstrings and function signatures: code that repeats by nature."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines.update(range(node.lineno, node.body[0].lineno))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = _docstring(node)
            if docstring is not None:
                lines.update(range(docstring.lineno, (docstring.end_lineno or docstring.lineno) + 1))
    return lines


def _docstring(node: ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Expr | None:
    first = node.body[0] if node.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first
    return None


def _trivial(tokens: list[str]) -> bool:
    """Punctuation and keywords alone (``)``, ``else:``, ``return``) say nothing of their own."""
    return all(not (t[0].isalnum() or t[0] in "_\"'") or keyword.iskeyword(t) for t in tokens)


def code_lines(source: str) -> list[Line]:
    """The lines of ``source`` that count, each as its tokens joined by single spaces."""
    skip = passed_over(ast.parse(source))
    by_line: dict[int, list[str]] = defaultdict(list)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in SKIPPED_TOKENS:
            by_line[token.start[0]].append(token.string)
    return [
        (number, " ".join(tokens))
        for number, tokens in sorted(by_line.items())
        if number not in skip and not _trivial(tokens)
    ]


def _windows(lines: list[Line]) -> Iterator[tuple[int, tuple[str, ...]]]:
    for start in range(len(lines) - MIN_LINES + 1):
        yield start, tuple(text for _, text in lines[start : start + MIN_LINES])


def shared_blocks(files: dict[str, list[Line]]) -> list[Shared]:
    """Every maximal run of ``MIN_LINES`` or more lines that two different modules share."""
    seen: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for name, lines in files.items():
        for start, window in _windows(lines):
            seen[window].append((name, start))
    starts: dict[tuple[str, str], set[tuple[int, int]]] = defaultdict(set)
    for places in seen.values():
        for i, (a, at) in enumerate(places):
            for b, bt in places[i + 1 :]:
                if a != b:
                    starts[(a, b)].add((at, bt))
    return [block for pair, found in sorted(starts.items()) for block in _runs(pair, found, files)]


def _runs(
    pair: tuple[str, str], starts: set[tuple[int, int]], files: dict[str, list[Line]]
) -> Iterable[Shared]:
    """Join windows that continue each other (both sides one line on) into one block."""
    a, b = pair
    for i, j in sorted(starts):
        if (i - 1, j - 1) in starts:
            continue  # inside a block begun earlier
        length = 1
        while (i + length, j + length) in starts:
            length += 1
        last = length + MIN_LINES - 2
        yield Shared(
            a,
            (files[a][i][0], files[a][i + last][0]),
            b,
            (files[b][j][0], files[b][j + last][0]),
        )


def check(root: Path) -> tuple[list[Shared], list[str]]:
    """The shared blocks not allowed, and the allow-list entries nothing matches any more."""
    files = {p.relative_to(root).as_posix(): code_lines(p.read_text(encoding="utf-8")) for p in modules(root)}
    blocks = shared_blocks(files)
    allowed = {frozenset(pair) for pair in ALLOWED}
    used = {frozenset((s.first, s.second)) for s in blocks} & allowed
    stale = [f"{a} ~ {b}" for a, b in ALLOWED if frozenset((a, b)) not in used]
    return [s for s in blocks if frozenset((s.first, s.second)) not in allowed], stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    blocks, stale = check(args.root)
    for block in blocks:
        print(f"repeated block: {block}")
    for entry in stale:
        print(f"ALLOWED in scripts/check_duplicates.py names {entry}, which share no block now: remove it")
    if blocks:
        print(
            f"{len(blocks)} block(s) of {MIN_LINES}+ code lines stand in two modules: let one piece of code serve both"
        )
    return 1 if blocks or stale else 0


if __name__ == "__main__":
    sys.exit(main())
