"""The FORGOTTEN list under concurrent erasures: no writer's entry is lost, on a local
registry (a lock beside the file) and on S3 (writes conditional on the ETag, retried),
against a real moto S3 server with writers in threads and in processes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from ordrec.service.live.erasure import erase_user
from ordrec.service.live.forgotten import ForgottenFiles, read_forgotten, user_digest
from ordrec.service.storage.objectstore import S3Registry
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import run_cli

WRITERS, EACH = 8, 5


def add_all(open_registry, writer: int) -> None:
    files = ForgottenFiles(open_registry())
    for n in range(EACH):
        files.add({user_digest(f"user-{writer}-{n}")})


def every_digest() -> set[str]:
    return {user_digest(f"user-{w}-{n}") for w in range(WRITERS) for n in range(EACH)}


def test_concurrent_writers_lose_nothing_on_a_local_registry(tmp_path):
    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(lambda w: add_all(lambda: Registry(tmp_path), w), range(WRITERS)))
    assert read_forgotten(Registry(tmp_path)) == every_digest()


def test_concurrent_writers_lose_nothing_on_s3(s3_url, tmp_path):
    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(lambda w: add_all(lambda: S3Registry(s3_url, cache_dir=tmp_path), w), range(WRITERS)))
    assert read_forgotten(S3Registry(s3_url, cache_dir=tmp_path)) == every_digest()


def test_a_change_is_retried_on_the_list_another_writer_left(s3_url, tmp_path):
    """The first conditional write loses to a writer that slips in between; the retry sees it."""
    registry = S3Registry(s3_url, cache_dir=tmp_path)
    other = ForgottenFiles(S3Registry(s3_url, cache_dir=tmp_path))
    calls = []

    def change(data: bytes | None) -> bytes:
        if not calls:
            other.add({user_digest("slipped-in")})
        calls.append(data)
        return (data or b"") + (user_digest("mine") + "\n").encode()

    registry.update_root_file("FORGOTTEN", change)
    assert len(calls) == 2 and read_forgotten(registry) == {user_digest("slipped-in"), user_digest("mine")}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "s3"])
def test_concurrent_forget_processes_each_keep_their_user(where, request, tmp_path):
    location = request.getfixturevalue("s3_url") if where == "s3" else str(tmp_path / "registry")
    users = [f"process-user-{n}" for n in range(4)]

    def forget(user: str):
        return run_cli(
            ["ordrec.trainer", "registry", "forget", "--registry", location, "--user", user], check=False
        )

    with ThreadPoolExecutor(len(users)) as pool:
        results = list(pool.map(forget, users))
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    registry = S3Registry(location, cache_dir=tmp_path) if where == "s3" else Registry(location)
    assert read_forgotten(registry) == {user_digest(u) for u in users}


def test_erase_user_reports_a_repeat(tmp_path):
    registry = Registry(tmp_path)
    assert not erase_user("twice", registry).already_forgotten
    assert erase_user("twice", registry).already_forgotten
