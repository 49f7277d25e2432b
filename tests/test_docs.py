"""The documentation a newcomer follows: the README's "Using it" block runs as
pasted, every ``ordrec-client`` command shown parses, no page hard-codes a path
of the developers' machines, the example job finds the shared data from any
working directory, and ``make demo`` keeps its map URLs live until Ctrl-C."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ordrec.client_cli import build_parser
from ordrec.trainer.job import load_job
from tests.conftest import DATA_ROOT, free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent


def _pages() -> list[Path]:
    # The changelog is history: it keeps the commands as they were run.
    docs = [p for p in (ROOT / "docs").glob("*.md") if p.name != "changelog.md"]
    return [README, *docs]


def _sh_block(text: str, heading: str) -> str:
    section = text.split(heading + "\n", 1)[1]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


# ------------------------------------------------------------------- paths
def test_no_page_hard_codes_a_path_of_the_developers_machines():
    machine = "/" + "work" + "/"  # spelled so that this file does not match itself
    files = _pages() + list((ROOT / "examples").glob("*.toml")) + list((ROOT / "benchmarks").glob("*.py"))
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in files
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if machine in line
    ]
    assert not offenders


def test_the_real_data_job_reads_the_shared_data_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths follow the job file, not the working directory
    job = load_job(ROOT / "examples" / "real-data.toml")
    shared = (ROOT.parent / "shared" / "data").resolve()
    paths = [source.path for source in job.data.values()] + [m.labels for m in job.models if m.labels]
    assert len(paths) == 3
    for path in paths:
        assert path.resolve().is_relative_to(shared), path
        if DATA_ROOT.resolve() == shared and shared.exists():
            assert path.exists(), path


def test_data_written_by_the_readme_is_gitignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("data/ratings.data", "registry/dcr/PINNED", ".demo/server.log"):
        result = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert result.returncode == 0, f"{path} is not ignored"


# ------------------------------------------------------------ what it says
def test_the_readme_states_no_test_count():
    assert not re.search(r"\babout \d+ tests\b|\(\d+ tests\b", README.read_text())


def test_maps_page_shows_the_report_labels_flag():
    text = (ROOT / "docs" / "maps.md").read_text()
    assert "no `--labels`" not in text
    shown = [line for line in text.splitlines() if "ordrec-train report" in line and "--labels" in line]
    assert shown
    from ordrec.trainer.cli import build_parser as train_parser

    argv = shlex.split(shown[0].split("ordrec-train", 1)[1])
    assert train_parser().parse_args(argv).labels


def _client_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in _pages():
        for line in path.read_text().splitlines():
            match = re.match(r"\s*(?:\.venv/bin/)?ordrec-client(\s.*)?$", line)
            if match:
                command = (match.group(1) or "").split(" #")[0]
                found.append((f"{path.name}: {line.strip()}", shlex.split(command)))
    return found


def test_every_client_command_in_the_docs_parses():
    commands = _client_commands()
    assert len(commands) >= 3
    parser = build_parser()
    for where, argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"does not parse: {where}")


# ----------------------------------------------------------- pages for users
CHANGELOG = ROOT / "docs" / "changelog.md"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SOURCES = ("service", "trainer", "tools", "ordrec", "benchmarks", "scripts", "examples", "deploy", "tests")


def _outside_code_blocks(text: str) -> str:
    return "".join(part for n, part in enumerate(re.split(r"^```.*$", text, flags=re.M)) if n % 2 == 0)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, -1, -2 on repeats."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.+)$", _outside_code_blocks(page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


def _broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(_outside_code_blocks(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in set(_anchors(linked))):
            broken.append(f"{page.relative_to(ROOT)}: {target}")
    return broken


def test_every_relative_link_and_anchor_in_the_pages_resolves():
    assert not [link for page in [*_pages(), CHANGELOG] for link in _broken_links(page)]


def test_the_pages_are_for_users_not_work_logs():
    assert len(README.read_text().splitlines()) <= 200
    assert len(CHANGELOG.read_text().splitlines()) <= 300
    for page in [*_pages(), CHANGELOG]:
        assert not re.search(r"\bsessions?\b", page.read_text(), re.I), page.name
        assert not re.search(r"\d\d:\d\d(-\d\d:\d\d)? UTC", page.read_text()), page.name


def test_docs_the_code_cites_are_in_the_repository():
    """A comment citing ``docs/page.md`` (and ``"Section"`` of it) points at a page that exists."""
    cited = re.compile(r"""(\.\./|/)?(?:shared/)?docs/([\w-]+\.md)`*(?:,? ["']([^"'\n]+)["'])?""")
    missing = []
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in {".py", ".toml", ".yaml", ".sh"} or path == Path(__file__):
                continue
            for outside, name, section in cited.findall(path.read_text()):
                page = ROOT / "docs" / name
                headings = " ".join(re.findall(r"^#+ (.+)$", page.read_text(), re.M)) if page.exists() else ""
                if outside or not page.exists() or (section and section.lower() not in headings.lower()):
                    missing.append(f"{path.relative_to(ROOT)}: {outside}docs/{name} {section}")
    assert not missing


# ------------------------------------------------------- the README, pasted
def test_the_readme_using_it_block_runs_as_pasted(tmp_path):
    text = README.read_text()
    block = _sh_block(text, "## Using it")
    assert ". .venv/bin/activate" in block and "ordrec-serve" in block and "&\n" in block
    assert "<" not in block  # no placeholder to fill in: it is pasted as it is
    # The Python client example that follows, run while the server is still up.
    example = text.split("## Using it\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "kill %1" in block and "from ordrec.client import Client" in example
    block = block.replace("kill %1", f"python - <<'EOF'\n{example}EOF\nkill %1", 1)
    port, metrics_port = free_port(), free_port()
    script = (
        block.replace(". .venv/bin/activate", f"export PATH={shlex.quote(str(BIN))}:$PATH")
        .replace("50051", str(port))
        .replace("9095", str(metrics_port))
    )
    # A failing step stops the script; the server is stopped whatever happens.
    script = (
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
        + script
        + "wait %1 && echo server-exited-0\n"
    )
    env = {**os.environ, "ORDREC_TARGET": f"127.0.0.1:{port}"}
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "published dcr@" in out and "user u001" in out and '"neighbors": [' in out
    assert re.search(r"^dcr\t\S+\tlive:newest\t.*epochs_run=", out, re.M)  # versions shows metrics
    assert "pinned dcr to" in out and out.rstrip().endswith("server-exited-0")
    assert re.search(r"^i\d+ \d", out, re.M)  # the Python example's "id score" lines


# ---------------------------------------------------------------- make demo
def test_demo_serves_only_on_a_terminal_unless_told():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import demo
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert demo.parse_args([]).serve is False  # pytest's stdin is not a terminal
    assert demo.parse_args(["--serve"]).serve is True
    assert demo.parse_args(["--no-serve"]).serve is False


@pytest.mark.slow
def test_demo_keeps_its_map_urls_live_until_ctrl_c():
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--serve"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 400
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Serving until Ctrl-C") or time.monotonic() > deadline:
                break
        assert lines and lines[-1].startswith("Serving until Ctrl-C"), "".join(lines[-40:])
        url = next(line.strip() for line in lines if line.strip().endswith("/maps/coe"))
        time.sleep(1.0)  # well after the queries: the server must still be up
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.status == 200 and b"<html" in reply.read(2000).lower()
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C on a terminal sends to the whole group
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, rest
        assert "server exited with code 0" in rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_readme_quotes_the_lastfm_means_of_dcr_md():
    page = (ROOT / "docs" / "dcr.md").read_text().split("**Last.fm, five seeds")[1]
    tables = [t.split("\n\n")[0] for t in page.split("| method |")[1:3]]
    order = ["popularity", "EASE", "implicit ALS (tuned)", None, "DCR", "Pairwise DCR", "COE"]
    for split, table in zip(("random", "time"), tables):
        means = {
            c[0]: c[1:3]
            for c in ([x.strip() for x in r.strip("|").split("|")] for r in table.splitlines()[2:])
        }
        row = re.search(rf"^\| Last\.fm, {split} split \|(.+)\|$", README.read_text(), re.M)
        assert row, split
        quoted = [c.strip() for c in row.group(1).split("|")]
        assert quoted == ["" if m is None else " / ".join(means[m]) for m in order], split
