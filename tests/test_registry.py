"""The artifact registry: atomic publish, verification on load, retention, pinning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.names import is_version
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import run_cli


def make_artifact(seed: int = 0, n: int = 5) -> Artifact:
    rng = np.random.default_rng(seed)
    return Artifact(
        kind="dcr",
        arrays={
            "user_factors": rng.normal(size=(n, 3)).astype(np.float32),
            "counts": np.arange(n, dtype=np.int32),
        },
        ids={"users": IdMap([f"u{i}" for i in range(n)]), "items": IdMap(["a", "b"])},
        hyperparameters={"rank": 3, "lr": 0.05, "name": "x"},
        metrics={"ndcg@10": 0.71},
        attributes={"levels": [1, 2, 3]},
        data_fingerprint="abc",
    )


def test_round_trip_preserves_everything(tmp_path):
    registry = Registry(tmp_path)
    original = make_artifact()
    version = registry.publish("dcr", original)
    loaded = registry.load("dcr")
    assert loaded.version == version and is_version(version)
    for key, array in original.arrays.items():
        np.testing.assert_array_equal(loaded.arrays[key], array)
        assert loaded.arrays[key].dtype == array.dtype
    assert isinstance(loaded.arrays["user_factors"], np.memmap)  # mmap, read-only
    assert not loaded.arrays["user_factors"].flags.writeable
    assert loaded.ids["users"] == original.ids["users"]
    assert loaded.hyperparameters == {"rank": 3, "lr": 0.05, "name": "x"}
    assert isinstance(loaded.hyperparameters["rank"], int)
    assert loaded.metrics == {"ndcg@10": 0.71}
    assert loaded.attributes == {"levels": [1, 2, 3]}
    assert loaded.name == "dcr" and loaded.kind == "dcr"


def test_versions_increase_and_sort_as_text(tmp_path):
    registry = Registry(tmp_path)
    versions = [registry.publish("m", make_artifact(i)) for i in range(5)]
    assert versions == sorted(versions) == registry.versions("m")
    assert len(set(versions)) == 5
    assert registry.live_version("m") == (versions[-1], "newest")


def test_retention_keeps_newest_and_pinned(tmp_path):
    registry = Registry(tmp_path)
    versions = [registry.publish("m", make_artifact(i)) for i in range(5)]
    registry.pin("m", versions[0])
    removed = registry.prune("m", keep=2)
    assert removed == versions[1:3]
    assert registry.versions("m") == [versions[0], *versions[3:]]
    assert registry.live_version("m") == (versions[0], "pinned")
    registry.unpin("m")
    assert registry.live_version("m") == (versions[-1], "newest")
    registry.publish("m", make_artifact(9), keep=1)
    assert len(registry.versions("m")) == 1


def test_pin_unknown_version_is_refused(tmp_path):
    registry = Registry(tmp_path)
    registry.publish("m", make_artifact())
    with pytest.raises(ArtifactError, match="unknown version"):
        registry.pin("m", "20990101T000000.000000Z")


def _array_files(registry, name):
    folder = registry.root / name / registry.versions(name)[-1]
    return sorted((folder / "arrays").glob("*.npy")) + sorted((folder / "ids").glob("*.txt"))


@pytest.mark.parametrize("which", range(4))
def test_flipped_byte_in_any_file_is_refused(tmp_path, which):
    registry = Registry(tmp_path)
    registry.publish("m", make_artifact())
    path = _array_files(registry, "m")[which]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        registry.load("m")


def _rewrite_manifest(registry, name, change):
    folder = registry.root / name / registry.versions(name)[-1]
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_manifest_lying_about_shape_is_refused(tmp_path):
    registry = Registry(tmp_path)
    registry.publish("m", make_artifact())

    def lie(manifest):
        entry = next(a for a in manifest["arrays"] if a["path"].endswith("user_factors.npy"))
        entry["shape"] = [3, 5]

    _rewrite_manifest(registry, "m", lie)
    with pytest.raises(ArtifactError, match=r"shape \(5, 3\) but the manifest says \(3, 5\)"):
        registry.load("m")


def test_manifest_lying_about_dtype_is_refused(tmp_path):
    registry = Registry(tmp_path)
    registry.publish("m", make_artifact())
    _rewrite_manifest(registry, "m", lambda m: m["arrays"][0].update(dtype="<f8"))
    with pytest.raises(ArtifactError, match="dtype"):
        registry.load("m")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.update(surprise=1), "invalid manifest"),
        (lambda m: m.update(format=99), "format 99"),
        (lambda m: m.update(version="20000101T000000.000000Z"), "folder is"),
        (lambda m: m["arrays"][0].update(path="../../etc/passwd"), "escapes"),
    ],
)
def test_bad_manifests_are_refused(tmp_path, change, message):
    registry = Registry(tmp_path)
    registry.publish("m", make_artifact())
    _rewrite_manifest(registry, "m", change)
    with pytest.raises(ArtifactError, match=message):
        registry.load("m")


def test_missing_array_file_is_refused(tmp_path):
    registry = Registry(tmp_path)
    registry.publish("m", make_artifact())
    _array_files(registry, "m")[0].unlink()
    with pytest.raises(ArtifactError, match="missing"):
        registry.load("m")


def test_pickled_object_arrays_cannot_be_published_or_loaded(tmp_path):
    registry = Registry(tmp_path)
    bad = make_artifact()
    bad.arrays = {"objs": np.array([{"a": 1}], dtype=object)}
    with pytest.raises(ArtifactError, match="dtype object"):
        registry.publish("m", bad)
    assert registry.versions("m") == []


def test_object_array_smuggled_into_a_version_is_not_unpickled(tmp_path):
    registry = Registry(tmp_path)
    registry.publish("m", make_artifact())
    folder = registry.root / "m" / registry.versions("m")[-1]
    path = folder / "arrays" / "counts.npy"
    with open(path, "wb") as fh:  # an object-dtype .npy: header, then bytes np.load must never unpickle
        np.lib.format.write_array_header_1_0(fh, {"descr": "|O", "fortran_order": False, "shape": (1,)})
        fh.write(b"\x80\x04not-a-real-pickle.")

    def fix_checksum(manifest):
        import hashlib

        entry = next(a for a in manifest["arrays"] if a["path"].endswith("counts.npy"))
        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()

    _rewrite_manifest(registry, "m", fix_checksum)
    with pytest.raises(ArtifactError, match="not a plain numpy array"):
        registry.load("m")


def _paused_publisher(root) -> subprocess.Popen:
    """A real publisher that stops for 30 s once it has written its first array."""
    script = textwrap.dedent(f"""
        import numpy as np, sys
        import ordrec.service.storage.registry as a
        from ordrec.service.storage.artifact import Artifact
        from ordrec.service.storage.registry import Registry
        from ordrec.service.storage.idmap import IdMap
        original = a._write_array
        def slow_write(path, array):
            digest = original(path, array)
            print("wrote", path, flush=True)
            import time; time.sleep(30)
            return digest
        a._write_array = slow_write
        big = np.zeros((1000, 100), np.float32)
        Registry({str(root)!r}).publish("m", Artifact("dcr", {{"big": big}}, {{"users": IdMap(["x"])}}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert "wrote" in proc.stdout.readline()
    return proc


def _age(paths, seconds: float) -> None:
    old = time.time() - seconds
    for path in paths:
        os.utime(path, (old, old))


def test_writer_killed_mid_publish_leaves_no_visible_version(tmp_path):
    """SIGKILL a publisher while it writes a large array: readers see only complete versions."""
    registry = Registry(tmp_path)
    first = registry.publish("m", make_artifact())
    proc = _paused_publisher(tmp_path)
    try:
        assert registry.versions("m") == [first]  # the half-written version is invisible
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    assert registry.versions("m") == [first]
    assert registry.load("m").version == first
    leftovers = list((tmp_path / "m").glob(".tmp-*"))
    assert leftovers, "the killed writer's temporary folder should remain until pruned"
    _age(leftovers, 7200)
    registry.prune("m", keep=5)
    assert not list((tmp_path / "m").glob(".tmp-*"))


def test_gc_and_the_next_publish_remove_only_what_dead_publishers_left(tmp_path):
    registry = Registry(tmp_path)
    registry.publish("m", make_artifact())
    live = _paused_publisher(tmp_path)
    try:
        busy = list((tmp_path / "m").glob(".tmp-*"))
        _age(busy, 7200)  # old, but its publisher still holds the lock
        assert registry.gc() == []
        registry.publish("m", make_artifact())  # a concurrent publish leaves it alone too
        assert list((tmp_path / "m").glob(".tmp-*")) == busy
        live.send_signal(signal.SIGKILL)
        live.wait(10)
    finally:
        live.kill()
    trash = tmp_path / "m" / ".trash-20260101T000000.000000Z-x"  # a prune killed mid-delete
    trash.mkdir()
    _age([trash], 60)
    out = run_cli(["ordrec.trainer", "gc", "--registry", str(tmp_path)]).stdout
    assert sorted(out.split()) == sorted(["removed", "removed", str(busy[0]), str(trash)])
    assert not [p for p in (tmp_path / "m").iterdir() if p.name.startswith(".")]
    assert len(registry.versions("m")) == 2


def test_bad_model_names_are_refused(tmp_path):
    registry = Registry(tmp_path)
    for name in ("", "../x", "A", "a/b", "x" * 65):
        with pytest.raises(ValueError):
            registry.publish(name, make_artifact())


def test_ids_with_line_breaks_cannot_be_published(tmp_path):
    registry = Registry(tmp_path)
    bad = make_artifact()
    bad.ids = {"users": IdMap(["ok", "bad\nid"])}
    with pytest.raises(ArtifactError, match="line break"):
        registry.publish("m", bad)
