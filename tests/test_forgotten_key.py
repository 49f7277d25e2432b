"""The FORGOTTEN list's keyed hash: entries are HMAC-SHA256 under the deployment's key, so
enumerating ids against the list finds nobody without the key; the trainer (another
process) matches what the server side wrote; a list written under another key stops
training; bare sha256 entries of older lists keep matching until rekeyed."""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest

from ordrec.service.live.erasure import erase_user
from ordrec.service.live.forgotten import (
    KEY_ENV,
    ForgottenFiles,
    is_listed,
    read_forgotten,
    rekey,
    user_digest,
)
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import run_cli
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.forgetting import drop_forgotten

KEY = "a-deployment-key-of-32-characters-or-more"
OTHER_KEY = "another-deployment-key-32-characters-long"


def ratings_of(users: list[str]) -> Ratings:
    """One rating per user, of one item."""
    rows = np.arange(len(users), dtype=np.int32)
    return Ratings(IdMap(users), IdMap(["i0"]), rows, np.zeros_like(rows), np.ones(len(users), np.float32))


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.delenv("ORDREC_FORGOTTEN_KEY_FILE", raising=False)
    monkeypatch.setenv(KEY_ENV, KEY)


def listed_file(registry: Registry) -> set[str]:
    return set((registry.root / "FORGOTTEN").read_text().split())


def test_enumerating_numeric_ids_against_the_list_finds_nobody_without_the_key(keyed, tmp_path):
    registry = Registry(tmp_path)
    erase_user("4711", registry, settle=0)
    entries = listed_file(registry)
    guesses = {hashlib.sha256(str(n).encode()).hexdigest() for n in range(10_000)}
    assert len(entries) == 1 and not entries & guesses and not any(g in e for e in entries for g in guesses)
    (entry,) = entries
    mac = hmac.new(KEY.encode(), b"4711", hashlib.sha256).hexdigest()
    assert entry.startswith("hmac-sha256:") and entry.endswith(":" + mac)


def test_the_trainer_process_matches_the_list_and_refuses_another_key(keyed, tmp_path, monkeypatch):
    """``ordrec-train registry forget`` in its own process, with the key from the environment;
    training here drops the user, and under another key refuses the list."""
    registry = Registry(tmp_path / "registry")
    run_cli(["ordrec.trainer", "registry", "forget", "--registry", str(registry.root), "--user", "u2"])
    data = ratings_of(["u1", "u2", "u3"])
    out, dropped = drop_forgotten(data, read_forgotten(registry))
    assert dropped.users == 1 and list(out.users.ids) == ["u1", "u3"]
    monkeypatch.setenv(KEY_ENV, OTHER_KEY)
    with pytest.raises(ValueError, match="another key"):
        read_forgotten(registry)


def test_bare_sha256_entries_keep_matching_until_rekeyed(keyed, tmp_path):
    registry = Registry(tmp_path)
    bare = {hashlib.sha256(u.encode()).hexdigest() for u in ("old-1", "old-2")}
    (tmp_path / "FORGOTTEN").write_text("".join(f"{d}\n" for d in sorted(bare)))
    listed = read_forgotten(registry)
    assert is_listed("old-1", listed) and is_listed("old-2", listed) and not is_listed("new", listed)
    assert rekey(None, ForgottenFiles(registry), ["old-1", "someone-else"]) == (1, 1)
    listed = read_forgotten(registry)
    assert listed == {user_digest("old-1"), hashlib.sha256(b"old-2").hexdigest()}
    assert is_listed("old-1", listed) and is_listed("old-2", listed)
    assert list(drop_forgotten(ratings_of(["old-1", "old-2", "kept"]), listed)[0].users.ids) == ["kept"]


def test_rekey_forgotten_on_the_command_line(keyed, tmp_path):
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "FORGOTTEN").write_text(hashlib.sha256(b"old-1").hexdigest() + "\n")
    users = tmp_path / "users.txt"
    users.write_text("old-1\nnever-forgotten\n")
    out = run_cli(
        ["ordrec.trainer", "registry", "rekey-forgotten", "--registry", str(registry), "--users", str(users)]
    )
    assert "keyed 1 bare sha256 entry; 0 left" in out.stdout
    assert listed_file(Registry(registry)) == {user_digest("old-1")}
